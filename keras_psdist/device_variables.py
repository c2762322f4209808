"""Bookkeeping variables made directly on a device, ready before first use.

Staging slots on a ps task, a rule's state, compression residuals: variables
keras_psdist keeps for itself, built as plain resource variables (no
strategy's creator, ours included, turns them into placed model variables).

One TensorFlow hazard decides how: a variable created eagerly on a *remote*
device has its initial value written by an op with no outputs, which the
client sends without waiting for it, while a `tf.function` that writes the
variable next travels as another request. With other threads of the process
talking to the same task, the function's write can land first and the
initial value then overwrites it. Measured on TF 2.21 with
`tests/scripts/remote_init_race.py` (two threads running remote functions
alongside, new `[256, 64]` variables written by a function right after they
are made, then read): 13 of 1,700 reads saw the initial zeros; after a wait
for the initial value (`VarIsInitializedOp`, a scalar answer, ordered after
the write), as here: 0 of 1,700. The sync update service met
it as an update that applied 2/3 of a step: a staging slot made at a join
kept its zeros although a gradient had been written into it.

Examples:

>>> import tensorflow as tf
>>> v = device_variable(tf.zeros([2]), "/cpu:0", "example")
>>> v.numpy().tolist()
[0.0, 0.0]
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from keras_psdist._tf import resource_variable_ops


def device_variable(
    initial_value: Any, device: str | None, name: str, **kwargs: Any
) -> tf.Variable:
    """A non-trainable resource variable on `device`, its initial value
    written there before this returns (see the module docstring).

    Args:
        initial_value: The initial value, or a function that makes it. From
            inside a `tf.function`'s trace, pass an eager tensor or a
            function: it runs outside the trace, as the variable is made
            (a tensor made in the trace cannot leave it).
        device: Where it lives; `None`: the current device.
        name: Its name.
        **kwargs: More `ResourceVariable` arguments (`shape=`).
    """
    with tf.init_scope(), tf.device(device):
        if callable(initial_value):
            initial_value = initial_value()
        variable = resource_variable_ops.ResourceVariable(
            tf.convert_to_tensor(initial_value), trainable=False, name=name, **kwargs
        )
        tf.raw_ops.VarIsInitializedOp(resource=variable.handle).numpy()
    return variable
