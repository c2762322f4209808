"""The attack stage: a simulated attack replaces some replicas' values.

It stands after worker momentum (an attacker sends what it likes, so it
replaces the momentum kept for it: the strongest attacker) and before the
pre-aggregations and the rule, which see what the attack left. An adaptive
attack (`keras_psdist.attacks.AdaptiveAttack`) tries its candidates against
the rest of the path as it runs this step (`Stage.apply`'s `downstream`).
"""

from __future__ import annotations

from typing import Any

from keras_psdist.attacks.base import Attack
from keras_psdist.attacks.harness import attacked
from keras_psdist.attacks.history import HistoryAttack
from keras_psdist.gradients.stage import Downstream, Replicas, Stage


class Attacked(Stage):
    """`attack` applied to the replicas' values (dense, true scale).

    Args:
        attack: A `keras_psdist.attacks.Attack`.

    Attributes:
        attack: The attack.
    """

    def __init__(self, attack: Attack):
        self.attack = attack

    def init(self, specs):
        # An attack that learns from history keeps the last aggregate.
        if isinstance(self.attack, HistoryAttack):
            return self.attack.initial_state(specs)
        return ()

    def apply(
        self, replicas: Replicas, state: Any, *, downstream: Downstream | None = None
    ) -> tuple[Replicas, Any]:
        if downstream is None:
            raise ValueError(
                f"The attack {self.attack!r} needs a rule after it in the path."
            )
        dense = replicas.dense()
        if isinstance(self.attack, HistoryAttack):
            values = self.attack.apply(dense.values, history=state)
            # The aggregate of this step, for the next: the rest of the path
            # run on what the attack left, as adaptive attacks run it.
            state = self.attack.remember(state, downstream(values))
            return dense.with_values(values), state
        return dense.with_values(attacked(self.attack, dense.values, downstream)), state

    def __repr__(self) -> str:
        return f"Attacked({self.attack!r})"
