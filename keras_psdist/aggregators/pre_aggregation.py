"""The base of the pre-aggregation wrappers (NNM, bucketing, clipping, ARC).

A wrapper transforms the n replicas' values into new ones (mixed with their
neighbours, averaged in buckets, or clipped) and hands them to an inner rule,
which it holds, binds, serializes and whose report and state it passes on.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.aggregators.base import Aggregator
from keras_psdist.families import AGGREGATORS


class PreAggregation(Aggregator):
    """An `Aggregator` that runs an inner rule on transformed values.

    Subclasses implement `inner_replicas(n)` (how many values the inner rule
    sees) and `apply`, calling `inner_rule(n)` for the inner rule with the
    wrapper's f.

    Args:
        aggregator: The inner rule: a string id, a config dict or an
            `Aggregator`.
        num_byzantine: The *f* this rule is built for, or `None` to take the
            inner rule's, else the strategy's. Must agree with the inner
            rule's when both are set.

    Attributes:
        aggregator: The inner rule (bound once the wrapper is bound).
        report_names: The inner rule's.
    """

    def __init__(
        self,
        aggregator: str | dict[str, Any] | Aggregator = "trimmed_mean",
        num_byzantine: int | None = None,
    ):
        inner = AGGREGATORS.get(aggregator)
        if num_byzantine is None:
            num_byzantine = inner.num_byzantine
        elif inner.num_byzantine is not None and inner.num_byzantine != num_byzantine:
            raise ValueError(
                f"{type(self).__name__} was given num_byzantine={num_byzantine} but "
                f"its inner aggregator {inner!r} was built for num_byzantine="
                f"{inner.num_byzantine}. Pass the same value to both, or set only one."
            )
        super().__init__(num_byzantine)
        self.aggregator = inner
        self.report_names = tuple(inner.report_names)

    def inner_replicas(self, num_replicas: int) -> int:
        """How many values the inner rule aggregates when there are n replicas."""
        return num_replicas

    def check(self, num_replicas: int, num_byzantine: int = 0) -> None:
        super().check(num_replicas, num_byzantine)
        self.aggregator.check(self.inner_replicas(num_replicas), num_byzantine)

    def bind(
        self, num_replicas: int, num_byzantine: int | None = None
    ) -> PreAggregation:
        bound = super().bind(num_replicas, num_byzantine)
        bound.aggregator = self.aggregator.bind(
            self.inner_replicas(num_replicas), bound.num_byzantine
        )
        return bound

    def inner_rule(self, num_replicas: int) -> Aggregator:
        """The inner rule for this step, with the wrapper's f.

        The bound inner rule once the wrapper is bound to n replicas;
        otherwise (a rule used on its own) a copy carrying the wrapper's f,
        without checking the condition.
        """
        if self.num_replicas == num_replicas:
            return self.aggregator
        if self.aggregator.num_byzantine == self.f:
            return self.aggregator
        inner = copy.copy(self.aggregator)
        inner.num_byzantine = self.f
        return inner

    def initial_state(self, specs: Sequence[tf.TensorSpec]) -> Any:
        return self.aggregator.initial_state(specs)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "aggregator": AGGREGATORS.serialize(self.aggregator),
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> PreAggregation:
        config = dict(config)
        if isinstance(config.get("aggregator"), dict):
            config["aggregator"] = AGGREGATORS.deserialize(config["aggregator"])
        return super().from_config(config)
