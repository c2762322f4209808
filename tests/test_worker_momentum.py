"""Worker momentum: each replica's momentum, aggregated by the rule, and kept
across restarts with the rule's state (`strategy.extended.training_state`)."""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_psdist as kpd
from keras_psdist import aggregators, attacks, dense_choice, gradients
from keras_psdist.aggregators.momentum import WorkerMomentum
from tests import reference

MEAN = tf.distribute.ReduceOp.MEAN


def numpy_worker_momentum(steps, beta, rule, shares=None):
    """The spec: m_r <- beta m_r + (1 - beta) g_r (unchanged without data), then
    `rule` over the momenta. `steps[t][v]` is `(n, *shape)`; returns each step's
    aggregate (a list over variables)."""
    momenta = [np.zeros_like(v, dtype=np.float64) for v in steps[0]]
    out = []
    for t, values in enumerate(steps):
        for v, x in enumerate(values):
            new = beta * momenta[v] + (1 - beta) * np.asarray(x, np.float64)
            if shares is not None:
                keep = np.asarray(shares[t]) == 0
                new[keep] = momenta[v][keep]
            momenta[v] = new
        out.append(rule([m.copy() for m in momenta]))
    return out


@pytest.mark.parametrize(
    "rule_id", ["mean", "median", "trimmed_mean", "centered_clipping"]
)
def test_matches_numpy_reference_over_steps(rule_id):
    rng = np.random.default_rng(0)
    n, f, beta = 7, 1, 0.8
    steps = [[rng.normal(size=(n, 3, 2)), rng.normal(size=(n, 5))] for _ in range(4)]
    bound = aggregators.get(rule_id).bind(n, 0 if rule_id == "mean" else f)
    rule = WorkerMomentum(bound, beta)
    state = rule.initial_state(
        [tf.TensorSpec(x.shape[1:], tf.float32) for x in steps[0]]
    )
    got = []
    for values in steps:
        columns = [[tf.constant(x[r], tf.float32) for r in range(n)] for x in values]
        result = rule.step(MEAN, columns, state=state)
        state = result.state
        got.append([v.numpy() for v in result.values])
    if rule_id == "centered_clipping":
        # Centered clipping is itself stateful: run the reference's steps in turn.
        center = None

        def numpy_rule(momenta):
            nonlocal center
            values = reference.centered_clipping(
                momenta, f=f, **_cc_config(bound), center=center
            )
            center = values
            return values
    else:
        numpy_rule = reference.reference_for(bound)
    want = numpy_worker_momentum(steps, beta, numpy_rule)
    for g, w in zip(got, want, strict=True):
        for gv, wv in zip(g, w, strict=True):
            np.testing.assert_allclose(gv, wv, rtol=1e-5, atol=1e-5)


def _cc_config(rule):
    _, config = reference.spec_config(rule)
    config.pop("center", None)
    config.pop("f", None)
    return config


def test_replicas_without_data_keep_their_momentum():
    n, beta = 4, 0.5
    steps = [[np.arange(n * 2, dtype=float).reshape(n, 2)], [np.ones((n, 2)) * 10.0]]
    shares = [np.full(n, 1 / n), np.array([0.5, 0.5, 0.0, 0.0])]
    rule = WorkerMomentum(aggregators.Mean().bind(n), beta)
    state = rule.initial_state([tf.TensorSpec([2])])
    momenta = []
    for values, share in zip(steps, shares, strict=True):
        column = [tf.constant(values[0][r], tf.float32) for r in range(n)]
        if share[-1] == 0:
            column[-1] = tf.constant([np.nan, np.nan], tf.float32)  # no data: NaN
        result = rule.step(
            MEAN,
            [column],
            shares=[tf.constant(s, tf.float32) for s in share],
            state=state,
        )
        state = result.state
        momenta.append(np.stack([m.numpy() for m in state.momenta[0]]))
    want = numpy_worker_momentum(steps, beta, lambda m: m, shares=shares)
    np.testing.assert_allclose(momenta[-1], want[-1][0], rtol=1e-6)
    assert np.all(np.isfinite(momenta[-1]))


