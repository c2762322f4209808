"""MoNNA: the mean of a trusted replica's n - f nearest neighbours."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.aggregators import combine, distances
from keras_psdist.aggregators.base import (
    Aggregation,
    Aggregator,
    check_honest_majority,
    check_int_at_least,
)
from keras_psdist.aggregators.configs import check_bool

REPORT_NAME = "selected"


class MoNNA(Aggregator):
    """The mean of the n - f replicas nearest to a trusted one.

    The replicas nearest to replica `reference` by full-vector distance
    (every variable concatenated), itself included at distance 0, ties by
    lowest index, are averaged. MoNNA's guarantee needs `reference` to be
    honest: in the paper a node's own vector. Here that is a replica the
    job trusts, say the chief's own (replica 0 of `PSStrategy`, worker:0's
    gradient under `SyncReplicaStrategy`); a faulty `reference` defeats it.
    With worker momentum (`+wm`) it is the paper's momentum variant. A
    replica with a NaN or Inf anywhere is at distance +inf from the others
    and counts as zeros if it must be taken (it never is while f or fewer
    are non-finite and `reference` is finite).

    Condition: `num_replicas > 2 * num_byzantine` and `reference <
    num_replicas`.

    Report: `selected[r]`, 1.0 for the averaged replicas, 0.0 for the others.

    Args:
        num_byzantine: The *f* this rule is built for, or `None` to take the
            strategy's. Defaults to `None`.
        reference: The trusted replica's id, an int >= 0. Defaults to 0.
        jit_compile: Compile the average with XLA. Defaults to `True`.

    Examples:

    >>> import tensorflow as tf
    >>> rule = MoNNA(num_byzantine=1, reference=0)
    >>> column = [tf.constant([v]) for v in (1.0, 2.0, 4.0, 100.0)]
    >>> result = rule.apply([column])
    >>> round(float(result.values[0][0]), 4)  # replica 0 and its 2 nearest
    2.3333
    >>> result.report["selected"].numpy().tolist()
    [1.0, 1.0, 1.0, 0.0]

    References:
        Farhadkhani, Guerraoui, Gupta, Hoang, Pinot, Stephan, "Robust
        Collaborative Learning with Linear Gradient Overhead", ICML 2023
        (MoNNA); ByzFL's `MoNNA(f, idx)` (LPD-EPFL/byzfl).
    """

    needs_num_byzantine = True
    without_num_byzantine = (
        "averages every replica: it is the plain mean, and defends against no "
        "faulty replica"
    )
    report_names = (REPORT_NAME,)

    def __init__(
        self,
        num_byzantine: int | None = None,
        *,
        reference: int = 0,
        jit_compile: bool = True,
    ):
        super().__init__(num_byzantine)
        check_int_at_least("reference", reference, 0)
        self.reference = reference
        self.jit_compile = check_bool(type(self).__name__, "jit_compile", jit_compile)

    @property
    def trusted_replicas(self) -> tuple[int, ...]:
        """The replicas the rule needs honest: `(reference,)`."""
        return (self.reference,)

    def check(self, num_replicas: int, num_byzantine: int = 0) -> None:
        super().check(num_replicas, num_byzantine)
        check_honest_majority(self, num_replicas, num_byzantine)
        if self.reference >= num_replicas:
            raise ValueError(
                f"MoNNA's reference is replica {self.reference}, but there are "
                f"only {num_replicas} replicas (ids 0 to {num_replicas - 1}). "
                f"Received: reference={self.reference}, num_replicas="
                f"{num_replicas}. Pick a trusted replica below {num_replicas}."
            )

    def apply(
        self, per_replica: Sequence[Sequence[tf.Tensor]], state: Any = ()
    ) -> Aggregation:
        n = len(per_replica[0])
        geom = distances.geometry(per_replica)
        row = distances.squared_distances(geom)[self.reference]
        ranks = distances.stable_ranks(row)
        chosen = ranks < n - self.f
        taken = tf.logical_and(chosen, geom.finite)
        weights = tf.cast(taken, tf.float32) / float(n - self.f)
        [values] = zip(
            *combine.weighted_sums(per_replica, weights[None, :], self.jit_compile),
            strict=True,
        )
        return Aggregation(
            list(values), {REPORT_NAME: tf.cast(chosen, tf.float32)}, state
        )

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "reference": self.reference,
            "jit_compile": self.jit_compile,
        }
