"""Simulated Byzantine attacks, for evaluating robust aggregation rules.

An attack names the replicas it controls (`replicas=[6, 7]`) and what they
do: gradient attacks (`SignFlip`, `Scale`, `GaussianNoise`, `NonFinite`,
`ALIE`, `IPM`, `Mimic`, `MinMax`, `MinSum`) replace those replicas' gradients before
aggregation; adaptive attacks (`OptimalALIE`, `OptimalIPM`, `OptimalLabelFlip`) do too, tuned
each step against the rule in use; attacks that learn from history (`ROP`)
from the rule's previous aggregate; data attacks (`LabelFlip`) corrupt their
batches. Attacks need their replicas, so `get` takes an instance or a config
dict, not a bare string id.

Examples:

>>> from keras_psdist import attacks
>>> attack = attacks.get({"class_name": "alie", "config": {"replicas": [6, 7]}})
>>> attack
ALIE(replicas=[6, 7])
>>> attacks.serialize(attack)
{'class_name': 'alie', 'config': {'replicas': [6, 7], 'z': None}}
>>> attacks.get(attacks.serialize(attack)).replicas
(6, 7)
"""

from __future__ import annotations

from typing import Any

from keras_psdist.attacks.adaptive import OptimalALIE, OptimalIPM, OptimalLabelFlip
from keras_psdist.attacks.base import AdaptiveAttack, Attack, GradientAttack
from keras_psdist.attacks.crafted import ALIE, IPM, Mimic
from keras_psdist.attacks.data import LabelFlip
from keras_psdist.attacks.gradient import GaussianNoise, NonFinite, Scale, SignFlip
from keras_psdist.attacks.harness import UnderAttack
from keras_psdist.attacks.history import ROP, History, HistoryAttack
from keras_psdist.attacks.min_max import MinMax, MinSum
from keras_psdist.families import ATTACKS


def get(identifier: dict[str, Any] | Attack | None) -> Attack | None:
    """Returns an attack from a config dict or an instance (`None` stays `None`).

    An attack needs the replicas it controls, so a bare string id is
    refused with an example config.

    Raises:
        ValueError: for a string id (an attack needs its replicas), an
            unknown id (naming the valid ones) or anything else.
    """
    return None if identifier is None else ATTACKS.get(identifier)


def serialize(attack: Attack) -> dict[str, Any]:
    """Returns `{"class_name": id, "config": {...}}` for `attack`.

    Raises:
        ValueError: if its class is not registered.
    """
    return ATTACKS.serialize(attack)


def deserialize(config: dict[str, Any]) -> Attack:
    """Inverse of `serialize`.

    Raises:
        ValueError: for a malformed config, an unknown `class_name` (naming
            the valid ones) or an argument the class does not take (naming
            the ones it does).
    """
    return ATTACKS.deserialize(config)


def names() -> list[str]:
    """The registered string ids."""
    return ATTACKS.names()


def register(name: str, cls: type[Attack]) -> type[Attack]:
    """Registers a user attack class under `name`, so `get(name)` finds it.

    Args:
        name: The string id, snake_case.
        cls: An `Attack` subclass.

    Returns:
        `cls`, so this can be used as `register("x", MyClass)` inline.

    Raises:
        ValueError: if `name` is taken or not snake_case.
        TypeError: if `cls` is not an `Attack` subclass.
    """
    return ATTACKS.register(name, cls)


__all__ = [
    "ALIE",
    "IPM",
    "AdaptiveAttack",
    "Attack",
    "GaussianNoise",
    "GradientAttack",
    "History",
    "HistoryAttack",
    "LabelFlip",
    "Mimic",
    "MinMax",
    "MinSum",
    "NonFinite",
    "OptimalALIE",
    "OptimalIPM",
    "OptimalLabelFlip",
    "ROP",
    "Scale",
    "SignFlip",
    "UnderAttack",
    "deserialize",
    "get",
    "names",
    "register",
    "serialize",
]
