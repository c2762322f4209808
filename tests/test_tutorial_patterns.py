"""The patterns of TensorFlow's and Keras's distribute tutorials
(`tests/cluster_jobs/tutorial_patterns.py`) on one host.

Each runs on `PSStrategy`, its partitioned variant (every variable split in
two row shards over two parameter devices) and `PSStrategy(dense="all_reduce")`,
each with 2 logical CPU replicas; `MirroredStrategy` (marked slow) shows the
pattern is TensorFlow's own behaviour. The same patterns run on an in-graph
cluster in `tests/test_cluster_training.py`.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tensorflow as tf
import tutorial_patterns  # tests/cluster_jobs, see conftest.py

import keras_psdist as kpd
from tests.shared_mirrored import mirrored_strategy

NUM_REPLICAS = 2


def make_strategy_factory(kind: str, cpu_devices: list[str]):
    devices = cpu_devices[:NUM_REPLICAS]
    if kind == "ps":
        return lambda: kpd.PSStrategy(devices=devices)
    if kind == "ps_partitioned":
        return lambda: kpd.PSStrategy(
            devices=devices,
            parameter_devices=cpu_devices[NUM_REPLICAS : NUM_REPLICAS + 2],
            partitioner=kpd.partitioners.Fixed(2),
        )
    if kind == "ps_all_reduce":
        return lambda: kpd.PSStrategy(devices=devices, dense="all_reduce")
    return lambda: mirrored_strategy(tuple(devices))


@pytest.mark.parametrize("pattern", sorted(tutorial_patterns.PATTERNS))
@pytest.mark.parametrize(
    "kind",
    [
        "ps",
        "ps_partitioned",
        "ps_all_reduce",
        pytest.param("mirrored", marks=pytest.mark.slow),
    ],
)
def test_tutorial_pattern(pattern, kind, cpu_devices):
    run = functools.partial(
        tutorial_patterns.PATTERNS[pattern], make_strategy_factory(kind, cpu_devices)
    )
    if kind == "mirrored" and pattern in tutorial_patterns.MIRRORED_FAILS:
        # Beyond TensorFlow's own strategy: it fails these (the reason is in
        # MIRRORED_FAILS); ours runs them as one device.
        with pytest.raises(Exception):  # noqa: B017  (TF's errors vary)
            run()
        return
    run()


@pytest.mark.parametrize(
    "dataset_fn, message",
    [
        (lambda context: [1, 2], r"must return a `tf.data.Dataset`.*Received: list"),
        (
            lambda context: tf.data.Dataset.range(4),
            r"one replica's batch.*get_per_replica_batch_size",
        ),
    ],
)
def test_datasets_from_function_bad_dataset_fn(cpu_devices, dataset_fn, message):
    strategy = kpd.PSStrategy(devices=cpu_devices[:NUM_REPLICAS])
    with pytest.raises((TypeError, ValueError), match=message):
        strategy.distribute_datasets_from_function(dataset_fn)


def test_a_variable_made_in_a_traced_step_from_a_constant_is_lifted(cpu_devices):
    """`tf.Variable(tf.ones(...))` in the first trace: made once, on the
    parameter device, as `tf.function` lifts it on one device."""
    strategy = kpd.PSStrategy(devices=cpu_devices[:NUM_REPLICAS])
    made = []

    @tf.function
    def step():
        with strategy.scope():
            if not made:
                made.append(tf.Variable(tf.ones([3])))
            return made[0].assign_add(tf.ones([3]))

    step()
    step()
    np.testing.assert_allclose(np.asarray(made[0]), [3.0, 3.0, 3.0])
    assert made[0].device == strategy.extended.parameter_devices[0]


def test_a_variable_made_in_a_traced_step_from_ops_of_the_step_is_lifted(cpu_devices):
    """An initial value the step computes without its inputs (random ops,
    a read of another variable: nothing TensorFlow folds to a constant) is
    computed once outside the step, as `tf.function` lifts it on one
    device."""
    strategy = kpd.PSStrategy(devices=cpu_devices[:NUM_REPLICAS])
    other = tf.Variable([1.0, 2.0, 3.0])
    made = []

    @tf.function
    def step():
        with strategy.scope():
            if not made:
                noise = tf.random.stateless_normal([3], seed=[1, 2])
                made.append(tf.Variable(other * 2.0 + noise))
            return made[0].assign_add(tf.ones([3]))

    step()
    step()
    noise = tf.random.stateless_normal([3], seed=[1, 2]).numpy()
    np.testing.assert_allclose(
        np.asarray(made[0]), np.array([4.0, 6.0, 8.0]) + noise, rtol=1e-6
    )
    assert made[0].device == strategy.extended.parameter_devices[0]


def test_a_variable_made_in_a_traced_step_from_its_inputs_names_the_fix(cpu_devices):
    """An initial value computed from the step's inputs exists only when
    the step runs, and a variable is made once, before: refused, naming the
    fix (Keras passes callables, made outside). One device initialises it
    in the step's first run instead."""
    strategy = kpd.PSStrategy(devices=cpu_devices[:NUM_REPLICAS])

    @tf.function
    def step(x):
        with strategy.scope():
            return tf.Variable(x * 2.0)

    with pytest.raises(ValueError, match=r"computed from the step's inputs.*callable"):
        step(tf.ones([3]))
