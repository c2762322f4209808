"""Deprecated: renamed `keras_psdist.count_rules` in 0.4; removed in 0.5.

"Membership" is who trains in an elastic job (`keras_psdist.cluster.elastic`);
the rules that derive `replicas_to_aggregate` and `num_byzantine` from the
number of workers (`All`, `AllButOne`, `Fraction`, `count`, `get`) are
`keras_psdist.count_rules`'s now. Every name still reads from here, with a
`DeprecationWarning`.
"""

from __future__ import annotations

import warnings
from typing import Any

from keras_psdist import count_rules

_NAMES = ("All", "AllButOne", "CountRule", "Fraction", "count", "get")


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"keras_psdist.membership.{name} is now keras_psdist.count_rules.{name} "
        "(renamed in 0.4: membership is who trains in an elastic job). Import "
        "it from keras_psdist.count_rules; the old name will be removed in 0.5.",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(count_rules, name)


def __dir__() -> list[str]:
    return sorted(_NAMES)