@pytest.mark.parametrize("rule_id", ["mean", "centered_clipping"])
def test_momenta_updated_in_place_match_the_stepwise_rule(rule_id):
    """`step_on_variables` (what the strategy runs: buffers in variables,
    written in place by XLA kernels, the large variable in one of its own
    and the small ones together) gives `step`'s values and momenta, a
    replica without data included."""
    rng = np.random.default_rng(2)
    n, beta = 5, 0.7
    rule = WorkerMomentum(
        aggregators.get(rule_id).bind(n, 1 if rule_id != "mean" else 0), beta
    )
    specs = [tf.TensorSpec([3, 2]), tf.TensorSpec([130, 130]), tf.TensorSpec([4])]
    state = rule.initial_state(specs)
    buffers = [[tf.Variable(m) for m in column] for column in state.momenta]
    inner = tf.nest.map_structure(tf.Variable, state.inner)

    @tf.function
    def in_place(columns, shares):
        result = rule.step_on_variables(
            MEAN,
            columns,
            shares=shares,
            momenta=buffers,
            inner_state=tf.nest.map_structure(lambda v: v.read_value(), inner),
        )
        for var, value in zip(
            tf.nest.flatten(inner), tf.nest.flatten(result.state), strict=True
        ):
            var.assign(value)
        return result.values

    for step in range(3):
        columns = [
            [tf.constant(rng.normal(size=spec.shape), tf.float32) for _ in range(n)]
            for spec in specs
        ]
        share = np.full(n, 1 / n, np.float32)
        if step == 1:
            share[-1] = 0.0  # no data: its gradient is NaN, its momentum stays
            for column in columns:
                column[-1] = column[-1] * np.nan
        shares = [tf.constant(x) for x in share]
        want = rule.step(MEAN, columns, shares=shares, state=state)
        state = want.state
        got = in_place(columns, shares)
        for g, w in zip(got, want.values, strict=True):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-6, atol=1e-6)
        for column_vars, column_want in zip(buffers, state.momenta, strict=True):
            for var, m in zip(column_vars, column_want, strict=True):
                np.testing.assert_allclose(var.numpy(), m.numpy(), rtol=1e-6)
                assert np.all(np.isfinite(var.numpy()))


def test_momenta_of_unknown_shape_are_updated_in_one_pass():
    """Gradients whose shape is known only at run time (no XLA kernel, no
    grouping by size) update their buffers in place all the same."""
    n = 3
    rule = WorkerMomentum(aggregators.get("mean").bind(n, 0), 0.5)
    state = rule.initial_state([tf.TensorSpec([4])])
    buffers = [[tf.Variable(m) for m in column] for column in state.momenta]

    @tf.function(input_signature=[tf.TensorSpec([None])] * n)
    def in_place(*grads):
        return rule.step_on_variables(
            MEAN, [list(grads)], shares=None, momenta=buffers, inner_state=state.inner
        ).values

    [out] = in_place(*[tf.fill([4], float(r)) for r in range(n)])
    # Momenta 0.5 * g_r (from zero): their mean is 0.5 * 1.
    np.testing.assert_allclose(out.numpy(), [0.5] * 4)
    np.testing.assert_allclose(buffers[0][2].numpy(), [1.0] * 4)


def test_mean_with_worker_momentum_is_heavy_ball_sgd(cpu_devices):
    """With `mean`, worker momentum beta and SGD(lr / (1 - beta)) take exactly
    the steps of SGD(lr, momentum=beta) on one device (the docstring's claim)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(96, 5)).astype(np.float32)
    y = (x @ rng.normal(size=(5, 1))).astype(np.float32)
    beta, rate = 0.9, 0.01

    def train(strategy, optimizer):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(1)])
            model.compile(optimizer(), "mse")
        model.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0)
        return model.get_weights()

    ours = train(
        kpd.PSStrategy(devices=cpu_devices[:4], worker_momentum=beta),
        lambda: keras.optimizers.SGD(rate / (1 - beta)),
    )
    one_device = train(
        tf.distribute.get_strategy(), lambda: keras.optimizers.SGD(rate, momentum=beta)
    )
    for a, b in zip(ours, one_device, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _momentum_devices(cpu_devices):
    """Where a 4-replica strategy keeps its buffers: momenta, then the centre."""
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:4],
        parameter_devices=cpu_devices[4:5],
        aggregator="centered_clipping",
        worker_momentum=0.9,
    )
    with strategy.scope():
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)])
        model.compile(keras.optimizers.SGD(0.1), "mse")
    x = np.ones((32, 5), np.float32)
    model.fit(x, np.zeros((32, 3), np.float32), batch_size=16, verbose=0)

    state = strategy.extended.training_state.reduction.kept
    for v in state[:8]:
        assert np.any(v.numpy() != 0)
    canonical = [tf.DeviceSpec.from_string(d) for d in strategy.extended.worker_devices]
    reduction = tf.DeviceSpec.from_string(strategy.extended.parameter_devices[0])
    placed = [tf.DeviceSpec.from_string(v.device).device_index for v in state]
    # Two variables (kernel, bias) x 4 replicas of buffers, then the centre.
    return placed[:8], placed[8:], canonical, reduction


def test_each_replica_keeps_its_momentum_on_its_own_device(cpu_devices, monkeypatch):
    """Replicas that do not share memory with the reduction device (GPUs,
    other tasks) keep their buffers on their own device and update them
    there in parallel; the rest of the rule's state is on the reduction
    device. Logical CPUs stand in for them here."""
    monkeypatch.setattr(dense_choice, "share_memory", lambda devices: False)
    momenta, centre, canonical, reduction = _momentum_devices(cpu_devices)
    assert momenta == [d.device_index for _ in range(2) for d in canonical]
    assert centre and all(d == reduction.device_index for d in centre)


def test_logical_cpus_keep_every_momentum_on_the_reduction_device(cpu_devices):
    """CPUs of one process share memory and cores: every replica's buffers
    are updated together, where the rule runs."""
    momenta, centre, _, reduction = _momentum_devices(cpu_devices)
    assert set(momenta) == set(centre) == {reduction.device_index}


@pytest.mark.parametrize("bad", [1.0, -0.1, 1.5, float("nan"), "0.9", True])
def test_bad_worker_momentum_is_refused(bad, cpu_devices):
    with pytest.raises(ValueError, match=r"worker_momentum.*\[0, 1\).*Received"):
        kpd.PSStrategy(devices=cpu_devices[:2], worker_momentum=bad)


@pytest.mark.parametrize(
    ("worker_momentum", "optimizer", "expected"),
    [
        (0.9, lambda: keras.optimizers.SGD(0.05, momentum=0.9), "momentum=0.9"),
        (0.9, lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True), "SGD"),
        (0.9, lambda: keras.optimizers.Adam(), "beta_1=0.9"),
        (0.9, lambda: keras.optimizers.SGD(0.5), None),
        (0.9, lambda: keras.optimizers.Adam(beta_1=0.0), None),
        (0.0, lambda: keras.optimizers.SGD(0.05, momentum=0.9), None),
    ],
    ids=["sgd-momentum", "nesterov", "adam", "sgd", "adam-beta1-0", "off"],
)
def test_a_momentum_optimizer_on_top_of_worker_momentum_warns(
    cpu_devices, caplog, worker_momentum, optimizer, expected
):
    """The two momenta compound (the docs advise one); a user who kept the
    optimizer's hears so at compile, with the learning rate to use."""
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:2],
        aggregator="median",
        worker_momentum=worker_momentum,
    )
    with strategy.scope(), caplog.at_level(logging.WARNING):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile(optimizer=optimizer(), loss="mse")
    if expected is None:
        assert "momenta compound" not in caplog.text
    else:
        assert "momenta compound" in caplog.text
        assert expected in caplog.text and "Keep one" in caplog.text


