"""Robust rules and attacks inside `PSStrategy`: f, attacks, state, report."""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_psdist as kpd
from keras_psdist import aggregators, attacks


def build_classifier(seed: int = 0, inputs: int = 64, classes: int = 10) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((inputs,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(classes),
        ]
    )


def compile_sgd(model: keras.Model, rate: float = 0.1) -> None:
    model.compile(
        optimizer=keras.optimizers.SGD(rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )


def train(strategy, data, epochs=1, batch_size=64, callbacks=()):
    x, y = data
    with strategy.scope():
        model = build_classifier(inputs=x.shape[1])
        compile_sgd(model)
    history = model.fit(
        x,
        y,
        batch_size=batch_size,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=list(callbacks),
    )
    return model, history


@pytest.fixture(scope="module")
def small_digits(digits):
    x, y, _, _ = digits
    return x[:512], y[:512]


# ---------------------------------------------------------- num_byzantine


def test_num_byzantine_comes_from_the_rule_when_unset(cpu_devices):
    strategy = kpd.PSStrategy(
        devices=cpu_devices, aggregator=aggregators.TrimmedMean(num_byzantine=2)
    )
    assert strategy.num_byzantine == 2
    assert strategy.extended.aggregator.f == 2
    assert kpd.PSStrategy(devices=cpu_devices, aggregator="median").num_byzantine == 0


def test_strategy_f_reaches_a_string_rule(cpu_devices):
    strategy = kpd.PSStrategy(
        devices=cpu_devices, aggregator="trimmed_mean", num_byzantine=3
    )
    assert strategy.extended.aggregator.f == 3
    assert "num_byzantine=3" in repr(strategy)


def test_rule_and_strategy_f_must_agree(cpu_devices):
    with pytest.raises(ValueError, match=r"built for num_byzantine=2.*num_byzantine=1"):
        kpd.PSStrategy(
            devices=cpu_devices,
            aggregator=aggregators.TrimmedMean(num_byzantine=2),
            num_byzantine=1,
        )


def test_rule_condition_is_checked_when_the_strategy_is_built(cpu_devices):
    with pytest.raises(
        ValueError,
        match=r"Median needs more than 2 \* num_byzantine = 4 replicas.*"
        r"Received: 4 replicas, num_byzantine=2",
    ):
        kpd.PSStrategy(devices=cpu_devices[:4], aggregator="median", num_byzantine=2)


# ----------------------------------------------------------------- attacks


def test_attack_on_a_missing_replica_is_refused(cpu_devices):
    with pytest.raises(ValueError, match=r"replicas=.*9"):
        kpd.PSStrategy(
            devices=cpu_devices[:4],
            aggregator="median",
            num_byzantine=1,
            attack=attacks.SignFlip(replicas=[9]),
        )


def test_attack_beyond_num_byzantine_warns(cpu_devices, caplog):
    with caplog.at_level(logging.WARNING):
        kpd.PSStrategy(
            devices=cpu_devices[:4],
            aggregator="median",
            num_byzantine=1,
            attack=attacks.SignFlip(replicas=[2, 3]),
        )
    assert "controls 2 replicas [2, 3] but num_byzantine=1" in caplog.text


@pytest.mark.parametrize(
    "aggregator",
    [
        "trimmed_mean",
        "multi_krum",
        kpd.aggregators.ARC("geometric_median"),
        kpd.aggregators.NearestNeighborMixing("median"),
        kpd.aggregators.Bucketing("trimmed_mean", bucket_size=1),
    ],
    ids=["trimmed_mean", "multi_krum", "arc", "nnm", "bucketing"],
)
def test_a_rule_that_needs_num_byzantine_warns_without_it(
    cpu_devices, caplog, aggregator
):
    """Copied without `num_byzantine`, these rules are the mean (or ARC clips
    nothing): a run that looks defended and is not."""
    with caplog.at_level(logging.WARNING):
        strategy = kpd.PSStrategy(devices=cpu_devices[:4], aggregator=aggregator)
    assert strategy.num_byzantine == 0
    assert "runs with num_byzantine=0" in caplog.text
    assert "Pass num_byzantine=f" in caplog.text
    # What f = 0 makes of this rule, in words (bucketing: of its inner rule).
    rule = strategy.extended.aggregator
    assert rule.without_num_byzantine
    assert f"so {rule.name} {rule.without_num_byzantine}." in caplog.text


@pytest.mark.parametrize(
    ("aggregator", "num_byzantine"),
    [
        ("trimmed_mean", 1),
        (kpd.aggregators.ARC("geometric_median"), 1),
        ("median", None),  # the median is a median with f = 0 too
        ("geometric_median", None),
        ("mean", None),
        (kpd.aggregators.Bucketing("median", bucket_size=1), None),
        (kpd.aggregators.MultiKrum(m=3), None),  # selects 3 of 4 with f = 0
    ],
    ids=[
        "trimmed_mean-f1",
        "arc-f1",
        "median",
        "geometric_median",
        "mean",
        "bucketing",
        "multi_krum-m3",
    ],
)
def test_no_warning_when_the_rule_defends_as_configured(
    cpu_devices, caplog, aggregator, num_byzantine
):
    with caplog.at_level(logging.WARNING):
        kpd.PSStrategy(
            devices=cpu_devices[:4], aggregator=aggregator, num_byzantine=num_byzantine
        )
    assert "runs with num_byzantine=0" not in caplog.text


def test_attack_accepts_a_config_dict(cpu_devices):
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:4],
        aggregator="median",
        num_byzantine=1,
        attack={"class_name": "sign_flip", "config": {"replicas": [3]}},
    )
    assert isinstance(strategy.extended.attack, attacks.SignFlip)


