"""Rule-specific tests of the whole-vector rules and the pre-aggregation wrappers.

The contract every rule passes (and the comparison with the numpy references)
lives in `test_aggregators.py`; here: what only these rules do.
"""

import re

import numpy as np
import pytest
import tensorflow as tf

from keras_psdist import aggregators
from keras_psdist.aggregators import distances
from keras_psdist.aggregators import nnm as nnm_lib
from tests import reference

NAN = float("nan")


def _columns(*arrays):
    """`per_replica` from one `(n, ...)` array per variable."""
    return [[tf.constant(a[r]) for r in range(a.shape[0])] for a in arrays]


def _specs(per_replica):
    return [tf.TensorSpec(column[0].shape, column[0].dtype) for column in per_replica]


def _force_gram_path(monkeypatch, block=4):
    """Makes small inputs take the Gram-matrix path, in blocks of `block` values."""
    monkeypatch.setattr(distances, "DIRECT_LIMIT", 0)
    monkeypatch.setattr(distances, "BLOCK", block)


# ------------------------------------------------------------------ distances


@pytest.mark.parametrize("path", ["direct", "gram"])
def test_distances_are_over_the_full_vector(path, monkeypatch):
    if path == "gram":
        _force_gram_path(monkeypatch)
    rng = np.random.default_rng(0)
    a = rng.normal(size=(5, 3, 3)).astype(np.float32)  # 9 values: split in blocks
    b = rng.normal(size=(5, 2)).astype(np.float32)  # small: shares a block
    a[3, 1, 2] = NAN
    got = distances.pairwise_squared_distances(_columns(a, b)).numpy()
    np.testing.assert_allclose(
        got, reference.squared_distances([a, b]), rtol=1e-5, atol=1e-5
    )
    assert np.isinf(got[3, [0, 1, 2, 4]]).all() and got[3, 3] == 0


@pytest.mark.parametrize("centered", [False, True])
def test_batched_gram_pieces_cover_the_full_vector(centered, monkeypatch):
    # Batches of 3-value pieces in chunks of 7 (6 used), a rest of 2, and a
    # small variable that shares a block.
    monkeypatch.setattr(distances, "DIRECT_LIMIT", 0)
    monkeypatch.setattr(distances, "BATCHED_FROM", 4)
    monkeypatch.setattr(distances, "PIECE", 3)
    monkeypatch.setattr(distances, "CHUNK", 7)
    rng = np.random.default_rng(5)
    a = rng.normal(size=(5, 4, 5)).astype(np.float32)  # 20 = 3 * 6 + 2
    b = rng.normal(size=(5, 2)).astype(np.float32)
    center = [np.median(a, axis=0), np.median(b, axis=0)] if centered else None
    geom = distances.geometry(
        _columns(a, b), None if center is None else [tf.constant(c) for c in center]
    )
    flat = np.concatenate([a.reshape(5, -1), b], 1).astype(np.float64)
    if centered:
        flat -= np.concatenate([center[0].reshape(-1), center[1]])
    np.testing.assert_allclose(geom.gram.numpy(), flat @ flat.T, rtol=1e-5, atol=1e-5)


def test_finite_replicas_and_zeroing():
    per_replica = _columns(
        np.array([[1.0, 2.0], [NAN, 0.0], [3.0, 4.0]], np.float32),
        np.array([[1.0], [1.0], [np.inf]], np.float32),
    )
    finite = distances.finite_replicas(per_replica)
    assert finite.numpy().tolist() == [True, False, False]
    zeroed = distances.zero_nonfinite(per_replica, finite)
    assert [x.numpy().tolist() for x in zeroed[0]] == [
        [1.0, 2.0],
        [0.0, 0.0],
        [0.0, 0.0],
    ]
    assert (
        per_replica[0][1].numpy()[0] != per_replica[0][1].numpy()[0]
    )  # input untouched


