"""The base of the pre-aggregations (NNM, bucketing, clipping, ARC).

A pre-aggregation transforms the n replicas' values into new ones (mixed
with their neighbours, averaged in buckets, or clipped): its `transform`.
Written in a configuration before a rule (`"nnm>median"`), it holds that
rule as its inner aggregator, which it binds, serializes and whose report
and state it passes on. In the strategy's gradient path
(`keras_psdist.gradients`) it is one stage, its inner rule the next.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, NamedTuple

import tensorflow as tf

from keras_psdist import spelling
from keras_psdist.aggregators.base import Aggregation, Aggregator
from keras_psdist.families import AGGREGATORS


class Transformed(NamedTuple):
    """What a pre-aggregation made of the replicas' values.

    Attributes:
        values: `values[v][k]`, the k-th value the inner rule aggregates for
            variable v.
        replica_index: int32 `[n]`, which of them stands for replica r (the
            inner rule's report on it is replica r's), or `None` when value
            r stands for replica r.
    """

    values: list[list[tf.Tensor]]
    replica_index: tf.Tensor | None = None


class PreAggregation(Aggregator):
    """An `Aggregator` that runs an inner rule on transformed values.

    Subclasses implement `transform` (their own work, with the wrapper's f)
    and, when the inner rule sees another number of values,
    `inner_replicas(n)`.

    Args:
        aggregator: The inner rule: a string id, a config dict or an
            `Aggregator`.
        num_byzantine: The *f* this rule is built for, or `None` to take the
            inner rule's, else the strategy's. Must agree with the inner
            rule's when both are set.

    Attributes:
        aggregator: The inner rule (bound once the wrapper is bound).
        report_names: The inner rule's.
        pre_aggregation: True: a configuration writes it before a rule
            (`keras_psdist.spelling`); a user's subclass registered with
            `aggregators.register` is spelled so too.
        runs_with_inner: True when it computes with its inner rule in one
            kernel (NNM with an order-statistics rule), or implements only
            `apply`: the gradient path then keeps the two as one stage.
    """

    pre_aggregation = True

    def __init__(
        self,
        aggregator: str | dict[str, Any] | Aggregator = "trimmed_mean",
        num_byzantine: int | None = None,
    ):
        if spelling.is_spelled(aggregator):
            aggregator = spelling.aggregator_only(aggregator)
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

    @property
    def runs_with_inner(self) -> bool:
        # A subclass written before `transform` existed runs its inner rule
        # in its own `apply`.
        return type(self).transform is PreAggregation.transform

    def transform(self, per_replica: Sequence[Sequence[tf.Tensor]]) -> Transformed:
        """The values the inner rule aggregates, from the replicas'.

        Args:
            per_replica: Dense true-scale values, `per_replica[v][r]`.

        Returns:
            A `Transformed`: new tensors, the inputs left as they are.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement `transform`.")

    def apply(
        self, per_replica: Sequence[Sequence[tf.Tensor]], state: Any = ()
    ) -> Aggregation:
        n = len(per_replica[0])
        out = self.transform(per_replica)
        result = self.inner_rule(n).apply(out.values, state)
        return result._replace(report=index_report(result.report, out.replica_index))

    def initial_state(self, specs: Sequence[tf.TensorSpec]) -> Any:
        return self.aggregator.initial_state(specs)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "aggregator": AGGREGATORS.serialize(self.aggregator),
        }

    def __repr__(self) -> str:
        # The inner rule as its own repr, not as its config dict.
        args = ", ".join(
            f"{k}={self.aggregator!r}" if k == "aggregator" else f"{k}={v!r}"
            for k, v in self.get_config().items()
            if v is not None
        )
        return f"{type(self).__name__}({args})"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> PreAggregation:
        config = dict(config)
        if isinstance(config.get("aggregator"), dict):
            config["aggregator"] = AGGREGATORS.deserialize(config["aggregator"])
        return super().from_config(config)


def index_report(report: dict[str, tf.Tensor], replica_index: tf.Tensor | None):
    """An inner rule's report, per replica: entry r is that of the value
    standing for replica r (`Transformed.replica_index`)."""
    if replica_index is None:
        return report
    return {name: tf.gather(value, replica_index) for name, value in report.items()}
