"""How a simulated attack meets training: in front of the rule, or the batch.

`UnderAttack(rule, attack)` is the rule as the strategy runs it when an
attack is configured: each step, the replicas' values (true scale, sparse
rows densified, replicas without data zeroed) first go through
`attack.apply`, then the rule aggregates what the attack left. An adaptive
attack (`AdaptiveAttack`) also gets the rule, as `apply(values,
rule=...)`: a function running the rule with this step's state. Neither the
rule nor the `Aggregator` interface knows attacks exist.

`corrupting_batches(train_step, attack, replicas)` is the same for data
attacks: the strategy runs each replica's train step through it, so the
attacked replicas train on `attack.corrupt_batch(batch)`.

Examples:

>>> import tensorflow as tf
>>> from keras_psdist import aggregators, attacks
>>> rule = attacks.UnderAttack(aggregators.Mean(), attacks.SignFlip(replicas=[1]))
>>> column = [tf.constant([1.0]), tf.constant([1.0])]
>>> rule.step(tf.distribute.ReduceOp.MEAN, [column]).values[0].numpy()
array([0.], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import tensorflow as tf

from keras_psdist._tf import distribute_lib
from keras_psdist.aggregators.base import Aggregation, Aggregator
from keras_psdist.attacks.base import AdaptiveAttack, Attack
from keras_psdist.attacks.history import HistoryAttack


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
        if isinstance(self.attack, HistoryAttack):
            # `(the rule's state, the attack's history)`.
            rule_state, history = state
            values = self.attack.apply(per_replica, history=history)
            out = self.aggregator.apply(values, rule_state)
            history = self.attack.remember(history, out.values)
            return out._replace(state=(out.state, history))
        # The attack tries candidates against the rule as it will run this
        # step: same state, output values only.
        values = attacked(
            self.attack,
            per_replica,
            lambda values: self.aggregator.apply(values, state).values,
        )
        return self.aggregator.apply(values, state)

    def initial_state(self, specs: Sequence[tf.TensorSpec]) -> Any:
        if isinstance(self.attack, HistoryAttack):
            return (
                self.aggregator.initial_state(specs),
                self.attack.initial_state(specs),
            )
        return self.aggregator.initial_state(specs)

    def get_config(self) -> dict[str, Any]:
        return {"aggregator": self.aggregator, "attack": self.attack}

    def __repr__(self) -> str:
        return f"UnderAttack({self.aggregator!r}, {self.attack!r})"


def attacked(
    attack: Attack,
    per_replica: Sequence[Sequence[tf.Tensor]],
    rule: Callable[[list[list[tf.Tensor]]], list[tf.Tensor]],
) -> list[list[tf.Tensor]]:
    """The values `attack` leaves of the replicas' (dense, true scale).

    Args:
        attack: The attack.
        per_replica: `per_replica[v][r]`.
        rule: What runs after the attack this step, values in, aggregate
            out: an adaptive attack (`AdaptiveAttack`) tries its candidates
            against it; others ignore it.
    """
    if isinstance(attack, AdaptiveAttack):
        return attack.apply(per_replica, rule=rule)
    return attack.apply(per_replica)


def corrupting_batches(
    step: Callable, attack: Attack, replicas: Iterable[int]
) -> Callable:
    """`step` with the batches of `replicas` corrupted by `attack`.

    Only training steps: Keras hands the strategy `model.train_step` (a
    custom loop's function named `train_step` is treated alike);
    `evaluate` and `predict` must see the true labels, and so does every
    step when `attack` is not a data attack (its `corrupt_batch` is
    `Attack`'s, which changes nothing).

    Args:
        step: The function the strategy runs in each replica.
        attack: The attack.
        replicas: The replicas whose batches it corrupts.
    """
    if type(attack).corrupt_batch is Attack.corrupt_batch:
        return step
    if getattr(getattr(step, "python_function", step), "__name__", "") != "train_step":
        return step
    attacked = set(replicas)

    def corrupted(*args, **kwargs):
        replica = distribute_lib.get_replica_context()._replica_id_in_sync_group
        if replica in attacked and args:
            args = (attack.corrupt_batch(args[0]), *args[1:])
        return step(*args, **kwargs)

    return corrupted
