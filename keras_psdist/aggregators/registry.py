"""The string ids of the aggregation rules: `get`, `register`, `serialize`.

The built-in rules are registered by `keras_psdist.aggregators` when it is
imported; rules that wrap another (bucketing, nearest-neighbour mixing,
clipping, ARC) look their inner rule up here.
"""

from __future__ import annotations

from typing import Any

from keras_psdist.aggregators.base import Aggregator
from keras_psdist.aggregators.configs import split_config

_REGISTRY: dict[str, type[Aggregator]] = {}


def register(name: str, cls: type[Aggregator]) -> type[Aggregator]:
    """Registers a user rule under `name` so `get(name)` finds it.

    Args:
        name: The string id, snake_case.
        cls: An `Aggregator` subclass.

    Returns:
        `cls`, so this can be used as `register("x", MyRule)` inline.
    """
    if not (isinstance(cls, type) and issubclass(cls, Aggregator)):
        raise TypeError(f"`cls` must be an Aggregator subclass. Received: cls={cls!r}")
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise ValueError(
            f"An aggregator named {name!r} is already registered "
            f"({_REGISTRY[name].__name__}). Pick another name."
        )
    _REGISTRY[name] = cls
    return cls


def names() -> list[str]:
    """The registered string ids."""
    return list(_REGISTRY)


def serialize(aggregator: Aggregator) -> dict[str, Any]:
    """Returns `{"class_name": id, "config": {...}}` for `aggregator`."""
    for name, cls in _REGISTRY.items():
        if type(aggregator) is cls:
            return {"class_name": name, "config": aggregator.get_config()}
    raise ValueError(
        f"{type(aggregator).__name__} is not registered. Call "
        "`keras_psdist.aggregators.register(name, cls)` first."
    )


def deserialize(config: dict[str, Any]) -> Aggregator:
    """Inverse of `serialize`.

    Raises:
        ValueError: for a malformed config, an unknown `class_name` (naming
            the valid ones) or an argument the rule does not take (naming
            the ones it does).
    """
    name, arguments = split_config(
        config,
        "aggregator",
        "{'class_name': 'trimmed_mean', 'config': {'num_byzantine': 1}}",
    )
    return _lookup(name).from_config(arguments)


def get(identifier: str | dict[str, Any] | Aggregator) -> Aggregator:
    """Returns an aggregator from a string id, a config dict or an instance.

    Raises:
        ValueError: for an unknown id, naming the valid ones, or a config
            dict the rule cannot be built from, naming what it accepts.
    """
    if isinstance(identifier, Aggregator):
        return identifier
    if isinstance(identifier, str):
        return _lookup(identifier)()
    if isinstance(identifier, dict):
        return deserialize(identifier)
    if isinstance(identifier, type) and issubclass(identifier, Aggregator):
        raise ValueError(
            f"Received the class {identifier.__name__}, not an aggregator: "
            f"instantiate it, e.g. aggregator={identifier.__name__}(), or pass "
            f"its id, aggregator={identifier.name!r}."
        )
    raise ValueError(
        "Could not interpret aggregator identifier. Expected a string, a "
        f"config dict or an Aggregator. Received: {identifier!r}"
    )


def _lookup(name: Any) -> type[Aggregator]:
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        by_class = {cls.__name__: id_ for id_, cls in _REGISTRY.items()}
        hint = (
            f" {name!r} is the class of {by_class[name]!r}: pass that id."
            if isinstance(name, str) and name in by_class
            else ""
        )
        raise ValueError(
            f"Unknown aggregator {name!r}. Expected one of: "
            f"{', '.join(_REGISTRY)}.{hint}"
        ) from None
