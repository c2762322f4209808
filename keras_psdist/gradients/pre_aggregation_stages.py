"""Pre-aggregation stages: the replicas' values transformed for the rule after.

Nearest-neighbour mixing, bucketing, clipping and ARC
(`keras_psdist.aggregators.nnm`, ...) each hold their rule as an inner
aggregator; in the gradient path each is one stage running its
`transform`, and its inner rule the next (`stages_of`).
"""

from __future__ import annotations

from typing import Any

from keras_psdist.aggregators.base import Aggregator
from keras_psdist.aggregators.pre_aggregation import PreAggregation
from keras_psdist.gradients.rule import Rule
from keras_psdist.gradients.stage import Downstream, Replicas, Stage


class Transform(Stage):
    """A pre-aggregation's own work (`PreAggregation.transform`) as a stage.

    Args:
        pre_aggregation: The pre-aggregation, bound as the strategy binds
            it (its f, its n).

    Attributes:
        pre_aggregation: The pre-aggregation.
    """

    def __init__(self, pre_aggregation: PreAggregation):
        self.pre_aggregation = pre_aggregation

    def apply(
        self, replicas: Replicas, state: Any, *, downstream: Downstream | None = None
    ) -> tuple[Replicas, Any]:
        # The scaling waits for the result when the rest of the path
        # commutes with it (NNM before an order statistic).
        dense = replicas.dense(scale_later=self.pre_aggregation.scale_equivariant)
        out = self.pre_aggregation.transform(dense.values)
        return dense.with_values(out.values, out.replica_index), state

    def __repr__(self) -> str:
        return f"Transform({self.pre_aggregation.name})"


def stages_of(aggregator: Aggregator) -> list[Stage]:
    """`aggregator` as stages: each pre-aggregation's transform, then the rule.

    `nnm>arc>median` is `[Transform(nnm), Transform(arc), Rule(median)]`.
    A pre-aggregation that runs in one kernel with its inner rule
    (`PreAggregation.runs_with_inner`) stays one `Rule` with it.
    """
    stages: list[Stage] = []
    while getattr(aggregator, "pre_aggregation", False) and not (
        aggregator.runs_with_inner
    ):
        stages.append(Transform(aggregator))
        aggregator = aggregator.aggregator
    return [*stages, Rule(aggregator)]
