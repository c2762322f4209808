"""Gradient compression: what a replica sends instead of its gradient.

Pass one as a strategy's `compression=` (an id, a config dict or an
instance), or write it first in a configuration string,
`"top_k(ratio=0.01)>trimmed_mean"` (`keras_psdist.spelling`). Each replica
compresses its gradient on its own device; the reduction device
decompresses before the rest of the gradient path (the attack, the
pre-aggregations and the rule). See docs/compression.md.

    base.py       `Compressor`: compress (replica) / decompress (reduction
                  device), error feedback
    casts.py      `none`, `fp16`, `bf16`: stateless casts
    top_k.py      `top_k`: the largest coordinates, error feedback
    random_k.py   `random_k`: the same random coordinates on every replica,
                  error feedback
    sign.py       `sign`: scaled sign, one bit a coordinate, error feedback
    power_sgd.py  `power_sgd`: rank-r factors per replica, error feedback,
                  warm start

Examples:

>>> from keras_psdist import compression
>>> compression.names()
['none', 'fp16', 'bf16', 'top_k', 'random_k', 'sign', 'power_sgd']
>>> compression.get("top_k")
TopK(ratio=0.01)
>>> compression.serialize(compression.RandomK(ratio=0.1, seed=3))
{'class_name': 'random_k', 'config': {'ratio': 0.1, 'seed': 3}}
>>> compression.get({"class_name": "top_k", "config": {"ratio": 2}})
Traceback (most recent call last):
...
ValueError: The `ratio` of top_k must be a number in (0, 1]: the fraction of each gradient's coordinates a replica sends (0.01 sends 1%). Received: ratio=2
"""

from __future__ import annotations

from typing import Any

from keras_psdist import spelling
from keras_psdist.compression.base import Compressor
from keras_psdist.compression.casts import BF16, FP16, NoCompression
from keras_psdist.compression.power_sgd import PowerSGD
from keras_psdist.compression.random_k import RandomK
from keras_psdist.compression.sign import Sign
from keras_psdist.compression.top_k import TopK
from keras_psdist.families import COMPRESSORS


def get(identifier: str | dict[str, Any] | Compressor | None) -> Compressor | None:
    """Returns a compressor from a string, a config dict or an instance.

    Args:
        identifier: An id (`"top_k"`, built with its defaults), an id with
            arguments (`"top_k(ratio=0.05)"`, as in a configuration string),
            a config dict, a `Compressor`, or `None` (no compression, which
            stays `None`).

    Raises:
        ValueError: for an unknown id (naming the valid ones), a config the
            class cannot be built from (naming what it accepts), or a bad
            argument (a ratio outside (0, 1]); each says what it received.
    """
    if identifier is None:
        return None
    if isinstance(identifier, str):
        identifier = spelling.parse_compression(identifier)
    return COMPRESSORS.get(identifier)


def serialize(compressor: Compressor) -> dict[str, Any]:
    """Returns `{"class_name": id, "config": {...}}` for `compressor`.

    Raises:
        ValueError: if its class is not registered.
    """
    return COMPRESSORS.serialize(compressor)


def deserialize(config: dict[str, Any]) -> Compressor:
    """Inverse of `serialize`.

    Raises:
        ValueError: for a malformed config, an unknown `class_name` (naming
            the valid ones) or an argument the class does not take (naming
            the ones it does).
    """
    return COMPRESSORS.deserialize(config)


def names() -> list[str]:
    """The registered string ids."""
    return COMPRESSORS.names()


def register(name: str, cls: type[Compressor]) -> type[Compressor]:
    """Registers a user compressor class under `name`, so `get(name)` finds it.

    Args:
        name: The string id, snake_case.
        cls: A `Compressor` subclass.

    Returns:
        `cls`, so this can be used as `register("x", MyClass)` inline.

    Raises:
        ValueError: if `name` is taken or not snake_case.
        TypeError: if `cls` is not a `Compressor` subclass.
    """
    return COMPRESSORS.register(name, cls)


__all__ = [
    "BF16",
    "FP16",
    "Compressor",
    "NoCompression",
    "PowerSGD",
    "RandomK",
    "Sign",
    "TopK",
    "deserialize",
    "get",
    "names",
    "register",
    "serialize",
]
