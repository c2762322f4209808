"""Mean around the median (Meamed): per coordinate, the n - f values closest to the median."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.aggregators.base import Aggregation, Aggregator, check_honest_majority
from keras_psdist.aggregators.coordinatewise import (
    fraction_outside,
    kernel_groups,
    report_sample,
)
from keras_psdist.aggregators.order_statistics import sanitize, sort_columns

REPORT_NAME = "excluded_fraction"


class MeanAroundMedian(Aggregator):
    """Per coordinate, the mean of the n - f values closest to the median.

    At each coordinate: the median m of the n replicas' values (the mean of
    the two middle ones for even n), then the mean of the n - f values with
    the smallest `|x_r - m|`; of two values at the same distance on either
    side of m, the lower one (so the result does not depend on the order of
    the replicas). NaN counts as +inf, so at most f non-finite values are
    never kept. With f = 0 it is the mean. Coordinate-wise, so it works
    variable by variable.

    The n - f values closest to m are n - f consecutive ones in sorted
    order: one sorting network (see `order_statistics`), then f comparisons
    find where they start (`kept_window`), in one XLA kernel per large
    variable as the trimmed mean's.

    Condition: `num_replicas > 2 * num_byzantine`.

    Report: `excluded_fraction[r]`, the fraction of replica r's coordinates
    outside the range of the kept values (strictly: a value equal to a kept
    one counts as kept, as in the trimmed mean's report), weighted by
    variable size and estimated on the trimmed mean's sample of each
    variable (`coordinatewise.report_sample`).

    Sparse gradients: a dense block over the touched rows (see
    `keras_psdist.aggregators.sparse`).

    Args:
        num_byzantine: The *f* this rule is built for (values left out at each
            coordinate), or `None` to take the strategy's. Defaults to `None`.

    Examples:

    >>> import tensorflow as tf
    >>> rule = MeanAroundMedian(num_byzantine=1)
    >>> column = [tf.constant([v]) for v in (1.0, 2.0, 4.0, 100.0)]
    >>> [out] = rule.aggregate([column])  # median 3: keeps 2, 4 and 1
    >>> round(float(out[0]), 5)
    2.33333

    References:
        Xie, Koyejo, Gupta, "Generalized Byzantine-tolerant SGD", 2018
        (mean around median); ByzFL's `Meamed` (LPD-EPFL/byzfl).
    """

    coordinatewise = True
    needs_num_byzantine = True
    without_num_byzantine = (
        "keeps every value: it is the plain mean, and defends against no faulty replica"
    )
    report_names = (REPORT_NAME,)

    def check(self, num_replicas: int, num_byzantine: int = 0) -> None:
        super().check(num_replicas, num_byzantine)
        check_honest_majority(self, num_replicas, num_byzantine)

    def apply(
        self, per_replica: Sequence[Sequence[tf.Tensor]], state: Any = ()
    ) -> Aggregation:
        columns = [list(column) for column in per_replica]
        f = self.f
        if not all(v.shape.is_fully_defined() for vs in columns for v in vs):
            # XLA would compile anew for every shape (sparse row blocks).
            values, report = _kernel(columns, f)
            return Aggregation(values, {REPORT_NAME: report}, state)
        values = [None] * len(columns)
        for group in kernel_groups(columns):
            results = _means_xla([columns[i] for i in group], f)
            for i, value in zip(group, results, strict=True):
                values[i] = value
        return Aggregation(values, {REPORT_NAME: _report_xla(columns, f)}, state)


def kept_window(
    ordered: Sequence[tf.Tensor], f: int
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """The n - f sorted values closest to the median: their mean and range.

    The n - f values closest to the median m are `ordered[s .. s + n - f - 1]`
    for some `s` in `0..f`. Sliding the window one place right swaps
    `ordered[s]` out for `ordered[s + n - f]` in; it brings a closer value
    in while `ordered[s + n - f] - m < m - ordered[s]`, and since the
    values left of the median only get closer and those right of it only
    farther, that holds for a first run of `s` and then never again: `s` is
    how many of the f comparisons hold. A tie does not move the window, so
    of two values equally far on either side the lower one is kept.

    Args:
        ordered: n tensors, the coordinate-wise order statistics (smallest
            first, no NaN), as `sort_columns` gives them.
        f: How many values are left out, `2f < n`.

    Returns:
        `(mean, low, high)`: at each coordinate, the mean of the kept values
        and the smallest and largest of them.

    >>> import tensorflow as tf
    >>> ordered = [tf.constant([v]) for v in (1.0, 2.0, 4.0, 100.0)]
    >>> [t.numpy().tolist() for t in kept_window(ordered, 1)]
    [[2.3333332538604736], [1.0], [4.0]]
    """
    n = len(ordered)
    keep = n - f
    if n % 2:
        median = ordered[n // 2]
    else:
        median = (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    moves = [ordered[s + keep] - median < median - ordered[s] for s in range(f)]
    if moves:
        start = tf.add_n([tf.cast(m, tf.int32) for m in moves])
    else:
        start = tf.zeros(tf.shape(median), tf.int32)
    low, high = ordered[0], ordered[keep - 1]
    for s in range(1, f + 1):
        at = start == s
        low = tf.where(at, ordered[s], low)
        high = tf.where(at, ordered[s + keep - 1], high)
    # Positions f .. keep - 1 are in every window; one of the first f only if
    # the window starts at or before it, one of the last f only if it reaches it.
    zero = tf.zeros_like(median)
    total = list(ordered[f:keep])
    total += [tf.where(start <= j, ordered[j], zero) for j in range(f)]
    total += [tf.where(start > j - keep, ordered[j], zero) for j in range(keep, n)]
    total = total[0] if len(total) == 1 else tf.add_n(total)
    return total / tf.cast(keep, median.dtype), low, high


def _means(columns, f):
    return [
        kept_window(sort_columns([sanitize(v) for v in column]), f)[0]
        for column in columns
    ]


def _report(columns, f):
    """Each replica's weighted fraction of sampled coordinates outside the
    kept window's range (see the class doc)."""
    n = len(columns[0])
    if f <= 0:
        return tf.zeros([n], tf.float32)
    sample, weights = report_sample(columns)
    sample = [sanitize(s) for s in sample]
    _, low, high = kept_window(sort_columns(sample), f)
    return fraction_outside(sample, low, high, weights)


def _kernel_body(columns, f):
    return _means(columns, f), _report(columns, f)


_kernel = tf.function(_kernel_body, autograph=False)
_means_xla = tf.function(_means, autograph=False, jit_compile=True)
_report_xla = tf.function(_report, autograph=False, jit_compile=True)
