"""The sync service's one-kernel SGD update (`keras_psdist.sync.plain_sgd`):
bit for bit Keras's own `SGD.apply` where it is taken, and not taken where it
would differ."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_psdist.sync import plain_sgd

SHAPES = [(7, 5), (5,), (5, 3)]


def _variables(seed, constraint=None):
    rng = np.random.default_rng(seed)
    variables = [keras.Variable(rng.normal(size=s).astype("float32")) for s in SHAPES]
    for variable in variables:
        variable.constraint = constraint  # as `Layer.add_weight` sets it
    return variables


def _grads(seed):
    rng = np.random.default_rng(seed + 100)
    return [tf.constant(rng.normal(size=s).astype("float32")) for s in SHAPES]


@pytest.mark.parametrize(
    "learning_rate",
    [0.1, 1e-3, keras.optimizers.schedules.ExponentialDecay(0.5, 1, 0.7)],
    ids=["0.1", "1e-3", "schedule"],
)
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_the_fused_update_is_keras_sgd_bit_for_bit(learning_rate, traced):
    keras_vars, fused_vars = _variables(0), _variables(0)
    keras_sgd = keras.optimizers.SGD(learning_rate)
    fused_sgd = keras.optimizers.SGD(learning_rate)
    keras_sgd.build(keras_vars)
    fused_sgd.build(fused_vars)

    def keras_step(grads):
        keras_sgd.apply(grads, keras_vars)

    def fused_step(grads):
        assert plain_sgd.apply(fused_sgd, grads, fused_vars)

    if traced:
        keras_step, fused_step = tf.function(keras_step), tf.function(fused_step)
    for step in range(4):  # a schedule's rate changes each step
        grads = _grads(step)
        keras_step(grads)
        fused_step(grads)
    for a, b, initial in zip(keras_vars, fused_vars, _variables(0), strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
        assert not np.array_equal(a.numpy(), initial.numpy())  # it trained
    assert int(fused_sgd.iterations.numpy()) == int(keras_sgd.iterations.numpy()) == 4


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda: keras.optimizers.SGD(0.1, momentum=0.9),
        lambda: keras.optimizers.SGD(0.1, nesterov=True, momentum=0.5),
        lambda: keras.optimizers.SGD(0.1, weight_decay=1e-4),
        lambda: keras.optimizers.SGD(0.1, clipnorm=1.0),
        lambda: keras.optimizers.SGD(0.1, clipvalue=1.0),
        lambda: keras.optimizers.SGD(0.1, global_clipnorm=1.0),
        lambda: keras.optimizers.SGD(0.1, use_ema=True),
        lambda: keras.optimizers.SGD(0.1, gradient_accumulation_steps=2),
        lambda: keras.optimizers.SGD(0.1, loss_scale_factor=2.0),
        lambda: keras.optimizers.Adam(0.1),
        lambda: type("MySGD", (keras.optimizers.SGD,), {})(0.1),
    ],
    ids=[
        "momentum",
        "nesterov",
        "weight_decay",
        "clipnorm",
        "clipvalue",
        "global_clipnorm",
        "ema",
        "accumulation",
        "loss_scale",
        "adam",
        "subclass",
    ],
)
def test_any_other_optimizer_is_left_to_keras(optimizer):
    variables = _variables(1)
    optimizer = optimizer()
    optimizer.build(variables)
    before = [v.numpy() for v in variables]
    assert not plain_sgd.apply(optimizer, _grads(1), variables)
    for v, b in zip(variables, before, strict=True):
        np.testing.assert_array_equal(v.numpy(), b)  # nothing written
    assert int(optimizer.iterations.numpy()) == 0


def test_a_sparse_or_missing_gradient_or_a_constraint_is_left_to_keras():
    variables = _variables(2)
    sgd = keras.optimizers.SGD(0.1)
    sgd.build(variables)
    grads = _grads(2)
    sparse = tf.IndexedSlices(grads[0][:2], tf.constant([0, 3]), tf.constant([7, 5]))
    assert not plain_sgd.apply(sgd, [sparse, *grads[1:]], variables)
    assert not plain_sgd.apply(sgd, [None, *grads[1:]], variables)
    constrained = _variables(2, constraint=keras.constraints.NonNeg())
    assert not plain_sgd.apply(sgd, grads, constrained)
    assert plain_sgd.apply(sgd, grads, variables)