def test_nan_from_f_replicas_never_reaches_the_weights(cpu_devices, small_digits):
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:4],
        aggregator="median",
        num_byzantine=1,
        attack=attacks.NonFinite(replicas=[3]),
    )
    model, history = train(strategy, small_digits, epochs=2)
    assert all(np.isfinite(w).all() for w in model.get_weights())
    assert history.history["loss"][-1] < history.history["loss"][0]
    report = strategy.extended.report()["extreme_fraction"]
    # The NaN replica is above every honest value at every coordinate.
    assert report[3] == 1.0 and report[:3].max() < 1.0


def test_mean_lets_nan_through(cpu_devices, small_digits):
    # The counterpart of the test above: the attack does bite.
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:4], attack=attacks.NonFinite(replicas=[3])
    )
    model, _ = train(strategy, small_digits)
    assert not all(np.isfinite(w).all() for w in model.get_weights())


class _Batches(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


def test_under_mean_terminate_on_nan_stops_at_the_first_nan_loss(
    cpu_devices, small_digits
):
    # What docs/reliability.md promises: `mean` applies a non-finite gradient,
    # the next batch's loss is NaN, and keras.callbacks.TerminateOnNaN stops
    # `fit` right there, as on one device.
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:4], attack=attacks.NonFinite(replicas=[3])
    )
    batches = _Batches()
    _, history = train(
        strategy,
        small_digits,
        epochs=3,
        callbacks=[batches, keras.callbacks.TerminateOnNaN()],
    )
    # The first batch's loss is computed before its (poisoned) update.
    assert np.isfinite(batches.losses[0])
    assert len(batches.losses) == 2 and np.isnan(batches.losses[1]), batches.losses
    assert len(history.epoch) == 1  # stopped in the first of 3 epochs