def test_stable_ranks_break_ties_by_index_and_put_last_ones_last():
    values = tf.constant([2.0, 1.0, 2.0, np.inf, 1.0])
    assert distances.stable_ranks(values).numpy().tolist() == [2, 0, 3, 4, 1]
    last = tf.constant([False, True, False, False, False])
    assert distances.stable_ranks(values, last).numpy().tolist() == [1, 4, 2, 3, 0]


# ---------------------------------------------------------------------- Krum


@pytest.mark.parametrize("path", ["direct", "gram"])
def test_krum_picks_the_honest_cluster_despite_outliers_and_nan(path, monkeypatch):
    if path == "gram":
        _force_gram_path(monkeypatch)
    rng = np.random.default_rng(1)
    x = (1.0 + 0.01 * rng.normal(size=(7, 4))).astype(np.float32)
    x[0] = 1e6  # a far outlier first, so "lowest index" cannot hide a bug
    x[1, 2] = NAN
    result = aggregators.get("krum").bind(7, 2).apply(_columns(x))
    selected = result.report["selected"].numpy()
    assert selected.sum() == 1 and selected[:2].sum() == 0
    np.testing.assert_array_equal(result.values[0].numpy(), x[selected.argmax()])


def test_krum_compares_full_vectors_not_variables():
    # Krum on each variable alone picks replica 1 for `a` and 0 for `b`; on
    # the full vector, replica 2.
    a = np.array([[-3.0], [2.0], [-1.0], [0.0], [3.0]], np.float32)
    b = np.array([[-2.0], [2.0], [-2.0], [-1.0], [3.0]], np.float32)
    rule = aggregators.get("krum").bind(5, 1)
    whole = rule.apply(_columns(a, b))
    assert whole.report["selected"].numpy().tolist() == [0, 0, 1, 0, 0]
    assert [v.numpy().tolist() for v in whole.values] == [[-1.0], [-2.0]]
    [alone_a] = rule.aggregate(_columns(a))
    [alone_b] = rule.aggregate(_columns(b))
    assert (alone_a.numpy().tolist(), alone_b.numpy().tolist()) == ([2.0], [-2.0])


def test_krum_needs_2f_plus_3_replicas():
    with pytest.raises(
        ValueError,
        match=r"Krum needs at least 2 \* num_byzantine \+ 3 = 7 replicas\. Received: "
        r"6 replicas, num_byzantine=2\. Add replicas or lower num_byzantine\.",
    ):
        aggregators.get("krum").bind(6, 2)


def test_multi_krum_averages_the_m_best_and_never_a_nan():
    x = np.array([[0.0], [1.0], [2.0], [NAN], [50.0], [3.0], [1.5]], np.float32)
    result = aggregators.MultiKrum(m=3).bind(7, 2).apply(_columns(x))
    assert result.report["selected"].numpy().tolist() == [0, 1, 1, 0, 0, 0, 1]
    np.testing.assert_allclose(result.values[0].numpy(), [1.5])
    # m = None averages n - f; the NaN replica still gets weight 0.
    default = aggregators.MultiKrum().bind(7, 2).apply(_columns(x))
    assert default.report["selected"].numpy().tolist() == [1, 1, 1, 0, 0, 1, 1]
    np.testing.assert_allclose(default.values[0].numpy(), [1.5])


@pytest.mark.parametrize("m", [0, -1, 2.5, True])
def test_multi_krum_rejects_bad_m(m):
    with pytest.raises(ValueError, match=rf"Received: m={m!r}"):
        aggregators.MultiKrum(m=m)


def test_multi_krum_checks_m_against_n_minus_f():
    with pytest.raises(ValueError, match=r"m <= num_replicas - num_byzantine = 5.*m=6"):
        aggregators.MultiKrum(m=6).bind(7, 2)


# -------------------------------------------------------------------- Bulyan


