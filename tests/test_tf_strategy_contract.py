"""TensorFlow's own contract for strategies, run against ours.

TensorFlow ships the tests "that should work with any DistributionStrategy"
(`tensorflow/python/distribute/strategy_test_lib.py`: `DistributionTestBase`
and `TwoDeviceDistributionTestBase`). Each test here runs one of them, the
TF2-applicable ones (eager and `tf.function`; not the TF1 graph-and-session
ones, nor those built on the V1-only `make_input_fn_iterator`), against each
of our strategies on two logical CPU replicas: `PSStrategy`, its partitioned
variant and `PSStrategy(dense="all_reduce")`.
"""

from __future__ import annotations

import tensorflow as tf
from absl.testing import parameterized
from tensorflow.python.distribute import strategy_test_lib

import keras_psdist as kpd

KINDS = ("ps", "ps_partitioned", "ps_all_reduce")


def make_strategy(kind: str) -> tf.distribute.Strategy:
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    if kind == "ps":
        return kpd.PSStrategy(devices=devices[:2])
    if kind == "ps_partitioned":
        return kpd.PSStrategy(
            devices=devices[:2],
            parameter_devices=devices[2:5],
            partitioner=kpd.partitioners.Fixed(2),
        )
    return kpd.PSStrategy(devices=devices[:2], dense="all_reduce")


class AnyStrategyContract(
    strategy_test_lib.DistributionTestBase, parameterized.TestCase
):
    """`DistributionTestBase`: tests that should work with any strategy."""

    @parameterized.parameters(*KINDS)
    def test_minimize_loss_eager(self, kind):
        self._test_minimize_loss_eager(make_strategy(kind))

    @parameterized.parameters(*KINDS)
    def test_replica_id(self, kind):
        self._test_replica_id(make_strategy(kind))

    @parameterized.parameters(*KINDS)
    def test_call_and_merge_exceptions(self, kind):
        self._test_call_and_merge_exceptions(make_strategy(kind))

    @parameterized.parameters(*KINDS)
    def test_summary_for_replica_zero_only(self, kind):
        self._test_summary_for_replica_zero_only(make_strategy(kind))

    @parameterized.parameters(*KINDS)
    def test_global_step_update(self, kind):
        self._test_global_step_update(make_strategy(kind))

    @parameterized.parameters(*KINDS)
    def test_trainable_variable(self, kind):
        self._test_trainable_variable(make_strategy(kind))

    @parameterized.parameters(*KINDS)
    def test_input_fn_iterable(self, kind):
        strategy = make_strategy(kind)
        # As TensorFlow's MirroredStrategy test: one pipeline, every element
        # one replica's batch, two replicas reading consecutive elements.
        input_fn = self._input_fn_to_test_input_context(
            lambda: tf.data.Dataset.range(10).batch(1),
            expected_num_replicas_in_sync=2,
            expected_num_input_pipelines=1,
            expected_input_pipeline_id=0,
        )
        expected = [[[i], [i + 1]] for i in range(0, 10, 2)]
        self._test_input_fn_iterable(strategy, input_fn, expected)


class TwoDeviceStrategyContract(
    strategy_test_lib.TwoDeviceDistributionTestBase, parameterized.TestCase
):
    """`TwoDeviceDistributionTestBase`: tests for any two-replica strategy."""

    @parameterized.product(kind=KINDS, run_in_function=(False, True))
    def test_run(self, kind, run_in_function):
        self._test_run(make_strategy(kind), run_in_function=run_in_function)
