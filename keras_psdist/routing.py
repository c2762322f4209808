"""Deprecated: folded into `keras_psdist.partitioners` in 0.4; removed in 0.5.

`is_row_separable` and `register_row_separable` (which optimizers update a
partitioned variable shard by shard) are `keras_psdist.partitioners`'s now.
Every name still reads from here, with a `DeprecationWarning`.
"""

from __future__ import annotations

import warnings
from typing import Any

from keras_psdist import partitioners

_NAMES = ("is_row_separable", "register_row_separable")


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"keras_psdist.routing.{name} is now keras_psdist.partitioners.{name} "
        "(folded into partitioners in 0.4). Import it from "
        "keras_psdist.partitioners; the old name will be removed in 0.5.",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(partitioners, name)


def __dir__() -> list[str]:
    return sorted(_NAMES)
