"""Running across processes on TensorFlow's own gRPC runtime.

`config` parses and checks TF_CONFIG (without importing TensorFlow), `server`
runs one task's `tf.distribute.Server` (`keras-psdist serve`), and `launcher`
starts a whole cluster on this machine (`keras-psdist launch`); `mode_names`
holds the names of the execution modes and the one rule that reads them
(`PSStrategy(mode=...)`, `launch --mode`, `keras_psdist.modes`); `elastic`
keeps who trains in an async job whose workers join and leave
(`max_workers`, imported on use: it needs TensorFlow). No transport
of our own: tasks talk through TensorFlow's runtime. None of them imports
TensorFlow at import time (`serve` does when it starts the server), so the
command line answers a bad TF_CONFIG, or `--help`, at once.

Examples:

>>> from keras_psdist import cluster
>>> config = cluster.from_tf_config(
...     {"cluster": {"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]},
...      "task": {"type": "ps", "index": 0}})
>>> config.task_name, config.device("ps", 0)
('ps:0', '/job:ps/replica:0/task:0/device:CPU:0')
"""

from keras_psdist.cluster.config import (
    JOB_NAMES,
    ClusterConfig,
    from_environment,
    from_resolver,
    from_tf_config,
    is_evaluator,
)
from keras_psdist.cluster.launcher import launch
from keras_psdist.cluster.ports import check_port_free, pick_free_ports, wait_reachable
from keras_psdist.cluster.server import serve
from keras_psdist.errors import PortInUseError

__all__ = [
    "JOB_NAMES",
    "ClusterConfig",
    "PortInUseError",
    "check_port_free",
    "from_environment",
    "from_resolver",
    "from_tf_config",
    "is_evaluator",
    "launch",
    "pick_free_ports",
    "serve",
    "wait_reachable",
]
