"""Every private TensorFlow import keras_psdist needs, in one place.

A custom `tf.distribute.Strategy` cannot be written against the public API
alone: the base classes, the replica-thread runner and the input pipeline live
in `tensorflow.python.distribute`. Keeping them here means a TensorFlow upgrade
touches one module, and the supported ranges declared in `setup.cfg`
(`tensorflow>=2.19,<2.22`, `keras>=3.10,<3.16`) are checked at import time
below.
"""

import tensorflow as tf
from tensorflow.python.data.experimental.ops import distribute as data_distribute
from tensorflow.python.distribute import (
    collective_util,
    cross_device_utils,
    device_util,
    distribute_lib,
    distribute_utils,
    input_lib,
    mirrored_run,
    numpy_dataset,
    ps_values,
    reduce_util,
    values,
    values_util,
)
from tensorflow.python.distribute import cross_device_ops as cross_device_ops_lib
from tensorflow.python.distribute.v1 import input_lib as input_lib_v1
from tensorflow.python.eager import context, lift_to_graph, record
from tensorflow.python.eager import tape as tape_lib
from tensorflow.python.framework import (
    composite_tensor,
    composite_tensor_gradient,
    tensor_conversion_registry,
)
from tensorflow.python.ops import (
    control_flow_util,
    embedding_ops,
    handle_data_util,
    resource_variable_ops,
)
from tensorflow.python.util import dispatch, nest

# The supported range, as in setup.cfg: [low, high) by (major, minor).
# The pairs tested are in `noxfile.py` (`.ci/run` runs the oldest).
SUPPORTED_TF = ((2, 19), (2, 22))
SUPPORTED_KERAS = ((3, 10), (3, 16))


def _check_version(package: str, version: str, supported) -> None:
    major_minor = tuple(int(p) for p in version.split(".")[:2])
    (low, high) = supported
    if not low <= major_minor < high:
        raise ImportError(
            f"keras_psdist supports {package} >={low[0]}.{low[1]},<{high[0]}."
            f"{high[1]} (it builds on TensorFlow's private distribute modules "
            f"and wraps some Keras internals). Received: {package}=={version}. "
            'Install a supported version, e.g. `pip install "keras-psdist[cpu]"`.'
        )


def _check_versions() -> None:
    import keras

    _check_version("tensorflow", tf.__version__, SUPPORTED_TF)
    _check_version("keras", keras.__version__, SUPPORTED_KERAS)


_check_versions()


def without_thread_spinning() -> None:
    """Has the thread pools made from this process's eager context from now
    on sleep when they run out of work, instead of spinning first.

    Sets `ConfigProto.experimental.disable_thread_spinning` in the context's
    base config (`Context._config`; `tf.config` has no setter for it). The
    config is copied into the `ServerDef` that
    `tf.config.experimental_connect_to_cluster` sends to every remote task,
    whose eager context for this client builds its pool ("tf_Compute") from
    it: a ps task's pool then stops spinning between the bursts of a step
    (`keras_psdist.cluster.runtime` calls it before connecting; measured in
    docs/benchmarks.md, "The ps task's threads and the optimizer's step
    counter"). The pools this process already made keep spinning.
    """
    ctx = context.context()
    config = tf.compat.v1.ConfigProto()
    if ctx._config is not None:
        config.CopyFrom(ctx._config)
    config.experimental.disable_thread_spinning = True
    ctx._config = config


__all__ = [
    "collective_util",
    "composite_tensor",
    "composite_tensor_gradient",
    "context",
    "control_flow_util",
    "cross_device_ops_lib",
    "cross_device_utils",
    "data_distribute",
    "device_util",
    "dispatch",
    "distribute_lib",
    "distribute_utils",
    "embedding_ops",
    "handle_data_util",
    "input_lib",
    "input_lib_v1",
    "lift_to_graph",
    "mirrored_run",
    "nest",
    "numpy_dataset",
    "ps_values",
    "record",
    "reduce_util",
    "resource_variable_ops",
    "tape_lib",
    "tensor_conversion_registry",
    "values",
    "values_util",
    "without_thread_spinning",
]
