"""Simulated Byzantine attacks, for evaluating robust aggregation rules.

An attack names the replicas it controls (`replicas=[6, 7]`) and what they
do: gradient attacks (`SignFlip`, `Scale`, `GaussianNoise`, `NonFinite`,
`ALIE`, `IPM`, `Mimic`) replace those replicas' gradients before
aggregation; adaptive attacks (`OptimalALIE`, `OptimalIPM`) do too, tuned
each step against the rule in use; data attacks (`LabelFlip`) corrupt their
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

from keras_psdist.aggregators.configs import split_config
from keras_psdist.attacks.adaptive import OptimalALIE, OptimalIPM
from keras_psdist.attacks.base import AdaptiveAttack, Attack, GradientAttack
from keras_psdist.attacks.crafted import ALIE, IPM, Mimic
from keras_psdist.attacks.data import LabelFlip
from keras_psdist.attacks.gradient import GaussianNoise, NonFinite, Scale, SignFlip
from keras_psdist.attacks.harness import UnderAttack

_REGISTRY: dict[str, type[Attack]] = {
    "sign_flip": SignFlip,
    "scale": Scale,
    "gaussian_noise": GaussianNoise,
    "non_finite": NonFinite,
    "alie": ALIE,
    "ipm": IPM,
    "optimal_alie": OptimalALIE,
    "optimal_ipm": OptimalIPM,
    "mimic": Mimic,
    "label_flip": LabelFlip,
}


def names() -> list[str]:
    """The registered string ids."""
    return list(_REGISTRY)


def serialize(attack: Attack) -> dict[str, Any]:
    """Returns `{"class_name": id, "config": {...}}` for `attack`.

    Raises:
        ValueError: if `attack` is not of a registered class.
    """
    for name, cls in _REGISTRY.items():
        if type(attack) is cls:
            return {"class_name": name, "config": attack.get_config()}
    raise ValueError(
        f"Cannot serialize {attack!r}: its class is not one of the registered "
        f"attacks ({', '.join(_REGISTRY)})."
    )


def deserialize(config: dict[str, Any]) -> Attack:
    """Inverse of `serialize`.

    Raises:
        ValueError: for a malformed config, an unknown `class_name` or an
            argument the attack does not take (naming the ones it does).
    """
    name, arguments = split_config(
        config, "attack", "{'class_name': 'sign_flip', 'config': {'replicas': [7]}}"
    )
    return _lookup(name).from_config(arguments)


def get(identifier: dict[str, Any] | Attack | None) -> Attack | None:
    """Returns an attack from a config dict or an instance (`None` stays `None`).

    Args:
        identifier: An `Attack`, a config dict as `serialize` makes, or
            `None` for no attack.

    Raises:
        ValueError: for a string id (an attack needs its replicas), an
            unknown id (naming the valid ones) or anything else.
    """
    if identifier is None or isinstance(identifier, Attack):
        return identifier
    if isinstance(identifier, dict):
        return deserialize(identifier)
    if isinstance(identifier, str):
        _lookup(identifier)
        raise ValueError(
            f"An attack needs the replicas it controls, so a bare id is not "
            f"enough. Pass a config dict, e.g. {{'class_name': "
            f"{identifier!r}, 'config': {{'replicas': [7]}}}}, or an instance. "
            f"Received: {identifier!r}"
        )
    if isinstance(identifier, type) and issubclass(identifier, Attack):
        raise ValueError(
            f"Received the class {identifier.__name__}, not an attack: "
            f"instantiate it with the replicas it controls, e.g. "
            f"attack={identifier.__name__}(replicas=[7])."
        )
    raise ValueError(
        "Could not interpret attack identifier. Expected an Attack, a config "
        f"dict or None. Received: {identifier!r}"
    )


def _lookup(name: Any) -> type[Attack]:
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"Unknown attack {name!r}. Expected one of: {', '.join(_REGISTRY)}."
        ) from None


__all__ = [
    "ALIE",
    "IPM",
    "AdaptiveAttack",
    "Attack",
    "GaussianNoise",
    "GradientAttack",
    "LabelFlip",
    "Mimic",
    "NonFinite",
    "OptimalALIE",
    "OptimalIPM",
    "Scale",
    "SignFlip",
    "UnderAttack",
    "deserialize",
    "get",
    "names",
    "serialize",
]
