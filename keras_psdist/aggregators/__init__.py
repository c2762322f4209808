"""Aggregation rules, looked up the Keras way.

Each rule's string id is written once, in `keras_psdist.families.AGGREGATORS`
(the rule reads it back as `Rule.name`); `serialize`, `deserialize`,
`names` and `register` are that registry's. `get` also reads a configuration
of pre-aggregations before a rule, `"nnm>trimmed_mean"`, with arguments,
`"bucketing(bucket_size=4)>median"` (`keras_psdist.spelling`), and `spell`
writes one.

Examples:

>>> from keras_psdist import aggregators
>>> aggregators.get("mean")
Mean()
>>> aggregators.deserialize(aggregators.serialize(aggregators.Mean()))
Mean()
>>> aggregators.Krum.name
'krum'
>>> rule = aggregators.get("nnm>trimmed_mean(num_byzantine=1)")
>>> type(rule).__name__, type(rule.aggregator).__name__
('NearestNeighborMixing', 'TrimmedMean')
>>> aggregators.spell(aggregators.get("arc>geometric_median"))
'arc>geometric_median'
"""

from __future__ import annotations

import inspect
from typing import Any

from keras_psdist import spelling
from keras_psdist.aggregators.arc import ARC
from keras_psdist.aggregators.base import Aggregation, Aggregator
from keras_psdist.aggregators.bucketing import Bucketing
from keras_psdist.aggregators.bulyan import Bulyan
from keras_psdist.aggregators.caf import CAF
from keras_psdist.aggregators.centered_clipping import (
    CenteredClipping,
    CenteredClippingState,
)
from keras_psdist.aggregators.clipping import Clipping
from keras_psdist.aggregators.geometric_median import GeometricMedian
from keras_psdist.aggregators.krum import Krum, MultiKrum
from keras_psdist.aggregators.mda import MinimumDiameterAveraging
from keras_psdist.aggregators.meamed import MeanAroundMedian
from keras_psdist.aggregators.mean import Mean
from keras_psdist.aggregators.median import Median
from keras_psdist.aggregators.monna import MoNNA
from keras_psdist.aggregators.nnm import NearestNeighborMixing
from keras_psdist.aggregators.smea import SMEA
from keras_psdist.aggregators.trimmed_mean import TrimmedMean
from keras_psdist.families import AGGREGATORS


def get(identifier: str | dict[str, Any] | Aggregator) -> Aggregator:
    """Returns an aggregator from a string, a config dict or an instance.

    Args:
        identifier: A string id (`"median"`), a configuration
            (`"nnm>arc>median"`, see `keras_psdist.spelling`), a config
            dict or an `Aggregator`.

    Raises:
        ValueError: for an unknown id, naming the valid ones where it
            stands; a rule before a pre-aggregation (the rule goes last); a
            config dict the rule cannot be built from, naming what it
            accepts; or a `+wm` suffix or a compressor first (worker
            momentum and compression are the strategy's).
    """
    if spelling.is_spelled(identifier):
        identifier = spelling.aggregator_only(identifier)
    return AGGREGATORS.get(identifier)


def spell(aggregator: Aggregator) -> str:
    """Writes `aggregator` as a configuration string that `get` reads back.

    Arguments equal to the class's defaults are left out:
    `NearestNeighborMixing(aggregator=Median())` is `"nnm>median"`.

    Raises:
        ValueError: if its class (or an inner rule's) is not registered.
    """
    if isinstance(aggregator, str | dict):
        aggregator = get(aggregator)  # a string or config: written as `get` reads it
    return spelling.spell_config(_without_defaults(serialize(aggregator)))


def _without_defaults(config: dict[str, Any]) -> dict[str, Any]:
    cls = AGGREGATORS.lookup(config["class_name"])
    defaults = {
        name: p.default
        for name, p in inspect.signature(cls).parameters.items()
        if p.default is not p.empty
    }
    arguments = {}
    for key, value in (config.get("config") or {}).items():
        if isinstance(value, dict) and "class_name" in value:
            arguments[key] = _without_defaults(value)
        elif key not in defaults or defaults[key] != value:
            arguments[key] = value
    inner = arguments.get("aggregator")
    if isinstance(inner, dict) and "num_byzantine" in arguments:
        # A pre-aggregation takes its rule's f: say it once, on the rule.
        if (inner.get("config") or {}).get("num_byzantine") == arguments[
            "num_byzantine"
        ]:
            del arguments["num_byzantine"]
    return {"class_name": config["class_name"], "config": arguments}


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
    "CAF",
    "CenteredClipping",
    "CenteredClippingState",
    "Clipping",
    "GeometricMedian",
    "Krum",
    "Mean",
    "MeanAroundMedian",
    "Median",
    "MinimumDiameterAveraging",
    "MoNNA",
    "MultiKrum",
    "NearestNeighborMixing",
    "SMEA",
    "TrimmedMean",
    "deserialize",
    "get",
    "names",
    "register",
    "serialize",
    "spell",
]
