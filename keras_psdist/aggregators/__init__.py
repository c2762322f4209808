"""Aggregation rules, looked up the Keras way.

Each rule's string id is written once, in `keras_psdist.families.AGGREGATORS`
(the rule reads it back as `Rule.name`); `get`, `serialize`, `deserialize`,
`names` and `register` are that registry's.

Examples:

>>> from keras_psdist import aggregators
>>> aggregators.get("mean")
Mean()
>>> aggregators.deserialize(aggregators.serialize(aggregators.Mean()))
Mean()
>>> Krum.name
'krum'
"""

from __future__ import annotations

from typing import Any

from keras_psdist.aggregators.arc import ARC
from keras_psdist.aggregators.base import Aggregation, Aggregator
from keras_psdist.aggregators.bucketing import Bucketing
from keras_psdist.aggregators.bulyan import Bulyan
from keras_psdist.aggregators.centered_clipping import (
    CenteredClipping,
    CenteredClippingState,
)
from keras_psdist.aggregators.clipping import Clipping
from keras_psdist.aggregators.geometric_median import GeometricMedian
from keras_psdist.aggregators.krum import Krum, MultiKrum
from keras_psdist.aggregators.mean import Mean
from keras_psdist.aggregators.median import Median
from keras_psdist.aggregators.nnm import NearestNeighborMixing
from keras_psdist.aggregators.trimmed_mean import TrimmedMean
from keras_psdist.families import AGGREGATORS


def get(identifier: str | dict[str, Any] | Aggregator) -> Aggregator:
    """Returns an aggregator from a string id, a config dict or an instance.

    Raises:
        ValueError: for an unknown id, naming the valid ones, or a config
            dict the rule cannot be built from, naming what it accepts.
    """
    return AGGREGATORS.get(identifier)


def serialize(aggregator: Aggregator) -> dict[str, Any]:
    """Returns `{"class_name": id, "config": {...}}` for `aggregator`.

    Raises:
        ValueError: if its class is not registered.
    """
    return AGGREGATORS.serialize(aggregator)


def deserialize(config: dict[str, Any]) -> Aggregator:
    """Inverse of `serialize`.

    Raises:
        ValueError: for a malformed config, an unknown `class_name` (naming
            the valid ones) or an argument the class does not take (naming
            the ones it does).
    """
    return AGGREGATORS.deserialize(config)


def names() -> list[str]:
    """The registered string ids."""
    return AGGREGATORS.names()


def register(name: str, cls: type[Aggregator]) -> type[Aggregator]:
    """Registers a user aggregator class under `name`, so `get(name)` finds it.

    Args:
        name: The string id, snake_case.
        cls: An `Aggregator` subclass.

    Returns:
        `cls`, so this can be used as `register("x", MyClass)` inline.

    Raises:
        ValueError: if `name` is taken or not snake_case.
        TypeError: if `cls` is not an `Aggregator` subclass.
    """
    return AGGREGATORS.register(name, cls)


__all__ = [
    "ARC",
    "Aggregation",
    "Aggregator",
    "Bucketing",
    "Bulyan",
    "CenteredClipping",
    "CenteredClippingState",
    "Clipping",
    "GeometricMedian",
    "Krum",
    "Mean",
    "Median",
    "MultiKrum",
    "NearestNeighborMixing",
    "TrimmedMean",
    "deserialize",
    "get",
    "names",
    "register",
    "serialize",
]
