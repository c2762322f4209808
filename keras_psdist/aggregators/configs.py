"""Constructor arguments the aggregators share, checked with errors that name
the fix.

Config dicts (`{"class_name": id, "config": {...}}`) are read by
`keras_psdist.registry` (`split_config`, and `check_arguments` in
`Aggregator.from_config`), as for every family; what is left here is the
check of a flag argument, `check_bool`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["check_bool"]


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
