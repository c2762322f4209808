"""Every private TensorFlow import keras_psdist needs, in one place.

A custom `tf.distribute.Strategy` cannot be written against the public API
alone: the base classes, the replica-thread runner and the input pipeline live
in `tensorflow.python.distribute`. Keeping them here means a TensorFlow upgrade
touches one module, and the supported range pinned in `setup.cfg`
(`tensorflow>=2.21,<2.22`) is checked at import time below.
"""

import tensorflow as tf
from tensorflow.python.data.experimental.ops import distribute as data_distribute
from tensorflow.python.distribute import cross_device_ops as cross_device_ops_lib
from tensorflow.python.distribute import (
    device_util,
    distribute_lib,
    distribute_utils,
    input_lib,
    input_util,
    mirrored_run,
    numpy_dataset,
    ps_values,
    reduce_util,
    values,
)
from tensorflow.python.distribute.v1 import input_lib as input_lib_v1
from tensorflow.python.eager import context
from tensorflow.python.framework import (
    composite_tensor,
    composite_tensor_gradient,
    tensor_conversion_registry,
)
from tensorflow.python.ops import (
    embedding_ops,
    handle_data_util,
    resource_variable_ops,
)
from tensorflow.python.util import dispatch, nest

SUPPORTED_TF = ((2, 21), (2, 22))


def _check_tf_version() -> None:
    major_minor = tuple(int(p) for p in tf.__version__.split(".")[:2])
    low, high = SUPPORTED_TF
    if not low <= major_minor < high:
        raise ImportError(
            f"keras_psdist supports TensorFlow >={low[0]}.{low[1]},<{high[0]}."
            f"{high[1]} (it builds on TensorFlow's private distribute modules). "
            f"Received: tensorflow=={tf.__version__}. Install a supported "
            'version, e.g. `pip install "keras-psdist[cpu]"`.'
        )


_check_tf_version()

__all__ = [
    "composite_tensor",
    "composite_tensor_gradient",
    "context",
    "cross_device_ops_lib",
    "data_distribute",
    "device_util",
    "dispatch",
    "distribute_lib",
    "distribute_utils",
    "embedding_ops",
    "handle_data_util",
    "input_lib",
    "input_lib_v1",
    "input_util",
    "mirrored_run",
    "nest",
    "numpy_dataset",
    "ps_values",
    "reduce_util",
    "resource_variable_ops",
    "tensor_conversion_registry",
    "values",
]
