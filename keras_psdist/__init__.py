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
    from keras_psdist import (  # noqa: F401
        aggregators,
        attacks,
        callbacks,
        cluster,
        compression,
        dense_choice,
        errors,
        evaluator,
        heterogeneity,
        membership,
        partitioners,
        placement,
        routing,
    )
    from keras_psdist.evaluator import SidecarEvaluator  # noqa: F401
    from keras_psdist.strategies.ps import PSStrategy  # noqa: F401
    from keras_psdist.strategies.sync_replica import SyncReplicaStrategy  # noqa: F401

__version__ = "0.3.0"

__all__ = [
    "PSStrategy",
    "SidecarEvaluator",
    "SyncReplicaStrategy",
    "__version__",
    "aggregators",
    "attacks",
    "callbacks",
    "compression",
    "dense_choice",
    "errors",
    "evaluator",
    "heterogeneity",
    "membership",
    "partitioners",
    "placement",
    "routing",
]

# Public name -> the module that defines it.
_ATTRIBUTES = {
    "PSStrategy": "keras_psdist.strategies.ps",
    "SidecarEvaluator": "keras_psdist.evaluator",
    "SyncReplicaStrategy": "keras_psdist.strategies.sync_replica",
}

_SUBMODULES = (
    "aggregators",
    "attacks",
    "callbacks",
    "cluster",
    "compression",
    "dense_choice",
    "errors",
    "evaluator",
    "heterogeneity",
    "membership",
    "partitioners",
    "placement",
    "routing",
    "synchronization",  # deprecated: renamed dense_choice in 0.2
)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        # Importing a submodule also sets it as this package's attribute.
        return importlib.import_module(f"{__name__}.{name}")
    if name in _ATTRIBUTES:
        value = getattr(importlib.import_module(_ATTRIBUTES[name]), name)
        globals()[name] = value  # Later look-ups skip this function.
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_ATTRIBUTES, *_SUBMODULES})