def test_label_flip_corrupts_training_batches_of_its_replicas(
    cpu_devices, small_digits
):
    # 2 replicas, global batch 8: replica 1 gets rows 4..7 of each batch.
    x, y = small_digits[0][:8], small_digits[1][:8]
    attacked = kpd.PSStrategy(
        devices=cpu_devices[:2], attack=attacks.LabelFlip(replicas=[1], num_classes=10)
    )
    model, _ = train(attacked, (x, y), batch_size=8)
    flipped = y.copy()
    flipped[4:] = 9 - flipped[4:]
    expected, _ = train(
        kpd.PSStrategy(devices=cpu_devices[:2]), (x, flipped), batch_size=8
    )
    for got, want in zip(model.get_weights(), expected.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # Evaluation sees the true labels.
    clean = keras.models.clone_model(model)
    clean.set_weights(model.get_weights())
    compile_sgd(clean)
    np.testing.assert_allclose(
        model.evaluate(x, y, batch_size=8, verbose=0),
        clean.evaluate(x, y, batch_size=8, verbose=0),
        rtol=1e-5,
    )


# ----------------------------------------------------------- state, report


class CountingMean(aggregators.Aggregator):
    """A stateful test rule: the mean, plus a step counter in its state."""

    name = "counting_mean_for_test"
    report_names = ("steps",)

    def initial_state(self, specs):
        return tf.zeros([], tf.int64)

    def apply(self, per_replica, state=()):
        values = [tf.add_n(vs) / len(vs) for vs in per_replica]
        steps = state + 1
        n = len(per_replica[0])
        return aggregators.Aggregation(
            values, {"steps": tf.fill([n], tf.cast(steps, tf.float32))}, steps
        )


def test_rule_state_persists_between_steps_and_report_is_readable(
    cpu_devices, small_digits
):
    strategy = kpd.PSStrategy(devices=cpu_devices[:4], aggregator=CountingMean())
    report = kpd.callbacks.AggregationReport()
    _, history = train(
        strategy, small_digits, epochs=2, batch_size=128, callbacks=[report]
    )
    # 512 rows / 128 = 4 steps per epoch, 2 epochs.
    assert strategy.extended.report()["steps"].tolist() == [8.0] * 4
    np.testing.assert_allclose(report.history["steps"][0], [2.5] * 4)  # mean of 1..4
    assert history.history["steps/replica_3"] == [2.5, 6.5]


def test_report_goes_to_tensorboard(cpu_devices, small_digits, tmp_path):
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:4], aggregator="median", num_byzantine=1
    )
    report = kpd.callbacks.AggregationReport(log_dir=str(tmp_path))
    train(strategy, small_digits, batch_size=128, callbacks=[report])
    assert list(tmp_path.glob("events.out.tfevents.*"))


def test_report_callback_needs_a_ps_strategy(small_digits):
    model = build_classifier()
    compile_sgd(model)
    with pytest.raises(
        ValueError, match="PSStrategy scope.*_DefaultDistributionStrategy"
    ):
        model.fit(
            *small_digits,
            epochs=1,
            verbose=0,
            callbacks=[kpd.callbacks.AggregationReport()],
        )


def test_bad_update_freq():
    with pytest.raises(ValueError, match="update_freq=0"):
        kpd.callbacks.AggregationReport(update_freq=0)


# ------------------------------------------------------------------ sparse


def test_robust_rule_trains_an_embedding_without_densifying(cpu_devices):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 50, size=(256, 4)).astype("int32")
    labels = (tokens[:, 0] % 2).astype("int32")
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:4], aggregator="median", num_byzantine=1
    )
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((4,), dtype="int32"),
                keras.layers.Embedding(10_000, 8),
                keras.layers.Flatten(),
                keras.layers.Dense(2),
            ]
        )
        compile_sgd(model)
    table_before = model.layers[0].embeddings.numpy().copy()
    model.fit(tokens, labels, batch_size=64, epochs=2, verbose=0)
    table = model.layers[0].embeddings.numpy()
    assert np.isfinite(table).all()
    # Only rows some replica looked up can move.
    assert not np.allclose(table[:50], table_before[:50])
    np.testing.assert_array_equal(table[50:], table_before[50:])


@pytest.mark.parametrize("wrap", ["gradient_accumulation", "loss_scale"])
def test_robust_rule_under_keras_control_flow(cpu_devices, small_digits, wrap):
    # Both put the all-reduce inside a `cond` in replica context, where the
    # strategy's staged path (not merge_call) runs the rule.
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:4],
        aggregator="trimmed_mean",
        num_byzantine=1,
        attack=attacks.NonFinite(replicas=[3]),
    )
    with strategy.scope():
        model = build_classifier()
        if wrap == "gradient_accumulation":
            optimizer = keras.optimizers.SGD(0.1, gradient_accumulation_steps=2)
        else:
            optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    history = model.fit(*small_digits, batch_size=64, epochs=2, verbose=0)
    assert all(np.isfinite(w).all() for w in model.get_weights())
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert strategy.extended.report()["extreme_fraction"][3] == 1.0