def test_bulyan_needs_4f_plus_3_replicas():
    with pytest.raises(
        ValueError,
        match=r"^Bulyan needs at least 4 \* num_byzantine \+ 3 = 7 replicas\. Received: "
        r"6 replicas, num_byzantine=1\. Add replicas or lower num_byzantine\.$",
    ):
        aggregators.get("bulyan").bind(6, 1)


@pytest.mark.parametrize("path", ["direct", "gram"])
def test_bulyan_selects_theta_and_matches_reference(path, monkeypatch):
    if path == "gram":
        _force_gram_path(monkeypatch)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(11, 6)).astype(np.float32)
    y = rng.normal(size=(11, 2, 2)).astype(np.float32)
    x[4] = 1e4
    y[7, 0, 0] = NAN
    rule = aggregators.get("bulyan").bind(11, 2)
    result = rule.apply(_columns(x, y))
    selected = result.report["selected"].numpy()
    assert selected.sum() == 11 - 4 and selected[4] == 0 and selected[7] == 0
    values = [v.numpy() for v in result.values]
    reference.assert_matches(rule, [x, y], values, result.report)


# ----------------------------------------------------------- geometric median


def test_geometric_median_resists_outliers_and_reports_weights():
    rng = np.random.default_rng(3)
    x = (5.0 + 0.1 * rng.normal(size=(7, 3))).astype(np.float32)
    x[0] = 1e5
    x[1, 1] = np.inf
    rule = aggregators.GeometricMedian(iterations=20).bind(7, 3)
    result = rule.apply(_columns(x))
    np.testing.assert_allclose(
        result.values[0].numpy(), np.median(x[2:], axis=0), atol=0.2
    )
    weight = result.report["weight"].numpy()
    assert weight[1] == 0 and weight[0] < 1e-4
    np.testing.assert_allclose(weight.sum(), 1.0, rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs",
    [{"iterations": 0}, {"iterations": 2.0}, {"smoothing": 0.0}, {"smoothing": -1}],
)
def test_geometric_median_rejects_bad_arguments(kwargs):
    [(key, value)] = kwargs.items()
    with pytest.raises(
        ValueError, match=rf"GeometricMedian.*Received: {key}={value!r}"
    ):
        aggregators.GeometricMedian(**kwargs)


