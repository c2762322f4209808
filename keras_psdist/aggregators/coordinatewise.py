"""The shared kernel of the coordinate-wise rules (median, trimmed mean).

Both keep, at each coordinate, the order statistics `lo..hi` of the n
replicas' values and average them; they differ only in `lo` and `hi`. One
XLA-compiled function does every variable of a step in one pass (see
`order_statistics.py`) and, for the report, counts per replica how many of its
coordinates fell outside the `f`-trimmed range `[x_(f), x_(n-1-f)]` (strictly,
so ties are not counted): a replica that is always extreme stands out.

The report is estimated on an evenly strided sample of at most
`REPORT_SAMPLE` coordinates per variable, weighted by variable size: counting
every coordinate is a per-replica reduction that costs more than the rule
itself (measured: median at 8 GB/s alone, 1.6 GB/s with an exact count).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.aggregators.base import Aggregation, Aggregator, check_honest_majority
from keras_psdist.aggregators.order_statistics import sanitize, sort_columns

REPORT_NAME = "extreme_fraction"
REPORT_SAMPLE = 4096


def mean_of_order_statistics(
    per_replica: Sequence[Sequence[tf.Tensor]],
    lo: int,
    hi: int,
    f: int,
    jit_compile: bool = True,
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

    Returns:
        The per-variable results and the report: a float32 `[n]` tensor, the
        fraction of each replica's coordinates outside the f-trimmed range.
    """
    columns = [list(vs) for vs in per_replica]
    static = all(v.shape.is_fully_defined() for vs in columns for v in vs)
    kernel = _kernel_xla if jit_compile and static else _kernel
    return kernel(columns, lo, hi, f)


def _mean_of_order_statistics(columns, lo, hi, f):
    outputs = []
    for column in columns:
        ordered = sort_columns([sanitize(v) for v in column])
        kept = ordered[lo : hi + 1]
        out = (
            kept[0]
            if len(kept) == 1
            else tf.add_n(kept) / tf.cast(len(kept), kept[0].dtype)
        )
        outputs.append(out)
    return outputs, _extreme_fractions(columns, f)


def _extreme_fractions(columns, f):
    """Each replica's weighted fraction of sampled coordinates outside the
    f-trimmed range: every variable's sample in one `[n, S]` matrix, so the
    sort network runs once and the counts are one matrix-vector product."""
    n = len(columns[0])
    if f <= 0:
        return tf.zeros([n], tf.float32)
    picked, weights = [[] for _ in range(n)], []
    for column in columns:
        size = tf.size(column[0])
        stride = tf.maximum((size + REPORT_SAMPLE - 1) // REPORT_SAMPLE, 1)
        for r, v in enumerate(column):
            picked[r].append(tf.cast(tf.reshape(v, [-1])[::stride], tf.float32))
        taken = tf.size(picked[0][-1])
        weight = tf.cast(size, tf.float32) / tf.cast(tf.maximum(taken, 1), tf.float32)
        weights.append(tf.fill([taken], weight))
    sample = [sanitize(tf.concat(p, axis=0)) for p in picked]
    ordered = sort_columns(sample)
    low, high = ordered[f], ordered[n - 1 - f]
    outside = tf.cast(
        tf.logical_or(tf.stack(sample) < low, tf.stack(sample) > high), tf.float32
    )
    weights = tf.concat(weights, axis=0)
    counts = tf.linalg.matvec(outside, weights)
    return counts / tf.maximum(tf.reduce_sum(weights), 1.0)


_kernel = tf.function(_mean_of_order_statistics, autograph=False)
_kernel_xla = tf.function(_mean_of_order_statistics, autograph=False, jit_compile=True)


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

    def __init__(self, num_byzantine: int | None = None, jit_compile: bool = True):
        super().__init__(num_byzantine)
        self.jit_compile = bool(jit_compile)

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
        n = len(per_replica[0])
        lo, hi = self.kept(n)
        values, extreme = mean_of_order_statistics(
            per_replica, lo, hi, self.report_depth(n), self.jit_compile
        )
        return Aggregation(values, {REPORT_NAME: extreme}, state)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "jit_compile": self.jit_compile}
