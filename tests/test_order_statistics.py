"""The coordinate-wise kernels' pieces: sums without extremes and the report's sample."""

import numpy as np
import pytest
import tensorflow as tf

from keras_psdist import aggregators
from keras_psdist.aggregators import coordinatewise
from keras_psdist.aggregators.order_statistics import (
    insertion_is_cheaper,
    sum_without_extremes,
)


@pytest.mark.parametrize(
    "n, t", [(n, t) for n in (1, 5, 8, 33) for t in (0, 1, 2, 3) if 2 * t < n]
)
def test_sum_without_extremes_is_the_sum_of_the_middle_order_statistics(n, t):
    rng = np.random.default_rng(n * 10 + t)
    x = rng.normal(size=(n, 500)).astype(np.float32)
    x[:, :50] = np.round(x[:, :50])  # ties
    got = sum_without_extremes([tf.constant(row) for row in x], t).numpy()
    want = np.sort(x.astype(np.float64), axis=0)[t : n - t].sum(axis=0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_insertion_is_chosen_only_where_it_makes_fewer_operations():
    assert insertion_is_cheaper(32, 2)
    assert not insertion_is_cheaper(8, 2)  # 19 comparators for 8 values
    assert not insertion_is_cheaper(32, 8)


def test_report_of_a_large_variable_is_estimated_on_runs():
    """Replica 0 is shifted far up, so every coordinate of it is extreme; the
    others' sampled fractions are close to the exact count's."""
    n, f, size = 8, 2, 300_001
    rng = np.random.default_rng(3)
    x = rng.normal(size=(n, size)).astype(np.float32)
    x[0] += 100.0
    rule = aggregators.TrimmedMean(num_byzantine=f).bind(n, f)
    report = rule.apply([[tf.constant(row) for row in x]]).report
    got = report["extreme_fraction"].numpy()
    ordered = np.sort(x, axis=0)
    exact = ((x < ordered[f]) | (x > ordered[n - 1 - f])).mean(axis=1)
    assert got[0] == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(got, exact, atol=0.03)
    sample, weights = coordinatewise.report_sample([[tf.constant(row) for row in x]])
    assert int(tf.size(sample[0])) <= coordinatewise.REPORT_SAMPLE
    assert float(tf.reduce_sum(weights)) == pytest.approx(size, rel=1e-3)