def test_gram_path_matches_direct_path(monkeypatch):
    # The two ways of computing distances give the same rules' outputs.
    rng = np.random.default_rng(4)
    x = (3.0 + rng.normal(size=(6, 40))).astype(np.float32)
    x[5] = -200.0
    per_replica = _columns(x)
    rules = [aggregators.GeometricMedian(), aggregators.CenteredClipping(radius=2.0)]
    direct = [rule.aggregate(per_replica)[0].numpy() for rule in rules]
    _force_gram_path(monkeypatch, block=16)
    gram = [rule.aggregate(per_replica)[0].numpy() for rule in rules]
    for d, g in zip(direct, gram, strict=True):
        np.testing.assert_allclose(g, d, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------- centered clipping


def test_centered_clipping_state_round_trip():
    rng = np.random.default_rng(5)
    a = rng.normal(size=(5, 3, 2)).astype(np.float32)
    b = rng.normal(size=(5, 4)).astype(np.float32)
    b[2] = 100.0
    per_replica = _columns(a, b)
    rule = aggregators.CenteredClipping(radius=0.5, iterations=2).bind(5, 2)
    initial = rule.initial_state(_specs(per_replica))
    assert isinstance(initial, aggregators.CenteredClippingState)
    assert not initial.has_center.numpy()

    first = rule.apply(per_replica, initial)
    tf.nest.assert_same_structure(first.state, initial)
    for got, want in zip(
        tf.nest.flatten(first.state), tf.nest.flatten(initial), strict=True
    ):
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
    assert first.state.has_center.numpy()
    for center, value in zip(first.state.center, first.values, strict=True):
        np.testing.assert_array_equal(center.numpy(), value.numpy())
    reference.assert_matches(
        rule, [a, b], [v.numpy() for v in first.values], first.report
    )

    second = rule.apply(per_replica, first.state)  # starts from the first output
    center = [v.numpy() for v in first.values]
    reference.assert_matches(
        rule, [a, b], [v.numpy() for v in second.values], second.report, center=center
    )
    assert second.report["clipped"].numpy()[2] == 1.0


def test_centered_clipping_state_in_variables_under_tf_function():
    # As the strategy keeps it: variables, read and assigned in a tf.function.
    rng = np.random.default_rng(6)
    x = rng.normal(size=(5, 8)).astype(np.float32)
    per_replica = _columns(x)
    rule = aggregators.CenteredClipping(iterations=1, jit_compile=False).bind(5, 1)
    state_vars = tf.nest.map_structure(
        tf.Variable, rule.initial_state(_specs(per_replica))
    )

    @tf.function
    def step(per_replica):
        state = tf.nest.map_structure(lambda v: v.read_value(), state_vars)
        result = rule.apply(per_replica, state)
        for var, value in zip(
            tf.nest.flatten(state_vars), tf.nest.flatten(result.state), strict=True
        ):
            var.assign(value)
        return result.values

    first = step(per_replica)[0].numpy()
    second = step(per_replica)[0].numpy()
    np.testing.assert_array_equal(state_vars.center[0].numpy(), second)
    reference.assert_matches(rule, [x], [second], center=[first])


def test_centered_clipping_sparse_block_has_placeholder_state():
    rule = aggregators.CenteredClipping()
    specs = [tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([2], tf.float32)]
    initial = rule.initial_state(specs)
    assert [c.shape.as_list() for c in initial.center] == [[0], [2]]
    n = 3
    rows = tf.IndexedSlices
    sparse = [
        rows(tf.ones([1, 3]) * r, tf.constant([r]), tf.constant([10, 3]))
        for r in range(n)
    ]
    dense = [tf.constant([float(r), 1.0]) for r in range(n)]

    @tf.function
    def step(state):
        return rule.step(tf.distribute.ReduceOp.MEAN, [sparse, dense], state=state)

    result = step(initial)
    assert isinstance(result.values[0], tf.IndexedSlices)
    assert [c.shape.as_list() for c in result.state.center] == [[0], [2]]
    again = step(result.state)  # the block restarts from its median
    assert again.values[0].values.shape[0] == n


@pytest.mark.parametrize(
    "kwargs", [{"radius": 0.0}, {"radius": -1.0}, {"radius": "1"}, {"iterations": 0}]
)
def test_centered_clipping_rejects_bad_arguments(kwargs):
    [(key, value)] = kwargs.items()
    with pytest.raises(
        ValueError, match=rf"CenteredClipping.*Received: {key}={value!r}"
    ):
        aggregators.CenteredClipping(**kwargs)


# ------------------------------------------------------------------ wrappers


def test_nnm_mixes_before_the_inner_rule_and_reports_its_report():
    x = np.array([[0.0], [1.0], [2.0], [3.0], [100.0], [NAN], [4.0]], np.float32)
    rule = aggregators.NearestNeighborMixing("krum").bind(7, 2)
    assert rule.report_names == ("selected",)
    assert (rule.aggregator.num_replicas, rule.aggregator.num_byzantine) == (7, 2)
    result = rule.apply(_columns(x))
    reference.assert_matches(
        rule, [x], [v.numpy() for v in result.values], result.report
    )
    assert set(result.report) == {"selected"}


def _nnm_guard(rule, x):
    """Whether NNM takes the fused complement path on these replicas."""
    per_replica = _columns(*x)
    n = len(per_replica[0])
    size = n - rule.f
    geom = distances.geometry(per_replica)
    ranks = distances.stable_ranks(distances.squared_distances(geom))
    near = tf.logical_and(ranks < size, geom.finite[None, :])
    left_out, dropped = nnm_lib._left_out(ranks, geom.finite, size)
    return bool(nnm_lib.complement_is_exact(geom, near, left_out, dropped))


@pytest.mark.parametrize("outlier", [None, 1e4, NAN], ids=["close", "far", "nan"])
@pytest.mark.parametrize("inner", ["trimmed_mean", "median"])
def test_nnm_fused_complement_matches_the_product(inner, outlier):
    """The fused mix (sum less the left-out replicas, inside the inner
    rule's kernel) gives the product's result; a far finite outlier sends
    the rule to the product instead, where the difference would lose digits."""
    rng = np.random.default_rng(11)
    x = [
        rng.normal(1.0, 0.5, size=(9, 40000)).astype(np.float32),
        rng.normal(size=(9, 3, 2)).astype(np.float32),
    ]
    if outlier is not None:
        x[0][4] = outlier
    fused = aggregators.NearestNeighborMixing(inner).bind(9, 2)
    product = aggregators.NearestNeighborMixing(
        aggregators.get({"class_name": inner, "config": {"jit_compile": False}})
    ).bind(9, 2)
    assert nnm_lib._fusable(fused.aggregator, _columns(*x), 2)
    assert not nnm_lib._fusable(product.aggregator, _columns(*x), 2)
    assert _nnm_guard(fused, x) == (outlier is None or outlier != outlier)
    got = fused.apply(_columns(*x))
    want = product.apply(_columns(*x))
    for g, w in zip(got.values, want.values, strict=True):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(
        got.report["extreme_fraction"].numpy(),
        want.report["extreme_fraction"].numpy(),
        atol=0.02,
    )
    reference.assert_matches(fused, x, [v.numpy() for v in got.values], got.report)


def test_bucketing_maps_the_inner_report_back_to_replicas():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(10, 3)).astype(np.float32)
    rule = aggregators.Bucketing("krum", bucket_size=2, seed=1).bind(10, 1)
    assert (rule.aggregator.num_replicas, rule.aggregator.num_byzantine) == (5, 1)
    assert rule.report_names == ("selected",)
    result = rule.apply(_columns(x))
    selected = result.report["selected"].numpy()
    assert selected.shape == (10,) and selected.sum() == 2  # the winning bucket's pair
    np.testing.assert_allclose(
        result.values[0].numpy(), x[selected == 1].mean(axis=0), rtol=1e-6
    )
    reference.assert_matches(
        rule, [x], [v.numpy() for v in result.values], result.report
    )