def test_repr_and_attack_replaces_momenta(cpu_devices):
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:4],
        aggregator="median",
        num_byzantine=1,
        attack=attacks.SignFlip(replicas=[3]),
        worker_momentum=0.9,
    )
    assert "worker_momentum=0.9" in repr(strategy)
    # The attack sits behind the momentum: it replaces what replica 3 sends.
    stages = strategy.extended._reduction.path.stages
    assert [type(stage) for stage in stages] == [
        gradients.Momentum,
        gradients.Attacked,
        gradients.Rule,
    ]


def _train_cc(cpu_devices, data, epochs, callbacks=()):
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:4],
        aggregator="centered_clipping",
        num_byzantine=1,
        worker_momentum=0.9,
    )
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        model.compile(
            keras.optimizers.SGD(0.1),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    model.fit(
        *data,
        batch_size=64,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=list(callbacks),
    )
    return strategy, model


class _Interrupted(Exception):
    pass


class _InterruptAt(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise _Interrupted


def _state(strategy):
    return [v.numpy() for v in strategy.extended.training_state.variables]


def test_backup_and_restore_resumes_the_rule_state(cpu_devices, digits, tmp_path):
    """Interrupted after epoch 1 and resumed, centered clipping's centre and
    the replicas' momenta continue: the result equals an uninterrupted run."""
    data = (digits[0][:512], digits[1][:512])
    straight, straight_model = _train_cc(cpu_devices, data, epochs=3)
    assert _state(straight) and all(np.any(s != 0) for s in _state(straight))

    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    with pytest.raises(_Interrupted):
        _train_cc(cpu_devices, data, epochs=3, callbacks=[backup, _InterruptAt(2)])
    assert (tmp_path / "backup" / "keras_psdist_training_state").is_dir()
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    resumed, resumed_model = _train_cc(cpu_devices, data, epochs=3, callbacks=[backup])

    for a, b in zip(_state(resumed), _state(straight), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(
        resumed_model.get_weights(), straight_model.get_weights(), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_checkpoint_restores_state_before_it_exists(cpu_devices, digits, tmp_path):
    """`tf.train.Checkpoint(aggregation=extended.training_state)` in a custom
    loop: read before the first step, the state is restored when it is made."""
    data = (digits[0][:256], digits[1][:256])
    trained, model = _train_cc(cpu_devices, data, epochs=1)
    path = tf.train.Checkpoint(aggregation=trained.extended.training_state).write(
        str(tmp_path / "ckpt")
    )
    fresh = kpd.PSStrategy(
        devices=cpu_devices[:4],
        aggregator="centered_clipping",
        num_byzantine=1,
        worker_momentum=0.9,
    )
    assert not fresh.extended.training_state.variables  # made at the first step
    tf.train.Checkpoint(aggregation=fresh.extended.training_state).read(path)
    # Trace one step's reduction without changing the state: build the state
    # variables the way the strategy does, then compare.
    reduction = fresh.extended._reduction
    columns = [[tf.zeros(v.shape, v.dtype)] * 4 for v in model.trainable_variables]
    reduction._state_variables(columns)
    for a, b in zip(_state(fresh), _state(trained), strict=True):
        np.testing.assert_array_equal(a, b)
