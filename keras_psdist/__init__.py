"""keras_psdist: parameter-server, sync-replica and Byzantine-tolerant
distribution strategies for Keras 3 on TensorFlow.

Examples:

>>> import keras_psdist as kpd
>>> strategy = kpd.PSStrategy()
>>> strategy.num_replicas_in_sync >= 1
True
"""

# The public names load on first use (PEP 562), not here: `import
# keras_psdist` would otherwise import TensorFlow (seconds), and so would
# everything under the package, the `keras-psdist` command line included,
# which must answer `--help` or reject a bad TF_CONFIG at once, and set
# TensorFlow's environment before TensorFlow loads.

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # For type checkers and IDEs; at run time, `__getattr__`.
    # The same names as `_PUBLIC` (tests/test_layout.py checks they agree).
    from keras_psdist import (  # noqa: F401
        aggregators,
        attacks,
        callbacks,
        cluster,
        compression,
        count_rules,
        dense_choice,
        errors,
        evaluator,
        heterogeneity,
        partitioners,
        placement,
        spelling,
    )
    from keras_psdist.evaluator import SidecarEvaluator  # noqa: F401
    from keras_psdist.planning.planner import plan  # noqa: F401
    from keras_psdist.strategies.ps import PSStrategy  # noqa: F401
    from keras_psdist.strategies.sync_replica import SyncReplicaStrategy  # noqa: F401

__version__ = "0.3.0"

# The public surface, in one table: each public name -> the module it comes
# from (a submodule's own path: the name is the module). `__all__`, `dir()`
# and `__getattr__` are derived from it.
_PUBLIC = {
    "PSStrategy": "keras_psdist.strategies.ps",
    "SidecarEvaluator": "keras_psdist.evaluator",
    "SyncReplicaStrategy": "keras_psdist.strategies.sync_replica",
    "plan": "keras_psdist.planning.planner",
    **{
        name: f"keras_psdist.{name}"
        for name in (
            "aggregators",
            "attacks",
            "callbacks",
            "cluster",
            "compression",
            "count_rules",
            "dense_choice",
            "errors",
            "evaluator",
            "heterogeneity",
            "partitioners",
            "placement",
            "spelling",
        )
    },
}

# Old names that still import, with a warning, until the version given.
_DEPRECATED = {
    "membership": "0.5",  # renamed count_rules in 0.4
    "routing": "0.5",  # folded into partitioners in 0.4
    "synchronization": "0.5",  # renamed dense_choice in 0.2
}

__all__ = ["__version__", *sorted(_PUBLIC)]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None and name in _DEPRECATED:
        module = f"{__name__}.{name}"
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if module == f"{__name__}.{name}":
        # Importing a submodule also sets it as this package's attribute.
        return importlib.import_module(module)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # Later look-ups skip this function.
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