def test_bucketing_uneven_buckets_and_condition():
    rule = aggregators.Bucketing("median", bucket_size=3)
    x = np.arange(7, dtype=np.float32)[:, None]
    [out] = rule.aggregate(_columns(x))
    # Buckets of 3, 3 and 1: the median of their means lies in [1, 5].
    assert 1.0 <= out.numpy()[0] <= 5.0
    with pytest.raises(
        ValueError, match=r"3 buckets.*Received: 7 replicas.*Median needs more than 2"
    ):
        rule.bind(7, 2)  # 3 buckets cannot hold 2 Byzantine ones


@pytest.mark.parametrize("size", [0, -2, 1.5])
def test_bucketing_rejects_bad_bucket_size(size):
    with pytest.raises(ValueError, match=rf"Received: bucket_size={size!r}"):
        aggregators.Bucketing(bucket_size=size)


@pytest.mark.parametrize(
    "rule",
    [
        aggregators.NearestNeighborMixing({"class_name": "krum", "config": {}}),
        aggregators.Bucketing(
            aggregators.NearestNeighborMixing("geometric_median"), bucket_size=3, seed=4
        ),
        aggregators.Bucketing("centered_clipping", num_byzantine=1),
        aggregators.Clipping("krum", threshold=0.25, jit_compile=False),
        aggregators.ARC(
            aggregators.Bucketing("median", bucket_size=3), num_byzantine=1
        ),
    ],
)
def test_wrappers_serialize_round_trip(rule):
    config = aggregators.serialize(rule)
    again = aggregators.deserialize(config)
    assert type(again) is type(rule)
    assert type(again.aggregator) is type(rule.aggregator)
    assert again.get_config() == rule.get_config()
    assert again.report_names == rule.report_names


