"""PSStrategy gives a single device's numbers, including where TF's own
strategies do not: uneven global batches, multi-step evaluation, and the
Keras features that synchronise inside `cond`."""

import keras
import numpy as np
import pytest

import keras_psdist as kpd

RNG = np.random.RandomState(0)
X = RNG.rand(66, 8).astype("float32")
Y = (X.sum(1) > 4).astype("int32")


def _build(optimizer, batch_norm=False):
    layers = [keras.Input((8,)), keras.layers.Dense(16, activation="tanh")]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization())
    layers.append(keras.layers.Dense(2))
    model = keras.Sequential(layers)
    model.compile(
        optimizer(),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def _pair(cpu_devices, optimizer, batch_norm=False):
    """A single-device model and a 4-replica PSStrategy one, same weights."""
    keras.utils.set_random_seed(1)
    reference = _build(optimizer, batch_norm)
    strategy = kpd.PSStrategy(devices=cpu_devices[:4])
    with strategy.scope():
        model = _build(optimizer, batch_norm)
    model.set_weights(reference.get_weights())
    return reference, model


def _assert_same_weights(a, b, rtol=1e-5, atol=2e-6):
    for wa, wb in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_allclose(wa, wb, rtol=rtol, atol=atol)


@pytest.mark.parametrize("batch_size", [64, 30, 32])
def test_any_global_batch_gives_single_device_weights(cpu_devices, batch_size):
    # 66 examples: batch 64 leaves a last batch of 2 (two replicas get no
    # data); 30 does not split evenly over 4 replicas at all.
    reference, model = _pair(cpu_devices, lambda: keras.optimizers.SGD(0.5))
    for m in (reference, model):
        m.fit(X, Y, batch_size=batch_size, epochs=2, shuffle=False, verbose=0)
    assert not np.allclose(reference.get_weights()[0], model.get_weights()[0] * 0)
    _assert_same_weights(reference, model)


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda: keras.optimizers.SGD(0.5, gradient_accumulation_steps=2),
        lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.01)),
        lambda: keras.optimizers.Adam(0.01, use_ema=True, ema_overwrite_frequency=3),
    ],
    ids=["gradient_accumulation", "loss_scale", "ema_overwrite"],
)
def test_features_that_sync_inside_cond_match_single_device(cpu_devices, optimizer):
    reference, model = _pair(cpu_devices, optimizer)
    initial = [w.copy() for w in model.get_weights()]
    for m in (reference, model):
        m.fit(X[:64], Y[:64], batch_size=16, epochs=2, shuffle=False, verbose=0)
    assert (
        max(
            np.abs(a - b).max()
            for a, b in zip(initial, model.get_weights(), strict=True)
        )
        > 1e-3
    )
    assert int(model.optimizer.iterations.numpy()) == int(
        reference.optimizer.iterations.numpy()
    )
    _assert_same_weights(reference, model)


@pytest.mark.parametrize("batch_size", [16, 30, 64])
def test_evaluate_metrics_over_several_steps_are_exact(cpu_devices, batch_size):
    reference, model = _pair(cpu_devices, lambda: keras.optimizers.SGD())
    np.testing.assert_allclose(
        model.evaluate(X, Y, batch_size=batch_size, verbose=0),
        reference.evaluate(X, Y, batch_size=batch_size, verbose=0),
        rtol=1e-5,
    )


def test_batch_norm_survives_replicas_without_data(cpu_devices):
    # The last batch has 2 examples for 4 replicas: two replicas compute
    # BatchNormalization statistics (and gamma's gradient) over nothing.
    _, model = _pair(cpu_devices, lambda: keras.optimizers.SGD(0.1), batch_norm=True)
    model.fit(X, Y, batch_size=64, epochs=2, shuffle=False, verbose=0)
    for weight in model.weights:
        assert np.isfinite(weight.numpy()).all(), weight.path
    assert np.isfinite(model.evaluate(X, Y, verbose=0)).all()
