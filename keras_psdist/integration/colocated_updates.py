"""Keras's `assign_add` and `assign_sub`, computed where the variable lives.

A Keras variable's `assign_add(value)` is `assign(self + value)`: the read
and the addition run on the device of the caller's scope, and the sum goes
back. For a variable on a ps task, read from a worker, that is two
transfers for one write: the optimizer's `iterations.assign_add(1)` made a
round trip from the ps to the worker and back in every step (found in the
partition graphs of an async step, issue 54 §3; each transfer costs the
ps's CPU about as much as the update of a variable). `keras_patches` wraps
both methods with `where_it_lives`, for variables of a keras_psdist
strategy only: the read and the arithmetic run on the variable's device, so
only `value` travels, when it is a tensor of the caller's. The result is
the same sum, written the same way (`assign`, through the strategy).

Examples:

>>> import keras, tensorflow as tf
>>> import keras_psdist as kpd
>>> cpus = tf.config.list_logical_devices("CPU")
>>> strategy = kpd.PSStrategy(devices=[cpus[0].name])
>>> with strategy.scope():
...     counter = keras.Variable(0, dtype="int64", trainable=False)
>>> _ = counter.assign_add(2)
>>> int(counter.numpy())
2
"""

from __future__ import annotations

import functools

import tensorflow as tf

from keras_psdist.integration.routed_take import placed_variable_of
from keras_psdist.variables.values import PSVariable


def where_it_lives(assign_op):
    """Wraps `Variable.assign_add` or `assign_sub` of Keras's TF backend: a
    keras_psdist variable stored whole in one place computes its new value
    there; every other variable runs Keras's method."""

    @functools.wraps(assign_op)
    def colocated(self, value):
        inner = getattr(self, "_value", None)
        if not isinstance(inner, PSVariable):
            return assign_op(self, value)
        with tf.device(placed_variable_of(self).device):
            return assign_op(self, value)

    return colocated
