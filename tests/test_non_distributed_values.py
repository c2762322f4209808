"""Values that are not per-replica, against MirroredStrategy and one device.

A tensor made outside `strategy.run` and used in every replica is one value,
not one per replica: TensorFlow's `batch_reduce` takes it as a single value
(its sum and mean are itself) and `reduce_to` follows
`reduce_non_distributed_value` (its mean is itself; its sum across several
replicas is refused). Each operation below runs under MirroredStrategy and
under each of our strategies on two replicas, and ours must give Mirrored's
result. Where Mirrored raises, the test states what ours gives and why.

The second half is Keras's own optimizer-under-strategy tests
(`keras/src/backend/tensorflow/optimizer_distribute_test.py`: one step, weight
decay, the golden Nesterov trajectory, EMA, gradient accumulation), with
Keras's expected numbers, run against each of our strategies, eagerly and in
a `tf.function`.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_psdist as kpd
from tests.shared_mirrored import mirrored_strategy

SUM, MEAN = tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN
G = [1.0, 2.0, 3.0]
KINDS = ("ps", "ps_all_reduce", "ps_partitioned", "ps_median")


def make_strategy(kind: str, cpu_devices: list[str]) -> tf.distribute.Strategy:
    devices = cpu_devices[:2]
    if kind == "mirrored":
        return mirrored_strategy(tuple(devices))
    if kind == "ps_all_reduce":
        return kpd.PSStrategy(devices=devices, dense="all_reduce")
    if kind == "ps_partitioned":
        return kpd.PSStrategy(
            devices=devices,
            parameter_devices=cpu_devices[2:4],
            partitioner=kpd.partitioners.Fixed(2),
        )
    if kind == "ps_median":
        return kpd.PSStrategy(devices=devices, aggregator="median")
    return kpd.PSStrategy(devices=devices)


def _variable(strategy, aggregation=tf.VariableAggregation.NONE):
    with strategy.scope():
        return tf.Variable([0.0, 0.0, 0.0], aggregation=aggregation)


def _local(strategy, value):
    return [np.asarray(v).tolist() for v in strategy.experimental_local_results(value)]


def _replica_all_reduce(op, made_inside):
    def run(strategy):
        captured = tf.constant(G)

        def replica_fn():
            value = tf.constant(G) if made_inside else captured
            return tf.distribute.get_replica_context().all_reduce(op, value)

        return _local(strategy, strategy.run(replica_fn))

    return run


def _update_in_cross_replica(strategy):
    v = _variable(strategy)
    strategy.extended.update(
        v, lambda var, t: var.assign_add(t), args=(tf.constant(G),)
    )
    return np.asarray(v.read_value()).tolist()


def _assign_add_in_replicas(aggregation):
    def run(strategy):
        v = _variable(strategy, aggregation)
        g = tf.constant(G)
        strategy.run(lambda: v.assign_add(g))
        return np.asarray(v.read_value()).tolist()

    return run


def _reduce_returned(op):
    def run(strategy):
        g = tf.constant(G)
        return np.asarray(
            strategy.reduce(op, strategy.run(lambda: g), axis=None)
        ).tolist()

    return run


def _assign_mean_of_replica_ids(strategy):
    v = _variable(strategy, tf.VariableAggregation.MEAN)

    def replica_fn():
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        return v.assign(tf.cast(replica, tf.float32) * tf.ones(3))

    strategy.run(replica_fn)
    return np.asarray(v.read_value()).tolist()


# name -> operation(strategy) -> a comparable result.
AS_MIRRORED = {
    "reduce_to_mean": lambda s: _local(
        s, s.extended.reduce_to(MEAN, tf.constant(G), _variable(s))
    ),
    "all_reduce_sum_of_a_captured_tensor": _replica_all_reduce(SUM, False),
    "all_reduce_mean_of_a_captured_tensor": _replica_all_reduce(MEAN, False),
    "all_reduce_sum_of_tensors_made_in_each_replica": _replica_all_reduce(SUM, True),
    "update_in_cross_replica_context": _update_in_cross_replica,
    "reduce_mean_of_a_returned_captured_tensor": _reduce_returned(MEAN),
    "assign_add_to_a_mean_variable": _assign_add_in_replicas(
        tf.VariableAggregation.MEAN
    ),
    "assign_to_a_mean_variable": _assign_mean_of_replica_ids,
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("operation", sorted(AS_MIRRORED))
def test_as_mirrored_strategy(operation, kind, cpu_devices):
    expected = AS_MIRRORED[operation](make_strategy("mirrored", cpu_devices))
    actual = AS_MIRRORED[operation](make_strategy(kind, cpu_devices))
    np.testing.assert_allclose(actual, expected)


@pytest.mark.parametrize("kind", KINDS)
def test_a_sum_of_one_value_across_replicas_is_refused_as_by_mirrored(
    kind, cpu_devices
):
    """`reduce_to(SUM)` of a value that is not per-replica: TensorFlow's
    `reduce_non_distributed_value` cannot tell how many replicas hold it."""
    for k in ("mirrored", kind):
        strategy = make_strategy(k, cpu_devices)
        with pytest.raises(ValueError, match="cannot be reduced"):
            strategy.extended.reduce_to(SUM, tf.constant(G), _variable(strategy))


@pytest.mark.parametrize("op", [SUM, MEAN])
@pytest.mark.parametrize("kind", KINDS)
def test_batch_reduce_to_takes_a_non_distributed_value_as_one(op, kind, cpu_devices):
    """TensorFlow's `batch_reduce` makes a plain tensor a one-component
    value, so its sum and mean are itself. (MirroredStrategy's own
    `batch_reduce_to` of it to a variable fails with an IndexError in TF
    2.21; its all-reduce of a captured tensor, the same rule, is in
    `test_as_mirrored_strategy`.)"""
    strategy = make_strategy(kind, cpu_devices)
    (result,) = strategy.extended.batch_reduce_to(
        op, [(tf.constant(G), _variable(strategy))]
    )
    assert _local(strategy, result)[0] == G


@pytest.mark.parametrize("kind", KINDS)
def test_where_mirrored_refuses_every_replica_counts(kind, cpu_devices):
    """MirroredStrategy raises for these; ours sums what every replica
    returned or wrote, as for values made in each replica: `strategy.run`
    returning a captured tensor gives it once per replica, and a SUM
    variable that every replica adds `g` to grows by n * g."""
    strategy = make_strategy(kind, cpu_devices)
    assert _reduce_returned(SUM)(strategy) == [2 * g for g in G]
    if kind == "ps_all_reduce":
        # A replicated variable is TensorFlow's MirroredVariable: as there.
        with pytest.raises(ValueError, match="cannot be reduced"):
            _assign_add_in_replicas(tf.VariableAggregation.SUM)(strategy)
    else:
        assert _assign_add_in_replicas(tf.VariableAggregation.SUM)(strategy) == [
            2 * g for g in G
        ]


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "function"])
@pytest.mark.parametrize("kind", ["one_device", *KINDS])
def test_apply_gradients_of_a_captured_gradient_steps_once(kind, traced, cpu_devices):
    """`strategy.run(lambda: opt.apply_gradients([(g, v)]))` with `g` made
    outside `run`: one step by `g`, as one device and MirroredStrategy take
    it (was `2 g` with two replicas)."""
    strategy = (
        tf.distribute.get_strategy()
        if kind == "one_device"
        else make_strategy(kind, cpu_devices)
    )
    with strategy.scope():
        v = keras.Variable(np.ones(3, np.float32))
        optimizer = keras.optimizers.SGD(1.0)
    g = tf.constant(G)

    def step():
        return strategy.run(lambda: optimizer.apply_gradients([(g, v)]))

    (tf.function(step) if traced else step)()
    np.testing.assert_allclose(np.asarray(v), [0.0, -1.0, -2.0])
    assert int(optimizer.iterations.numpy()) == 1


# ----------------------------------------- Keras's optimizer_distribute_test


def _run(strategy, fn, traced):
    if traced:
        return tf.function(lambda: strategy.run(fn))()
    return strategy.run(fn)


@pytest.fixture(params=[False, True], ids=["eager", "function"])
def traced(request):
    return request.param


@pytest.mark.parametrize("kind", KINDS)
def test_keras_single_step(kind, traced, cpu_devices):
    """Each replica makes its own gradient: the update is their sum."""
    strategy = make_strategy(kind, cpu_devices)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(learning_rate=0.5, momentum=0.06)
        variable = tf.Variable([1.0, 2.0, 3.0, 4.0])

    def update():
        grads = tf.constant([1.0, 6.0, 7.0, 2.0])
        optimizer.apply_gradients(zip([grads], [variable], strict=True))

    _run(strategy, update, traced)
    np.testing.assert_allclose(
        np.asarray(variable), [0.0, -4.0, -4.0, 2.0], rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("kind", KINDS)
def test_keras_weight_decay(kind, traced, cpu_devices):
    strategy = make_strategy(kind, cpu_devices)
    with strategy.scope():
        grads = tf.zeros(())
        var1 = keras.Variable(2.0)
        var2 = keras.Variable(3.0, name="exclude")
        var3 = keras.Variable(4.0)
        optimizer_1 = keras.optimizers.SGD(learning_rate=1.0, weight_decay=0.004)
        _run(
            strategy,
            lambda: optimizer_1.apply_gradients(zip([grads], [var1], strict=True)),
            traced,
        )
        optimizer_2 = keras.optimizers.SGD(learning_rate=1.0, weight_decay=0.004)
        optimizer_2.exclude_from_weight_decay(var_names=["exclude"])
        _run(
            strategy,
            lambda: optimizer_2.apply_gradients(
                zip([grads, grads], [var1, var2], strict=True)
            ),
            traced,
        )
        optimizer_3 = keras.optimizers.SGD(learning_rate=1.0, weight_decay=0.004)
        optimizer_3.exclude_from_weight_decay(var_list=[var3])
        _run(
            strategy,
            lambda: optimizer_3.apply_gradients(
                zip([grads, grads], [var1, var3], strict=True)
            ),
            traced,
        )
    np.testing.assert_allclose(float(np.asarray(var1)), 1.9760959, rtol=1e-6)
    np.testing.assert_allclose(float(np.asarray(var2)), 3.0)
    np.testing.assert_allclose(float(np.asarray(var3)), 4.0)


@pytest.mark.parametrize("kind", KINDS)
def test_keras_correctness_with_golden(kind, traced, cpu_devices):
    """Gradients made in each replica: the golden trajectory of SGD with
    Nesterov momentum (Keras's numbers, for two replicas)."""
    strategy = make_strategy(kind, cpu_devices)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(nesterov=True)
        x = keras.Variable(np.ones([10]))

    def update_grads():
        grads = keras.ops.convert_to_tensor(np.arange(0.1, 1.1, 0.1))
        optimizer.apply_gradients(zip([grads], [x], strict=True))

    def update_first_grads():
        first_grads = keras.ops.convert_to_tensor(np.full((10,), 0.01))
        optimizer.apply_gradients(zip([first_grads], [x], strict=True))

    golden = np.array(
        [
            [0.9980 - 0.0020 * i for i in range(10)],
            [0.9978 - 0.0020 * i for i in range(10)],
            [0.9976 - 0.0020 * i for i in range(10)],
            [0.9974 - 0.0020 * i for i in range(10)],
            [0.9972 - 0.0020 * i for i in range(10)],
        ]
    )
    _run(strategy, update_grads, traced)
    for row in golden:
        np.testing.assert_allclose(np.asarray(x), row, rtol=5e-4, atol=5e-4)
        _run(strategy, update_first_grads, traced)


@pytest.mark.parametrize("kind", KINDS)
def test_keras_ema(kind, traced, cpu_devices):
    """A gradient made outside `run` (Keras's test): each step by it once."""
    strategy = make_strategy(kind, cpu_devices)
    with strategy.scope():
        v = keras.Variable([[3.0, 4.0], [5.0, 6.0]])
        grads = keras.ops.convert_to_tensor([[1.0, 1.0], [1.0, 1.0]])
        optimizer = keras.optimizers.SGD(
            learning_rate=1.0,
            use_ema=True,
            ema_momentum=0.9,
            ema_overwrite_frequency=3,
        )
        expected = [
            ([[2.0, 3.0], [4.0, 5.0]], [[2.0, 3.0], [4.0, 5.0]]),
            ([[1.0, 2.0], [3.0, 4.0]], [[1.9, 2.9], [3.9, 4.9]]),
            # Overwritten with the moving average.
            ([[1.71, 2.71], [3.71, 4.71]], [[1.71, 2.71], [3.71, 4.71]]),
        ]
        for weights, average in expected:
            _run(strategy, lambda: optimizer.apply_gradients([(grads, v)]), traced)
            np.testing.assert_allclose(np.asarray(v), weights, rtol=1e-5)
            np.testing.assert_allclose(
                np.asarray(optimizer._model_variables_moving_average[0]),
                average,
                rtol=1e-5,
            )


@pytest.mark.parametrize("kind", KINDS)
def test_keras_gradient_accumulation(kind, traced, cpu_devices):
    strategy = make_strategy(kind, cpu_devices)
    with strategy.scope():
        v = keras.Variable([[1.0, 2.0], [3.0, 4.0]])
        grads = keras.ops.convert_to_tensor([[1.0, 1.0], [2.0, 2.0]])
        optimizer = keras.optimizers.SGD(
            learning_rate=1.0, gradient_accumulation_steps=3
        )
        expected = [
            ([[1.0, 2.0], [3.0, 4.0]], [[1.0, 1.0], [2.0, 2.0]], 1, 0),
            ([[1.0, 2.0], [3.0, 4.0]], [[2.0, 2.0], [4.0, 4.0]], 2, 0),
            ([[-1.0, 0.0], [-1.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]], 3, 1),
        ]
        for weights, accumulated, steps, iterations in expected:
            _run(strategy, lambda: optimizer.apply_gradients([(grads, v)]), traced)
            np.testing.assert_allclose(np.asarray(v), weights)
            np.testing.assert_allclose(
                np.asarray(optimizer._accumulated_gradients[0]), accumulated
            )
            assert int(np.asarray(optimizer._iterations)) == steps
            assert int(np.asarray(optimizer.iterations)) == iterations


def test_one_replicas_gradient_takes_the_gradient_path(cpu_devices):
    """With one replica TensorFlow hands its value unwrapped, not as a
    per-replica value: it is still that replica's gradient, compressed with
    error feedback (top-k at 50 % keeps half of it in the residual), not a
    value outside the replicas."""
    strategy = kpd.PSStrategy(devices=cpu_devices[:1], compression="top_k(ratio=0.5)")
    with strategy.scope():
        v = keras.Variable(np.zeros(4, np.float32))
        optimizer = keras.optimizers.SGD(1.0)

    @tf.function
    def step():
        def replica_fn():
            g = tf.constant([4.0, -3.0, 2.0, 1.0])
            optimizer.apply_gradients([(g, v)])

        strategy.run(replica_fn)

    step()
    np.testing.assert_allclose(np.asarray(v), [-4.0, 3.0, 0.0, 0.0])
    (residual,) = strategy.extended.training_state.variables
    np.testing.assert_allclose(residual.numpy(), [0.0, 0.0, 2.0, 1.0])
