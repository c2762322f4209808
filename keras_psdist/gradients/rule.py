"""The last stage: an aggregation rule, which returns the aggregate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.aggregators.base import Aggregation, Aggregator
from keras_psdist.gradients.stage import Downstream, Replicas, Stage


class Rule(Stage):
    """`aggregator` as the last stage of a gradient path.

    On values nobody densified it runs the rule's own `Aggregator.step` (its
    fast paths: the mean over sparse rows, an order-statistics rule's fused
    scaling and masking); on dense values, `Aggregator.apply`, and gives the
    result its scale, its sparse rows and a per-replica report back
    (`Replicas.finish`).

    Args:
        aggregator: The rule, bound (`Aggregator.bind`) as the strategy
            binds it.

    Attributes:
        aggregator: The rule.
    """

    def __init__(self, aggregator: Aggregator):
        self.aggregator = aggregator
        self.per_variable = aggregator.per_variable
        self.report_names = tuple(aggregator.report_names)

    def init(self, specs: Sequence[tf.TensorSpec]) -> Any:
        return self.aggregator.initial_state(list(specs))

    def apply(
        self, replicas: Replicas, state: Any, *, downstream: Downstream | None = None
    ) -> tuple[Aggregation, Any]:
        if not replicas.is_dense:
            result = self.aggregator.step(
                replicas.reduce_op, replicas.values, shares=replicas.shares, state=state
            )
            return result, result.state
        result = replicas.finish(self.aggregator.apply(replicas.values, state))
        return result, result.state

    def __repr__(self) -> str:
        return f"Rule({self.aggregator!r})"
