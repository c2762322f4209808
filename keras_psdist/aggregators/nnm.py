"""Nearest-neighbour mixing: average each replica with its neighbours first."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.aggregators import combine, distances
from keras_psdist.aggregators.base import Aggregation, Aggregator, check_honest_majority
from keras_psdist.aggregators.pre_aggregation import PreAggregation


class NearestNeighborMixing(PreAggregation):
    """Replaces each replica by the mean of its n - f nearest, then runs a rule.

    Each replica's value becomes the mean of the n - f replicas nearest to it
    by squared full-vector distance, itself included at distance 0 (ties:
    lowest index); the inner rule then aggregates the n mixed values with the
    same n and f. Mixing shrinks the honest replicas' spread, so the inner
    rule's error bound improves (Allouah et al.). A replica with a NaN or Inf
    anywhere is at distance +inf from the others, so it is nobody's neighbour
    but its own, and its values count as zeros where it is.

    The mixing is one product of the `[n, n]` weight matrix (1 / (n - f) for
    each of a row's neighbours) with each variable's `[n, size]` stack of
    replicas; the neighbours come from the distance matrix the whole-vector
    rules share (`keras_psdist.aggregators.distances`).

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

    name = "nnm"

    def __init__(
        self,
        aggregator: str | dict[str, Any] | Aggregator = "trimmed_mean",
        *,
        num_byzantine: int | None = None,
    ):
        super().__init__(aggregator, num_byzantine)

    def check(self, num_replicas: int, num_byzantine: int = 0) -> None:
        super().check(num_replicas, num_byzantine)
        check_honest_majority(self, num_replicas, num_byzantine)

    def apply(
        self, per_replica: Sequence[Sequence[tf.Tensor]], state: Any = ()
    ) -> Aggregation:
        n = len(per_replica[0])
        size = n - self.f
        geom = distances.geometry(per_replica)
        ranks = distances.stable_ranks(distances.squared_distances(geom))
        # Weight 0 for a non-finite column: its values count as zeros.
        near = tf.logical_and(ranks < size, geom.finite[None, :])
        weights = tf.cast(near, tf.float32) / float(size)
        mixed = combine.matmul_sums(per_replica, weights, geom.finite)
        return self.inner_rule(n).apply(mixed, state)