def test_wrapper_and_inner_must_agree_on_num_byzantine():
    rule = aggregators.NearestNeighborMixing(aggregators.TrimmedMean(num_byzantine=1))
    assert rule.num_byzantine == 1
    with pytest.raises(ValueError, match="num_byzantine=2.*num_byzantine=1"):
        aggregators.NearestNeighborMixing(
            aggregators.TrimmedMean(num_byzantine=1), num_byzantine=2
        )


def test_wrapper_passes_the_inner_state_through():
    x = np.random.default_rng(8).normal(size=(6, 4)).astype(np.float32)
    per_replica = _columns(x)
    rule = aggregators.NearestNeighborMixing("centered_clipping").bind(6, 1)
    initial = rule.initial_state(_specs(per_replica))
    assert isinstance(initial, aggregators.CenteredClippingState)
    result = rule.apply(per_replica, initial)
    tf.nest.assert_same_structure(result.state, initial)
    assert result.state.has_center.numpy()


# -------------------------------------------------------- clipping and ARC


class _Keep(aggregators.Aggregator):
    """An inner rule that returns every replica it is given, stacked."""

    def aggregate(self, per_replica):
        return [tf.stack(column) for column in per_replica]


def _clipped_by(rule, *arrays):
    """What the wrapper hands its inner rule, one `(n, ...)` array per variable."""
    n = arrays[0].shape[0]
    bound = type(rule).from_config({**rule.get_config(), "aggregator": _Keep()})
    return [v.numpy() for v in bound.bind(n, rule.f).aggregate(_columns(*arrays))]


def _full_norms(*arrays):
    return np.linalg.norm(
        np.concatenate([a.reshape(len(a), -1) for a in arrays], 1), axis=1
    )


def test_clipping_caps_full_vector_norms_and_keeps_directions():
    rng = np.random.default_rng(9)
    a = (
        rng.normal(size=(6, 3)) * [[0.1], [1.0], [10.0], [0.5], [3.0], [100.0]]
    ).astype(np.float32)
    b = rng.normal(size=(6, 2, 2)).astype(np.float32)
    out_a, out_b = _clipped_by(aggregators.Clipping(threshold=2.0), a, b)
    before, after = _full_norms(a, b), _full_norms(out_a, out_b)
    np.testing.assert_allclose(after, np.minimum(before, 2.0), rtol=1e-6)
    # Every replica scaled by one factor over all its variables.
    factor = np.minimum(1.0, 2.0 / before)
    np.testing.assert_allclose(out_a, a * factor[:, None], rtol=1e-6)
    np.testing.assert_allclose(out_b, b * factor[:, None, None], rtol=1e-6)


def test_clipping_zeroes_non_finite_replicas():
    x = np.array([[3.0, 4.0], [NAN, 1.0], [np.inf, 0.0], [1e30, 1e30]], np.float32)
    [out] = _clipped_by(aggregators.Clipping(threshold=1.0), x)
    np.testing.assert_allclose(out[0], [0.6, 0.8], rtol=1e-6)
    np.testing.assert_array_equal(out[1:], 0.0)  # NaN, Inf, and an overflowing norm


@pytest.mark.parametrize("n, f", [(3, 1), (7, 2), (8, 3), (12, 5)])
def test_arc_clips_exactly_k_vectors_to_the_next_norm(n, f):
    rng = np.random.default_rng(n)
    x = (rng.normal(size=(n, 5)) * rng.uniform(0.1, 10, (n, 1))).astype(np.float32)
    k = 2 * f * (n - f) // n
    assert k == reference.arc_clipped_count(n, f) >= f
    [out] = _clipped_by(aggregators.ARC(num_byzantine=f), x)
    norms = _full_norms(x)
    largest = np.argsort(norms)[::-1]
    changed = ~np.all(out == x, axis=1)
    assert changed.sum() == k and changed[largest[:k]].all()
    threshold = norms[largest[k]]
    np.testing.assert_allclose(_full_norms(out)[largest[:k]], threshold, rtol=1e-6)
    cosine = (out * x).sum(axis=1) / (_full_norms(out) * norms)
    np.testing.assert_allclose(cosine, 1.0, rtol=1e-6)  # directions kept


