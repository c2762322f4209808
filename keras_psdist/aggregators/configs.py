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

from typing import Any

import numpy as np

from keras_psdist.registry import check_arguments, split_config

__all__ = ["check_arguments", "check_bool", "split_config"]


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
