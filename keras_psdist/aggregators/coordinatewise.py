"""The shared kernel of the coordinate-wise rules (median, trimmed mean).

Both keep, at each coordinate, the order statistics `lo..hi` of the n
replicas' values and average them; they differ only in `lo` and `hi`. An
XLA-compiled function does this in one pass over the values (see
`order_statistics.py`): one call for each large variable, so that its result
is ready as soon as its gradients are, and one for all the small ones. Another
kernel, for the report, counts per replica how many of its coordinates fell
outside the `f`-trimmed range `[x_(f), x_(n-1-f)]` (strictly, so ties are not
counted): a replica that is always extreme stands out. Nothing waits for the
report but its variable, so it no longer holds up the optimizer's update.

The report is estimated on a sample of at most `REPORT_SAMPLE` coordinates
per variable (evenly spaced runs of `REPORT_RUN` consecutive ones), weighted
by variable size: counting every coordinate is a per-replica reduction that
costs more than the rule itself (measured: median at 8 GB/s alone, 1.6 GB/s
with an exact count).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.aggregators.base import Aggregation, Aggregator, check_honest_majority
from keras_psdist.aggregators.configs import check_bool
from keras_psdist.aggregators.order_statistics import sanitize, sort_columns

REPORT_NAME = "extreme_fraction"
REPORT_SAMPLE = 4096
# Consecutive values per run of the sample (see `report_sample`): 4 cache lines.
REPORT_RUN = 64
# Variables with fewer values share one kernel call (see `kernel_groups`).
OWN_KERNEL_MIN_SIZE = 16384


def mean_of_order_statistics(
    per_replica: Sequence[Sequence[tf.Tensor]],
    lo: int,
    hi: int,
    f: int,
    jit_compile: bool = True,
    *,
    has_data: tf.Tensor | None = None,
    scale: float | None = None,
) -> tuple[list[tf.Tensor], tf.Tensor]:
    """Averages the order statistics `lo..hi` of every variable's column.

    Args:
        per_replica: `per_replica[v][r]`, as in `Aggregator.aggregate`.
        lo: First order statistic kept (0 is the smallest).
        hi: Last order statistic kept, inclusive.
        f: Trim depth of the report.
        jit_compile: Compile with XLA (much faster; see module doc). Only
            when every shape is known: XLA would recompile for each new
            shape, and sparse gradients' row blocks change size every step.
        has_data: A bool `[n]` tensor: replicas marked False count as zeros
            (see `Aggregator.apply_step`). Defaults to `None`: all have data.
        scale: A factor applied to the results. Defaults to `None`: 1.
            Applied inside the kernel only when `hi - lo + 1` is a power of
            two: XLA divides by a multiplication by the reciprocal and may
            reassociate it with the factor, which is exact only then; other
            counts are scaled after the kernel, as `Aggregator.apply_step`
            does.

    Returns:
        The per-variable results and the report: a float32 `[n]` tensor, the
        fraction of each replica's coordinates outside the f-trimmed range.
    """
    columns = [list(vs) for vs in per_replica]
    n = len(columns[0])
    static = all(v.shape.is_fully_defined() for vs in columns for v in vs)
    count = hi - lo + 1
    after = None
    if scale is not None and count & (count - 1):
        scale, after = None, scale
    if not (jit_compile and static):
        values, report = _kernel(columns, lo, hi, f, has_data, scale)
        return _scaled(values, after), report
    values = [None] * len(columns)
    for group in kernel_groups(columns):
        results = _values_xla([columns[i] for i in group], lo, hi, has_data, scale)
        for i, value in zip(group, results, strict=True):
            values[i] = _scaled([value], after)[0]
    if f <= 0:
        return values, tf.zeros([n], tf.float32)
    return values, _extreme_fractions_xla(columns, f, has_data)


def kernel_groups(columns):
    """Which variables share a kernel call: each large one has its own, so
    that its aggregation (and the optimizer's update of it) starts as soon
    as every replica's gradient for it exists, while the backward pass of
    earlier layers still runs, as the mean's per-variable sums do; the small
    ones share one call, so that a model with many does not pay a launch for
    each."""
    large, small = [], []
    for i, column in enumerate(columns):
        if column[0].shape.num_elements() >= OWN_KERNEL_MIN_SIZE:
            large.append([i])
        else:
            small.append(i)
    return large + ([small] if small else [])


def _mean_of_order_statistics(columns, lo, hi, f, has_data=None, scale=None):
    return (
        _order_statistics_means(columns, lo, hi, has_data, scale),
        _extreme_fractions(columns, f, has_data),
    )


def _order_statistics_means(columns, lo, hi, has_data=None, scale=None):
    outputs = []
    for column in columns:
        ordered = sort_columns([sanitize(v) for v in _masked(column, has_data)])
        kept = ordered[lo : hi + 1]
        out = (
            kept[0]
            if len(kept) == 1
            else tf.add_n(kept) / tf.cast(len(kept), kept[0].dtype)
        )
        if scale is not None:
            out = out * tf.cast(scale, out.dtype)
        outputs.append(out)
    return outputs


def _scaled(values, scale):
    if scale is None:
        return values
    return [v * tf.cast(scale, v.dtype) for v in values]


def _masked(values, has_data):
    """Zeros for the replicas without data (inside a kernel: fused, free)."""
    if has_data is None:
        return list(values)
    return [tf.where(has_data[r], v, tf.zeros_like(v)) for r, v in enumerate(values)]


def _extreme_fractions(columns, f, has_data=None):
    """Each replica's weighted fraction of sampled coordinates outside the
    f-trimmed range (see `report_sample` and `count_extremes`)."""
    n = len(columns[0])
    if f <= 0:
        return tf.zeros([n], tf.float32)
    sample, weights = report_sample(columns)
    return count_extremes(_masked(sample, has_data), weights, f)


def report_sample(columns) -> tuple[list[tf.Tensor], tf.Tensor]:
    """The report's sample: evenly spaced runs of every variable's coordinates.

    A variable of at most `REPORT_SAMPLE` values is taken whole; a larger
    one gives `REPORT_SAMPLE / REPORT_RUN` runs of `REPORT_RUN` consecutive
    values, evenly spaced. Runs, not single values at a stride: each strided
    value is a cache line of its own, fetched from memory one after the
    other (measured at n = 32, d = 1e6, the trimmed mean's report kernel:
    34 ms with a stride, 2.9x the `mean` rule; 9 ms with runs).

    Returns:
        One float32 vector of `S` sampled values per replica (every
        variable's sample, concatenated) and the `[S]` weights (each
        variable's size over its sample's), so that the counts are weighted
        by variable size.
    """
    n = len(columns[0])
    picked, weights = [[] for _ in range(n)], []
    for column in columns:
        static_size = column[0].shape.num_elements()
        for r, v in enumerate(column):
            flat = tf.reshape(v, [-1])
            picked[r].append(tf.cast(_sampled(flat, static_size), tf.float32))
        taken = tf.size(picked[0][-1])
        size = tf.size(column[0])
        weight = tf.cast(size, tf.float32) / tf.cast(tf.maximum(taken, 1), tf.float32)
        weights.append(tf.fill([taken], weight))
    return [tf.concat(p, axis=0) for p in picked], tf.concat(weights, axis=0)


def _sampled(flat, size):
    """`flat` itself, or evenly spaced runs of it (see `report_sample`)."""
    if size is None:  # known at run time only: a stride
        stride = tf.maximum((tf.size(flat) + REPORT_SAMPLE - 1) // REPORT_SAMPLE, 1)
        return flat[::stride]
    if size <= REPORT_SAMPLE:
        return flat
    runs = size // REPORT_RUN
    every = -(-runs // (REPORT_SAMPLE // REPORT_RUN))
    return tf.reshape(
        tf.reshape(flat[: runs * REPORT_RUN], [runs, REPORT_RUN])[::every], [-1]
    )


def count_extremes(
    sample: Sequence[tf.Tensor], weights: tf.Tensor, f: int
) -> tf.Tensor:
    """Each replica's weighted fraction of `sample` outside the f-trimmed range.

    The `[n, S]` sample in one piece, so the sort network runs once and the
    counts are one matrix-vector product.
    """
    sample = [sanitize(s) for s in sample]
    ordered = sort_columns(sample)
    return fraction_outside(sample, ordered[f], ordered[len(sample) - 1 - f], weights)


def fraction_outside(
    sample: Sequence[tf.Tensor], low: tf.Tensor, high: tf.Tensor, weights: tf.Tensor
) -> tf.Tensor:
    """Each replica's weighted fraction of `sample` strictly outside
    `[low, high]` (per coordinate), as one matrix-vector product."""
    stacked = tf.stack(sample)
    outside = tf.cast(tf.logical_or(stacked < low, stacked > high), tf.float32)
    counts = tf.linalg.matvec(outside, weights)
    return counts / tf.maximum(tf.reduce_sum(weights), 1.0)


_kernel = tf.function(_mean_of_order_statistics, autograph=False)
_values_xla = tf.function(_order_statistics_means, autograph=False, jit_compile=True)
_extreme_fractions_xla = tf.function(
    _extreme_fractions, autograph=False, jit_compile=True
)


class OrderStatisticsMean(Aggregator):
    """Base of `Median` and `TrimmedMean`: the mean of the kept order statistics.

    Subclasses say which order statistics they keep (`kept(n)`) and how deep
    the report trims (`report_depth(n)`). Condition: `n > 2f`.

    Args:
        num_byzantine: The *f* this rule is built for, or `None` to take the
            strategy's. Defaults to `None`.
        jit_compile: Run the sorting network under XLA. Defaults to `True`.
    """

    report_names = (REPORT_NAME,)
    # Order statistics commute with a positive scale; so does the report.
    scale_equivariant = True
    coordinatewise = True

    def __init__(self, num_byzantine: int | None = None, jit_compile: bool = True):
        super().__init__(num_byzantine)
        self.jit_compile = check_bool(type(self).__name__, "jit_compile", jit_compile)

    def kept(self, n: int) -> tuple[int, int]:
        """`(lo, hi)`: the first and last order statistic kept, inclusive."""
        raise NotImplementedError

    def report_depth(self, n: int) -> int:
        """How many values per side the report counts as extreme."""
        return self.f

    def check(self, num_replicas: int, num_byzantine: int = 0) -> None:
        super().check(num_replicas, num_byzantine)
        check_honest_majority(self, num_replicas, num_byzantine)

    def apply(
        self, per_replica: Sequence[Sequence[tf.Tensor]], state: Any = ()
    ) -> Aggregation:
        return self.apply_step(per_replica, state)

    def apply_step(
        self,
        per_replica: Sequence[Sequence[tf.Tensor]],
        state: Any = (),
        *,
        has_data: tf.Tensor | None = None,
        scale: float | None = None,
    ) -> Aggregation:
        # The masking and the scaling happen inside the kernel's one pass.
        n = len(per_replica[0])
        lo, hi = self.kept(n)
        values, extreme = mean_of_order_statistics(
            per_replica,
            lo,
            hi,
            self.report_depth(n),
            self.jit_compile,
            has_data=has_data,
            scale=scale,
        )
        return Aggregation(values, {REPORT_NAME: extreme}, state)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "jit_compile": self.jit_compile}
