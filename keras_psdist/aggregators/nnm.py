"""Nearest-neighbour mixing: average each replica with its neighbours first."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.aggregators import combine, coordinatewise, distances
from keras_psdist.aggregators.base import Aggregation, Aggregator, check_honest_majority
from keras_psdist.aggregators.order_statistics import (
    insertion_is_cheaper,
    sanitize,
    sort_columns,
    sum_without_extremes,
)
from keras_psdist.aggregators.pre_aggregation import PreAggregation, Transformed


class NearestNeighborMixing(PreAggregation):
    """Replaces each replica by the mean of its n - f nearest, then runs a rule.

    Each replica's value becomes the mean of the n - f replicas nearest to it
    by squared full-vector distance, itself included at distance 0 (ties:
    lowest index); the inner rule then aggregates the n mixed values with the
    same n and f. Mixing shrinks the honest replicas' spread, so the inner
    rule's error bound improves (Allouah et al.). A replica with a NaN or Inf
    anywhere is at distance +inf from the others, so it is nobody's neighbour
    but its own, and its values count as zeros where it is.

    The neighbours come from the distance matrix the whole-vector rules share
    (`keras_psdist.aggregators.distances`). The mixing is one product of the
    `[n, n]` weight matrix (1 / (n - f) for each of a row's neighbours) with
    each variable's `[n, size]` stack of replicas, except in the common case
    of a median or trimmed mean inside: there each mixed replica is the sum
    of all finite replicas less the f its row leaves out, divided by n - f,
    computed inside the inner rule's XLA kernel, so the mixed values are
    never written out (at n = 32: 2 subtractions per row instead of 32
    multiply-adds). That difference loses digits when the left-out replicas
    are much larger than the mixed value, so it runs only when, for every
    row, the left-out replicas' norms add up to no more than its neighbours'
    (`complement_is_exact`); otherwise, e.g. with a far outlier, the product.

    Condition: `num_replicas > 2 * num_byzantine` and the inner rule's
    condition for the same n and f.

    Report: the inner rule's, for the mixed replica r in place of replica r.

    Sparse gradients: dense blocks over the touched rows are part of the full
    vector and are mixed like any other variable (see
    `keras_psdist.aggregators.sparse`).

    Args:
        aggregator: The inner rule: a string id, a config dict or an
            `Aggregator`. Defaults to `"trimmed_mean"`.
        num_byzantine: The *f* this rule is built for, or `None` to take the
            inner rule's, else the strategy's. Defaults to `None`.

    Examples:

    >>> import tensorflow as tf
    >>> rule = NearestNeighborMixing("median", num_byzantine=1)
    >>> column = [tf.constant([v]) for v in (1.0, 2.0, 4.0, 100.0)]
    >>> [out] = rule.aggregate([column])  # mixed: 7/3, 7/3, 7/3, 106/3
    >>> round(float(out.numpy()[0]), 4)
    2.3333

    References:
        Allouah, Farhadkhani, Guerraoui, Gupta, Pinot, Stephan, "Fixing by
        Mixing: A Recipe for Optimal Byzantine ML under Heterogeneity",
        AISTATS 2023.
    """

    needs_num_byzantine = True
    without_num_byzantine = (
        "mixes every replica into the mean of all of them: its inner rule sees "
        "n copies of the plain mean, and defends against no faulty replica"
    )

    def __init__(
        self,
        aggregator: str | dict[str, Any] | Aggregator = "trimmed_mean",
        *,
        num_byzantine: int | None = None,
    ):
        super().__init__(aggregator, num_byzantine)
        # Mixing is linear and the neighbours do not change with a positive
        # scale, so an equivariant inner rule makes the whole one so.
        self.scale_equivariant = self.aggregator.scale_equivariant

    def check(self, num_replicas: int, num_byzantine: int = 0) -> None:
        super().check(num_replicas, num_byzantine)
        check_honest_majority(self, num_replicas, num_byzantine)

    @property
    def runs_with_inner(self) -> bool:
        """Whether the mixing may run inside the inner rule's kernel (see
        the class docstring): the gradient path keeps them as one stage."""
        return _fusable(self.aggregator, [], self.f)

    def transform(self, per_replica: Sequence[Sequence[tf.Tensor]]) -> Transformed:
        """The mixed replicas, by the product with the weight matrix."""
        geom, weights, _, _ = self._neighbours(per_replica)
        return Transformed(combine.matmul_sums(per_replica, weights, geom.finite))

    def _neighbours(self, per_replica):
        """The replicas' geometry, the `[n, n]` mixing weights, each row's
        neighbours (bool) and the ranks of the distances."""
        n = len(per_replica[0])
        size = n - self.f
        geom = distances.geometry(per_replica)
        ranks = distances.stable_ranks(distances.squared_distances(geom))
        # Weight 0 for a non-finite column: its values count as zeros.
        near = tf.logical_and(ranks < size, geom.finite[None, :])
        weights = tf.cast(near, tf.float32) / float(size)
        return geom, weights, near, ranks

    def apply(
        self, per_replica: Sequence[Sequence[tf.Tensor]], state: Any = ()
    ) -> Aggregation:
        n = len(per_replica[0])
        size = n - self.f
        geom, weights, near, ranks = self._neighbours(per_replica)
        inner = self.inner_rule(n)

        def mixed_by_product():
            mixed = combine.matmul_sums(per_replica, weights, geom.finite)
            return inner.apply(mixed, state)

        if not _fusable(inner, per_replica, self.f):
            return mixed_by_product()

        def by_product():  # a stateless inner rule, as `_fusable` checks
            result = mixed_by_product()
            return result.values, result.report

        left_out, dropped = _left_out(ranks, geom.finite, size)

        def by_complement(all_finite):
            lo, hi = inner.kept(n)
            values = [None] * len(per_replica)
            rows = tf.reshape(left_out, [-1])
            for group in coordinatewise.kernel_groups(per_replica):
                columns = [per_replica[i] for i in group]
                picks = [combine.picked(column, rows) for column in columns]
                if all_finite:
                    results = _complement_means_xla(columns, picks, lo, hi)
                else:
                    results = _complement_means_xla(
                        columns, picks, lo, hi, geom.finite, dropped
                    )
                for i, value in zip(group, results, strict=True):
                    values[i] = value
            return values, _mixed_report(inner, per_replica, weights, geom.finite)

        # Selects on run-time flags in the kernel cost about a third of it
        # (measured at n = 32), so the usual all-finite case goes without.
        values, report = tf.cond(
            complement_is_exact(geom, near, left_out, dropped),
            lambda: tf.cond(
                tf.reduce_all(geom.finite),
                lambda: by_complement(True),
                lambda: by_complement(False),
            ),
            by_product,
        )
        return Aggregation(list(values), dict(report), state)


def _left_out(ranks, finite, size):
    """Each row's `n - size` replicas of ranks `size..n-1` (int32 `[n, f]`),
    and which of them are finite (bool `[n, f]`): those to subtract."""
    left_out = tf.argsort(ranks, axis=1, stable=True)[:, size:]
    return left_out, tf.gather(finite, left_out)


def complement_is_exact(
    geom: distances.Geometry,
    near: tf.Tensor,
    left_out: tf.Tensor,
    dropped: tf.Tensor,
) -> tf.Tensor:
    """Whether every row's mix may be taken as the sum less the left-out replicas.

    `S - x_far` loses the digits of the mixed value when `x_far` is much
    larger than it. The test, for each row: the norms of the finite
    replicas it leaves out add up to at most the norms of its neighbours,
    so the difference's round-off is at most about twice the neighbours'
    own sum's.

    Args:
        geom: The replicas' `Geometry`.
        near: bool `[n, n]`, row k's finite neighbours.
        left_out: int32 `[n, f]`, row k's left-out replicas.
        dropped: bool `[n, f]`, which of those are finite.

    Returns:
        A bool scalar.
    """
    norms = tf.sqrt(tf.maximum(tf.linalg.diag_part(geom.gram), 0.0))
    lost = tf.reduce_sum(tf.where(dropped, tf.gather(norms, left_out), 0.0), axis=1)
    kept = tf.linalg.matvec(tf.cast(near, tf.float32), norms)
    return tf.reduce_all(lost <= kept)


def _fusable(inner, per_replica, f) -> bool:
    """Whether the mixing can be fused into the inner rule's XLA kernel."""
    return (
        f > 0
        and isinstance(inner, coordinatewise.OrderStatisticsMean)
        and not tf.nest.flatten(inner.initial_state([]))
        and inner.jit_compile
        and all(v.shape.is_fully_defined() for vs in per_replica for v in vs)
    )


