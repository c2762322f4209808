"""How a simulated attack meets a rule: composed in front of it, not inside it.

`UnderAttack(rule, attack)` is the rule as the strategy runs it when an
attack is configured: each step, the replicas' values (true scale, sparse
rows densified, replicas without data zeroed) first go through
`attack.apply`, then the rule aggregates what the attack left. Neither the
rule nor the `Aggregator` interface knows attacks exist.

Examples:

>>> import tensorflow as tf
>>> from keras_psdist import aggregators, attacks
>>> rule = attacks.UnderAttack(aggregators.Mean(), attacks.SignFlip(replicas=[1]))
>>> column = [tf.constant([1.0]), tf.constant([1.0])]
>>> rule.step(tf.distribute.ReduceOp.MEAN, [column]).values[0].numpy()
array([0.], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.aggregators.base import Aggregation, Aggregator
from keras_psdist.attacks.base import Attack


class UnderAttack(Aggregator):
    """`aggregator`, run on the values `attack` leaves.

    Args:
        aggregator: The rule, as the strategy bound it (or unbound).
        attack: The simulated attack on some replicas' values.

    Attributes:
        aggregator: The rule.
        attack: The attack.
        report_names: The rule's (the attack reports nothing).
    """

    # The attack reads every variable's column of a replica at once (ALIE and
    # IPM take statistics over the whole gradient): never split by variable.
    per_variable = False

    def __init__(self, aggregator: Aggregator, attack: Attack):
        super().__init__(aggregator.num_byzantine)
        self.aggregator = aggregator
        self.attack = attack
        self.num_replicas = aggregator.num_replicas
        self.report_names = tuple(aggregator.report_names)

    def apply(
        self, per_replica: Sequence[Sequence[tf.Tensor]], state: Any = ()
    ) -> Aggregation:
        return self.aggregator.apply(self.attack.apply(per_replica), state)

    def initial_state(self, specs: Sequence[tf.TensorSpec]) -> Any:
        return self.aggregator.initial_state(specs)

    def get_config(self) -> dict[str, Any]:
        return {"aggregator": self.aggregator, "attack": self.attack}

    def __repr__(self) -> str:
        return f"UnderAttack({self.aggregator!r}, {self.attack!r})"
