"""The aggregator interface: how per-replica values become one.

An aggregator is the *how* of the hook chain: `PSExtended._batch_reduce_to`
collects every replica's gradients for a step and hands them, all variables at
once, to `Aggregator.reduce`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf


class Aggregator:
    """Base class of aggregation rules.

    A rule sees, for each variable, the list of per-replica values at their
    *true* scale (what one replica's loss would give on its own) and returns an
    estimate of their mean. `reduce` adapts that to `tf.distribute`'s
    `ReduceOp`: Keras divides each replica's loss by the replica count and asks
    for a SUM, so under `SUM` the inputs are multiplied by `n` before the rule
    sees them and the rule's mean estimate is returned as the SUM. The learning
    rate therefore means the same with every rule.

    Subclasses implement `aggregate` (and may override `reduce` when a faster
    exact path exists, as `Mean` does). Rules never edit their inputs.

    Attributes:
        name: The string id the rule is registered under.
    """

    name: str = "aggregator"

    def check(self, num_replicas: int, num_byzantine: int = 0) -> None:
        """Raises `ValueError` if the rule cannot run with these counts.

        Called when the strategy is built, so a bad combination fails at once
        rather than at the first step.

        Args:
            num_replicas: Number of replicas whose values are aggregated.
            num_byzantine: Number of replicas that may be faulty.
        """
        if num_replicas < 1:
            raise ValueError(
                f"{type(self).__name__} needs at least 1 replica. "
                f"Received: num_replicas={num_replicas}"
            )

    def aggregate(self, per_replica: Sequence[Sequence[tf.Tensor]]) -> list[tf.Tensor]:
        """Aggregates true-scale values.

        Args:
            per_replica: `per_replica[v][r]` is replica `r`'s value for
                variable `v`; every value of one variable has the same shape.

        Returns:
            One tensor per variable: the rule's estimate of the mean.
        """
        raise NotImplementedError

    def reduce(
        self,
        reduce_op: tf.distribute.ReduceOp,
        per_replica: Sequence[Sequence[tf.Tensor]],
        shares: Sequence[tf.Tensor] | None = None,
    ) -> list[tf.Tensor]:
        """Reduces per-replica values with `tf.distribute` semantics.

        Args:
            reduce_op: `ReduceOp.SUM` (values are scaled by `1/n`, as Keras
                sends gradients) or `ReduceOp.MEAN` (values at true scale).
            per_replica: As in `aggregate`.
            shares: Each replica's fraction of the global batch (summing to
                1), or `None` for equal shares. Replicas with share 0 got no
                data; their values (possibly NaN) are replaced by zeros here.
                Rules that can weigh replicas (`Mean`) override this to use
                the shares exactly.

        Returns:
            One tensor per variable, with the meaning `reduce_op` asks for.
        """
        if reduce_op == tf.distribute.ReduceOp.SUM:
            n = len(per_replica[0]) if per_replica else 1
            per_replica = [[v * tf.cast(n, v.dtype) for v in vs] for vs in per_replica]
        if shares is not None:
            per_replica = [
                [
                    tf.where(tf.cast(s, v.dtype) > 0, v, tf.zeros_like(v))
                    for v, s in zip(vs, shares, strict=True)
                ]
                for vs in per_replica
            ]
        return self.aggregate(per_replica)

    def reduce_sparse(
        self,
        reduce_op: tf.distribute.ReduceOp,
        per_replica: Sequence[tf.IndexedSlices | tf.Tensor],
    ) -> tf.IndexedSlices | tf.Tensor:
        """Reduces one variable's sparse (`IndexedSlices`) per-replica values.

        The base class refuses: a rule must say how it treats rows that only
        some replicas touched. `Mean` concatenates the slices (exact, and the
        table is never densified).
        """
        raise ValueError(
            f"The {type(self).__name__} aggregator does not handle sparse "
            "(IndexedSlices) gradients, as produced by `Embedding`. Use "
            "aggregator='mean' for models with sparse gradients."
        )

    def get_config(self) -> dict[str, Any]:
        """Returns the rule's constructor arguments."""
        return {}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Aggregator:
        """Builds the rule from `get_config()`'s output."""
        return cls(**config)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


def weighted_sum(column: Sequence[tf.Tensor], shares: Sequence[tf.Tensor]) -> tf.Tensor:
    """`sum_r shares[r] * column[r]`, leaving out replicas with share 0.

    `tf.where`, not a product: a replica without data may hold NaN, and
    `NaN * 0` is NaN.
    """
    terms = []
    for value, share in zip(column, shares, strict=True):
        share = tf.cast(share, value.dtype)
        terms.append(tf.where(share > 0, value * share, tf.zeros_like(value)))
    return tf.add_n(terms)