def _mixed_report(inner, per_replica, weights, finite):
    """The inner rule's report on the mixed replicas' sampled coordinates."""
    n = len(per_replica[0])
    depth = inner.report_depth(n)
    if depth <= 0 or not inner.report_names:
        return {name: tf.zeros([n], tf.float32) for name in inner.report_names}
    columns = [list(column) for column in per_replica]
    extreme = _mixed_extremes_xla(columns, weights, finite, depth)
    return {coordinatewise.REPORT_NAME: extreme}


def _mixed_extremes(columns, weights, finite, depth):
    sample, sizes = coordinatewise.report_sample(columns)
    stacked = tf.where(finite[:, None], tf.stack(sample), 0.0)
    mixed = tf.unstack(tf.matmul(weights, stacked))
    return coordinatewise.count_extremes(mixed, sizes, depth)


_mixed_extremes_xla = tf.function(_mixed_extremes, autograph=False, jit_compile=True)


def _complement_means(columns, picks, lo, hi, finite=None, dropped=None):
    """The inner order-statistics mean of the mixed replicas, in one pass.

    Mixed replica k is `(S - the finite replicas row k leaves out) / (n - f)`,
    S the sum of the finite replicas: f subtractions per row where the
    product with the weight matrix makes n multiply-adds. `picks[v]` holds
    variable v's left-out replicas, row after row (`combine.picked`: the
    same tensors, not copies, so a replica left out by many rows is read
    from memory once). The kept order statistics of the n mixed values are
    summed as the total less the extremes when that is cheaper than the
    sorting network (`order_statistics.insertion_is_cheaper`), which is
    exact enough here because `complement_is_exact` holds.

    `finite` (bool `[n]`) and `dropped` (bool `[n, f]`) are given when some
    replica is not finite: its values count as zeros, in S and in the picks.
    """
    n = len(columns[0])
    f = len(picks[0]) // n
    trim = lo if lo == n - 1 - hi else None
    outputs = []
    for column, left in zip(columns, picks, strict=True):
        if finite is not None:
            [column] = distances.zero_nonfinite([column], finite)
            left = [
                tf.where(dropped[i // f, i % f], x, tf.zeros_like(x))
                for i, x in enumerate(left)
            ]
        total = tf.add_n(column)
        mixed = []
        for k in range(n):
            rest = total
            for j in range(f):
                rest = rest - left[k * f + j]
            mixed.append(rest)
        count = tf.cast((n - f) * (hi - lo + 1), total.dtype)
        if trim is not None and insertion_is_cheaper(n, trim):
            outputs.append(sum_without_extremes(mixed, trim) / count)
        else:
            kept = sort_columns([sanitize(m) for m in mixed])[lo : hi + 1]
            outputs.append(tf.add_n(kept) / count)
    return outputs


_complement_means_xla = tf.function(
    _complement_means, autograph=False, jit_compile=True
)
