"""Config dicts and constructor arguments, checked with errors that name the fix.

Every family that `get()` builds from a config dict, `{"class_name": id,
"config": {...}}` (aggregators, attacks), reads it with `split_config` and
builds through its base class's `from_config`, which calls
`check_arguments`: a malformed dict, an unknown key or a missing argument
is a `ValueError` naming the class, what it accepts and what was received,
never Python's `TypeError` from deep inside a constructor (which names the
class that defines `__init__`: `OrderStatisticsMean` for `Median`).

Examples:

>>> from keras_psdist import aggregators
>>> check_arguments(aggregators.Median, {"num_byzantine": 1})
>>> check_arguments(aggregators.Median, {"num_byzantin": 1})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: Could not build Median from its config: unknown argument 'num_byzantin' (did you mean 'num_byzantine'?). Median accepts: num_byzantine, jit_compile. Received: config={'num_byzantin': 1}. ...
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping
from typing import Any

import numpy as np

_KEYS = ("class_name", "config")


def split_config(config: Any, kind: str, example: str) -> tuple[Any, dict[str, Any]]:
    """Returns `(class_name, arguments)` of a `{"class_name", "config"}` dict.

    Args:
        config: What the user passed.
        kind: The family, for the message: `"aggregator"`, `"attack"`.
        example: A valid config, written out, for the message.

    Raises:
        ValueError: unless `config` is a dict with `class_name`, an optional
            `config` dict of arguments, and no other key.
    """
    if not isinstance(config, Mapping) or "class_name" not in config:
        raise ValueError(
            f"An {kind} config must be a dict with 'class_name' and 'config', "
            f"e.g. {example}. Received: {config!r}"
        )
    unknown = [key for key in config if key not in _KEYS]
    if unknown:
        raise ValueError(
            f"An {kind} config has only the keys 'class_name' and 'config'. "
            f"Received unknown keys {unknown!r} in {config!r}. "
            "Put constructor arguments inside 'config'."
        )
    arguments = config.get("config")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        raise ValueError(
            f"The 'config' of an {kind} config must be a dict of constructor "
            f"arguments, e.g. {example}. Received: config={arguments!r}"
        )
    return config["class_name"], dict(arguments)


def check_arguments(cls: type, config: Mapping[str, Any]) -> None:
    """Raises `ValueError` unless `cls(**config)` binds its arguments.

    Args:
        cls: The class to build.
        config: Keyword arguments for its constructor.

    Raises:
        ValueError: for a key `cls` does not take (naming the closest one it
            does) or an argument it needs that `config` lacks; either way
            listing the arguments `cls` accepts.
    """
    accepted, required, any_keyword = _parameters(cls)
    name = cls.__name__
    unknown = [] if any_keyword else [k for k in config if k not in accepted]
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(str(key), accepted, n=1)
            hints.append(
                f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
            )
        raise ValueError(
            f"Could not build {name} from its config: unknown argument"
            f"{'s' if len(unknown) > 1 else ''} {', '.join(hints)}. {name} "
            f"accepts: {', '.join(accepted) or 'no argument'}. Received: "
            f"config={dict(config)!r}. Remove {'them' if len(unknown) > 1 else 'it'} "
            "or fix the spelling."
        )
    missing = [k for k in required if k not in config]
    if missing:
        raise ValueError(
            f"Could not build {name} from its config: it needs "
            f"{', '.join(map(repr, missing))}. {name} accepts: "
            f"{', '.join(accepted)}. Received: config={dict(config)!r}. Add "
            f"{'them' if len(missing) > 1 else 'it'} to the config."
        )


def check_bool(owner: str, name: str, value: Any) -> bool:
    """Returns `value` as a `bool`; raises `ValueError` unless it is one.

    No truthiness: `"no"` or `0.5` is refused, not taken as `True`.

    Args:
        owner: The class taking the argument, for the message.
        name: The argument's name.
        value: What was received (a `bool` or a NumPy bool).

    Examples:

    >>> check_bool("Median", "jit_compile", False)
    False
    >>> check_bool("Median", "jit_compile", "no")
    Traceback (most recent call last):
    ...
    ValueError: Median's `jit_compile` must be True or False. Received: jit_compile='no' (a str).
    """
    if isinstance(value, bool | np.bool_):
        return bool(value)
    raise ValueError(
        f"{owner}'s `{name}` must be True or False. Received: {name}={value!r} "
        f"(a {type(value).__name__})."
    )


def _parameters(cls: type) -> tuple[list[str], list[str], bool]:
    """`cls`'s keyword arguments, the required ones, and whether it takes
    `**kwargs`."""
    accepted, required, any_keyword = [], [], False
    for p in inspect.signature(cls).parameters.values():
        if p.kind is p.VAR_KEYWORD:
            any_keyword = True
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            accepted.append(p.name)
            if p.default is p.empty:
                required.append(p.name)
    return accepted, required, any_keyword