def test_arc_with_f_0_clips_nothing():
    rng = np.random.default_rng(10)
    scales = [[1.0], [2.0], [50.0], [0.1], [1e3]]
    x = (rng.normal(size=(5, 4)) * scales).astype(np.float32)
    assert reference.arc_clipped_count(5, 0) == 0
    [out] = _clipped_by(aggregators.ARC(), x)
    np.testing.assert_array_equal(out, x)
    [mean] = aggregators.ARC("mean").bind(5, 0).aggregate(_columns(x))
    np.testing.assert_allclose(mean.numpy(), x.mean(axis=0), rtol=1e-6)


def test_arc_ranks_non_finite_replicas_largest():
    # n = 5, f = 1: k = 1, taken by the NaN replica; the finite ones keep their
    # norms (the threshold is the largest finite norm).
    x = np.array(
        [[1.0, 0.0], [0.0, 2.0], [NAN, 0.0], [3.0, 4.0], [0.5, 0.5]], np.float32
    )
    [out] = _clipped_by(aggregators.ARC(num_byzantine=1), x)
    np.testing.assert_array_equal(out[2], 0.0)
    np.testing.assert_array_equal(out[[0, 1, 3, 4]], x[[0, 1, 3, 4]])


def test_arc_then_trimmed_mean_is_the_reference_composition():
    # ARC's clipping in numpy, then the numpy trimmed mean: the same as the
    # TF rule, and as the `arc` reference with its default inner rule.
    rng = np.random.default_rng(11)
    a = rng.normal(size=(9, 4)).astype(np.float32)
    b = rng.normal(size=(9, 3)).astype(np.float32)
    a[2], b[2] = 40.0, -30.0
    a[6, 1] = NAN
    rule = aggregators.ARC("trimmed_mean").bind(9, 2)
    got = [v.numpy() for v in rule.aggregate(_columns(a, b))]
    clipped = reference.arc([a, b], f=2, inner=lambda values, **_: values)
    composed = reference.trimmed_mean(clipped, f=2)
    assert reference.same(got, composed, scale=2.0)
    assert reference.same(got, reference.arc([a, b], f=2), scale=2.0)
    # Clipping changed the result: the mean of the clipped outlier is not the
    # plain trimmed mean's.
    assert not reference.same(got, reference.trimmed_mean([a, b], f=2), scale=2.0)


def test_arc_condition_names_arc():
    with pytest.raises(
        ValueError,
        match=r"^ARC needs more than 2 \* num_byzantine = 4 replicas \(an honest "
        r"majority\)\. Received: 4 replicas, num_byzantine=2\. Add replicas or lower "
        r"num_byzantine\.$",
    ):
        aggregators.get("arc").bind(4, 2)


@pytest.mark.parametrize(
    "threshold", [0.0, -1.0, float("inf"), float("nan"), "1.0", True, None]
)
def test_clipping_rejects_bad_thresholds(threshold):
    with pytest.raises(
        ValueError,
        match=rf"Clipping's `threshold` must be a finite number > 0\. Received: "
        rf"threshold={re.escape(repr(threshold))}\. Pass the largest norm",
    ):
        aggregators.Clipping(threshold=threshold)


def test_clipping_accepts_numpy_and_int_thresholds():
    assert aggregators.Clipping(threshold=np.float32(0.5)).threshold == 0.5
    assert aggregators.Clipping(threshold=2).get_config()["threshold"] == 2.0
