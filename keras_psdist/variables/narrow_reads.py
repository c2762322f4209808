"""Reads across the network in a narrower dtype: `PSStrategy(read_dtype=...)`.

Every step, each replica reads the variables it computes with from their
parameter devices. On one host that is a copy in memory; across tasks it is
the other half of the traffic on every ps link, beside the gradients (which
`compression=` shrinks). With `read_dtype="bfloat16"` (or `"float16"`), a
float32 variable on another task is cast on its own device and crosses the
network at half the bytes; the replica casts it back and computes in float32
as before.

- Only reads in a replica's step that cross tasks (the variable's job, task
  or replica differs from the reading device's) are narrowed: on one host
  nothing changes, and every read outside a replica's step (the optimizer's
  update on the parameter device, `get_weights`, checkpoints) is exact.
- The variables themselves stay float32, and so does the update: the
  gradient a replica computes is passed back through the cast unchanged
  (not rounded to the narrow dtype), as Keras's mixed precision keeps float32
  master weights.
- A replica computes with the variable rounded to the narrow dtype: bfloat16
  keeps 8 bits of mantissa (a relative error up to 2^-9 per weight), float16
  11 bits but a smaller range (weights beyond 65504 become inf; weights of
  ordinary models are far from it). See docs/compression.md for its cost in
  accuracy and what it saves on a link.
- Dense reads of variables on a parameter device are narrowed; the rows a
  partitioned or row-routed table sends (`keras_psdist.partitioners`) and
  variables replicated on the workers (`dense="all_reduce"`) are not.

Examples:

>>> check_read_dtype("bfloat16")
tf.bfloat16
>>> crosses_tasks("/job:ps/replica:0/task:0/device:CPU:0",
...               "/job:worker/replica:0/task:1/device:CPU:0")
True
>>> crosses_tasks("/job:localhost/replica:0/task:0/device:CPU:3",
...               "/job:localhost/replica:0/task:0/device:CPU:0")
False
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from keras_psdist._tf import device_util, distribute_lib

# The dtypes a read may travel in, by the names `read_dtype=` takes.
READ_DTYPES = ("bfloat16", "float16")


def check_read_dtype(value: Any) -> tf.DType | None:
    """`read_dtype=` as a `tf.DType` (`None` for none).

    Raises:
        ValueError: for anything but `None`, `"bfloat16"` or `"float16"` (as
            a string or a `tf.DType`), naming the choices.
    """
    if value is None:
        return None
    try:
        dtype = tf.as_dtype(value)
    except TypeError:
        dtype = None
    if dtype is None or dtype.name not in READ_DTYPES:
        raise ValueError(
            f"read_dtype must be None (reads travel as the variables are), "
            f"'bfloat16' or 'float16' (float32 variables cross the network at "
            f"half the bytes). Received: read_dtype={value!r}."
        )
    return dtype


def _task(device: str) -> tuple[Any, Any, Any]:
    spec = tf.DeviceSpec.from_string(device)
    return (spec.job, spec.replica, spec.task)


def crosses_tasks(variable_device: str, reading_device: str | None) -> bool:
    """Whether a read of a variable on `variable_device` from
    `reading_device` crosses tasks (a different job, replica or task): a
    network transfer. An unknown reading device counts as not crossing."""
    if not reading_device or not variable_device:
        return False
    return _task(variable_device) != _task(reading_device)


def reads_across_tasks(variable: Any) -> bool:
    """Whether a read of the parameter-device `variable` (a `PSVariable`)
    here and now is a replica's read of a float32 variable on another task:
    in a replica's step of its strategy (not in cross-replica context or an
    update), from another task. Such reads may be narrowed (`read_dtype`) or
    read by their change (`keras_psdist.variables.delta_reads`)."""
    if variable.dtype != tf.float32:
        return False
    if distribute_lib.in_cross_replica_context():
        return False
    if distribute_lib.get_update_replica_id() is not None:
        return False
    return crosses_tasks(variable.device, device_util.current())


def narrowed_read(variable: tf.Variable, dtype: tf.DType) -> tf.Tensor:
    """`variable`'s value, cast to `dtype` on its own device and back to its
    dtype on the current one; the gradient passes through unchanged."""
    value = variable.value()

    @tf.custom_gradient
    def narrowed(x):
        with tf.device(variable.device):
            narrow = tf.cast(x, dtype)
        wide = tf.cast(narrow, x.dtype)

        def grad(upstream):
            return upstream

        return wide, grad

    return narrowed(value)
