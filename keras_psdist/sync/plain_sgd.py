"""Plain SGD in one kernel per variable, for the sync service's updates.

Keras's `SGD` without momentum writes `variable - learning_rate * gradient`
as two ops, a multiply and a subtract: the product makes a temporary as large
as the variable, and each op makes its own pass over memory.
TensorFlow's `ResourceApplyGradientDescent` (what TF1's
`GradientDescentOptimizer` and so `SyncReplicasOptimizer` run) does the same
arithmetic in one pass. On the ps, every sync update waits for it: with one
worker, every step does.

`apply(optimizer, grads, variables)` takes that path when it gives the same
result as the optimizer's own `apply` (the same two roundings, bit for bit:
TensorFlow's kernel computes `var -= grad * lr` elementwise, with no fused
multiply-add) and says so; otherwise it does nothing and returns `False`, and
the caller runs Keras's `apply`. The same result means: exactly
`keras.optimizers.SGD` (not a subclass), no momentum, no weight decay, no
moving average, no gradient accumulation, no loss scale, no clipping, no
variable constraint, and every gradient dense, of every variable, each a
single resource variable.

Examples:

>>> import keras, tensorflow as tf
>>> optimizer = keras.optimizers.SGD(learning_rate=0.5)
>>> w = keras.Variable([1.0, 2.0])
>>> optimizer.build([w])
>>> apply(optimizer, [tf.constant([2.0, 2.0])], [w])
True
>>> w.numpy().tolist(), int(optimizer.iterations.numpy())
([0.0, 1.0], 1)
>>> apply(keras.optimizers.SGD(momentum=0.9), [tf.constant([2.0, 2.0])], [w])
False
"""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_psdist.sync import service


def fusable(optimizer, grads, variables) -> bool:
    """Whether `apply` would give exactly the optimizer's own update."""
    if type(optimizer) is not keras.optimizers.SGD:
        return False
    # `getattr`: an older Keras may lack a setting (then it is not set).
    settings = (
        "momentum",
        "nesterov",
        "weight_decay",
        "use_ema",
        "gradient_accumulation_steps",
        "loss_scale_factor",
        "clipnorm",
        "clipvalue",
        "global_clipnorm",
    )
    if any(getattr(optimizer, name, None) for name in settings):
        return False
    if len(grads) != len(variables):
        return False
    for grad, variable in zip(grads, variables, strict=True):
        if not isinstance(grad, tf.Tensor):
            return False  # None, IndexedSlices, a payload
        if getattr(variable, "constraint", None) is not None:
            return False
        if getattr(variable, "overwrite_with_gradient", False):
            return False
        if _resource(variable) is None:
            return False
    return True


def apply(optimizer, grads, variables) -> bool:
    """`optimizer.apply(grads, variables)` in one kernel per variable, if
    `fusable`; returns whether it did (in a trace: whether it added the
    ops)."""
    if not fusable(optimizer, grads, variables):
        return False
    learning_rate = optimizer.learning_rate  # a schedule's value now
    for grad, variable in zip(grads, variables, strict=True):
        resource = _resource(variable)
        with tf.device(resource.device):
            tf.raw_ops.ResourceApplyGradientDescent(
                var=resource.handle,
                alpha=tf.cast(learning_rate, resource.dtype),
                delta=tf.cast(grad, resource.dtype),
            )
    optimizer.iterations.assign_add(1)
    return True


def _resource(variable):
    """The one resource variable behind a model variable, or None (split
    into shards or copies, or of a kind not known here)."""
    parts = service.resource_variables([variable])
    if len(parts) != 1 or not isinstance(parts[0], tf.Variable):
        return None
    return parts[0]
