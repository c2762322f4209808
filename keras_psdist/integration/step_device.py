"""The wrapper that calls Keras's train and test functions on the
strategy's step device.

Keras's train function (`TensorFlowTrainer._make_function`) is a loop of
`steps_per_execution` steps, each checking whether the data has ended; it is
called from the client process. In-graph across a cluster the client is the
chief, which holds no replica and no variable: every op of that loop (its
counter, its predicates, the `Optional` of each step's batches) would run on
the chief, and every step would send the predicates to each worker and ps
and the batches through the chief, about 4 CPU-ms per step on the chief for
one worker and 11 for four (docs/benchmarks.md). Called under
`tf.device(strategy.extended.step_device)` (the first worker's host), those
ops run beside the replicas and the chief only starts each call, as
TensorFlow's `ClusterCoordinator` runs a function on a worker.

Only for a keras_psdist strategy whose `extended.step_device` is set, and a
model that is not `run_eagerly` (each eager op would be a remote call);
every other model's function is Keras's own.
"""

from __future__ import annotations

import functools

import tensorflow as tf


def step_device_of(model) -> str | None:
    """The device the model's step functions are called on, else `None`."""
    if getattr(model, "run_eagerly", False):
        return None
    strategy = getattr(model, "_distribute_strategy", None)
    return getattr(getattr(strategy, "extended", None), "step_device", None)


def on_step_device(make_function):
    """Wraps `TensorFlowTrainer._make_function`: the function it makes is
    called on the strategy's step device (see the module docstring)."""

    @functools.wraps(make_function)
    def _make_function(self, step_function):
        function = make_function(self, step_function)
        device = step_device_of(self)
        if device is None:
            return function

        @functools.wraps(function)
        def called_on_step_device(iterator):
            with tf.device(device):
                return function(iterator)

        return called_on_step_device

    return _make_function
