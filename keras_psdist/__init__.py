"""keras_psdist: parameter-server, sync-replica and Byzantine-tolerant
distribution strategies for Keras 3 on TensorFlow.

Examples:

>>> import keras_psdist as kpd
>>> strategy = kpd.PSStrategy()
>>> strategy.num_replicas_in_sync >= 1
True
"""

from keras_psdist import (
    aggregators,
    attacks,
    callbacks,
    partitioners,
    placement,
    routing,
)
from keras_psdist.strategy import PSStrategy
from keras_psdist.sync.strategy import SyncReplicaStrategy

__version__ = "0.1.0"

__all__ = [
    "PSStrategy",
    "SyncReplicaStrategy",
    "__version__",
    "aggregators",
    "attacks",
    "callbacks",
    "partitioners",
    "placement",
    "routing",
]
