"""Contract tests every aggregation rule must pass, plus lookup and serialization."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from keras_psdist import aggregators
from tests.reference import REFERENCES

RULES = aggregators.names()
SUM, MEAN = tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN


def _aggregate(rule, stacked):
    """Runs `rule.aggregate` on one variable given as an (n, ...) array."""
    [out] = rule.aggregate([[tf.constant(v) for v in stacked]])
    return out.numpy()


@pytest.mark.parametrize("name", RULES)
def test_every_rule_has_a_numpy_reference(name):
    assert name in REFERENCES, (
        f"add a numpy reference for {name!r} to tests/reference.py"
    )


@pytest.mark.parametrize("name", RULES)
@settings(max_examples=25, deadline=None)
@given(
    stacked=hnp.arrays(
        np.float32,
        st.tuples(st.integers(1, 7), st.integers(1, 5)),
        elements=st.floats(-100, 100, width=32),
    )
)
def test_matches_numpy_reference(name, stacked):
    rule = aggregators.get(name)
    np.testing.assert_allclose(
        _aggregate(rule, stacked), REFERENCES[name](stacked), rtol=1e-5, atol=1e-4
    )


@pytest.mark.parametrize("name", RULES)
def test_replica_order_does_not_matter(name):
    rng = np.random.default_rng(0)
    stacked = rng.normal(size=(6, 3, 2)).astype(np.float32)
    rule = aggregators.get(name)
    shuffled = stacked[rng.permutation(6)]
    np.testing.assert_allclose(
        _aggregate(rule, stacked), _aggregate(rule, shuffled), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("name", RULES)
def test_identical_inputs_give_that_input(name):
    value = np.arange(12, dtype=np.float32).reshape(3, 4) - 5.0
    stacked = np.stack([value] * 5)
    np.testing.assert_allclose(
        _aggregate(aggregators.get(name), stacked), value, rtol=1e-6
    )


@pytest.mark.parametrize("name", RULES)
def test_does_not_edit_its_input(name):
    values = [tf.Variable([1.0, 2.0]), tf.Variable([3.0, 5.0])]
    aggregators.get(name).aggregate([values])
    assert values[0].numpy().tolist() == [1.0, 2.0]
    assert values[1].numpy().tolist() == [3.0, 5.0]


@pytest.mark.parametrize("name", RULES)
def test_sum_reduce_has_sum_meaning_of_scaled_inputs(name):
    # Keras sends gradients scaled by 1/n and asks for their SUM: the result
    # must equal the rule applied at true scale.
    rng = np.random.default_rng(1)
    true_scale = rng.normal(size=(4, 5)).astype(np.float32)
    rule = aggregators.get(name)
    [out] = rule.reduce(SUM, [[tf.constant(v / 4) for v in true_scale]])
    np.testing.assert_allclose(
        out.numpy(), _aggregate(rule, true_scale), rtol=1e-5, atol=1e-6
    )
    [out_mean] = rule.reduce(MEAN, [[tf.constant(v) for v in true_scale]])
    np.testing.assert_allclose(
        out_mean.numpy(), _aggregate(rule, true_scale), rtol=1e-5
    )


def test_mean_sparse_stays_sparse_and_sums():
    rule = aggregators.get("mean")
    a = tf.IndexedSlices(
        tf.constant([[1.0, 1.0]]), tf.constant([3]), tf.constant([1_000_000, 2])
    )
    b = tf.IndexedSlices(
        tf.constant([[2.0, 2.0]]), tf.constant([3]), tf.constant([1_000_000, 2])
    )
    out = rule.reduce_sparse(SUM, [a, b])
    assert isinstance(out, tf.IndexedSlices)
    assert out.values.shape[0] == 2  # two rows, never a 1M-row table
    table = tf.Variable(tf.zeros([10, 2]))
    table.scatter_add(tf.IndexedSlices(out.values, out.indices))
    assert table.numpy()[3].tolist() == [3.0, 3.0]
    out_mean = rule.reduce_sparse(MEAN, [a, b])
    np.testing.assert_allclose(out_mean.values.numpy(), [[0.5, 0.5], [1.0, 1.0]])


def test_mean_refuses_byzantine_replicas():
    with pytest.raises(
        ValueError, match="tolerates no Byzantine replica.*num_byzantine=1"
    ):
        aggregators.get("mean").check(num_replicas=4, num_byzantine=1)


def test_get_accepts_string_dict_and_instance():
    rule = aggregators.Mean()
    assert aggregators.get(rule) is rule
    assert isinstance(aggregators.get("mean"), aggregators.Mean)
    assert isinstance(
        aggregators.get({"class_name": "mean", "config": {}}), aggregators.Mean
    )


def test_unknown_name_lists_valid_ones():
    with pytest.raises(
        ValueError, match=r"Unknown aggregator 'krumm'\. Expected one of: mean"
    ):
        aggregators.get("krumm")


def test_bad_identifier_type():
    with pytest.raises(ValueError, match="Received: 3"):
        aggregators.get(3)


@pytest.mark.parametrize("name", RULES)
def test_serialize_round_trip(name):
    rule = aggregators.get(name)
    again = aggregators.deserialize(aggregators.serialize(rule))
    assert type(again) is type(rule) and again.get_config() == rule.get_config()


def test_user_rule_can_be_registered():
    class FirstReplica(aggregators.Aggregator):
        name = "first_replica_for_test"

        def aggregate(self, per_replica):
            return [tf.identity(vs[0]) for vs in per_replica]

    aggregators.register("first_replica_for_test", FirstReplica)
    try:
        rule = aggregators.get("first_replica_for_test")
        assert _aggregate(rule, np.array([[1.0], [9.0]], np.float32)).tolist() == [1.0]
        assert aggregators.serialize(rule)["class_name"] == "first_replica_for_test"
        with pytest.raises(ValueError, match="already registered"):
            aggregators.register("first_replica_for_test", aggregators.Mean)
    finally:
        aggregators._REGISTRY.pop("first_replica_for_test")


def test_register_refuses_non_aggregators():
    with pytest.raises(TypeError, match="Aggregator subclass"):
        aggregators.register("x", dict)
