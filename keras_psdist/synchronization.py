"""Deprecated: renamed `keras_psdist.dense_choice` in 0.2; removed in 0.5.

The module chooses which trainable variables are replicated
(`PSStrategy(dense=...)`); it has nothing to do with `keras_psdist.sync`, so
it is named for what it does. Every name still reads from here, with a
`DeprecationWarning`; import it from `keras_psdist.dense_choice`.
"""

from __future__ import annotations

import warnings
from typing import Any

from keras_psdist import dense_choice


def __getattr__(name: str) -> Any:
    value = getattr(dense_choice, name)  # AttributeError for an unknown name
    warnings.warn(
        f"keras_psdist.synchronization is now keras_psdist.dense_choice (it "
        f"picks the dense= choice; renamed in 0.2). Import {name} from "
        "keras_psdist.dense_choice; the old name will be removed in 0.5.",
        DeprecationWarning,
        stacklevel=2,
    )
    return value


def __dir__() -> list[str]:
    return sorted(n for n in dir(dense_choice) if not n.startswith("_"))
