"""Keras's loop over `steps_per_execution` steps, without a branch around
each step, for a keras_psdist strategy.

Keras's train and test functions (`TensorFlowTrainer._make_function`) run
`steps_per_execution` steps in a `tf.while_loop`. Inside it, each step is the
true branch of a `tf.cond` whose predicate repeats the loop's own condition
(more steps to go, and a batch). On one device the branch costs nothing. On
a cluster TensorFlow splits the step into one graph per task; every task that
runs part of a step (each ps task that applies the update) gets its own copy
of the loop's and the branch's control and receives, each step, the loop's
predicate and the branch's predicate and pivot from the worker. Those are
three remote transfers each step that carry no data; two of them are the
branch's, and the ps serves each one with a thread switch.

`without_step_branch` makes the same loop with the step as the loop's body:
the loop's condition already holds whenever Keras's branch would take its
true side, so the steps run, the batches drawn and the outputs returned are
Keras's. Acts only for a model of a keras_psdist strategy that is traced
(`run_eagerly` False) and does not unroll its loop
(`unrolled_steps_per_execution` 1, Keras's default); every other model gets
Keras's own function.
"""

from __future__ import annotations

import functools

import tensorflow as tf

from keras_psdist.integration.compile_checks import is_ours
from keras_psdist.integration.keras_patches import keras_reduce_per_replica


def _applies(model) -> bool:
    return (
        is_ours(getattr(model, "_distribute_strategy", None))
        and not model.run_eagerly
        and model.steps_per_execution > 1
        and getattr(model, "unrolled_steps_per_execution", 1) == 1
    )


def without_step_branch(make_function):
    """Wraps `TensorFlowTrainer._make_function` (see the module docstring)."""

    @functools.wraps(make_function)
    def _make_function(self, step_function):
        if not _applies(self):
            return make_function(self, step_function)
        return _loop_of_steps(self, step_function)

    return _make_function


def _without_optionals(data):
    """Keras's `_autoconvert_optionals`: an `Optional` in the data is None."""
    return tf.nest.map_structure(
        lambda i: None if isinstance(i, tf.experimental.Optional) else i, data
    )


def _loop_of_steps(model, step_function):
    """Keras 3.15's `_make_function` with the step as the loop's body."""

    @tf.autograph.experimental.do_not_convert
    def one_step_on_data(data):
        outputs = model.distribute_strategy.run(step_function, args=(data,))
        return keras_reduce_per_replica(outputs, model.distribute_strategy)

    one_step_on_data = tf.function(
        one_step_on_data, reduce_retracing=True, jit_compile=model.jit_compile
    )

    @tf.autograph.experimental.do_not_convert
    def multi_step_on_iterator(iterator):
        steps = model.steps_per_execution
        # As Keras: the outputs' spec is known once the body is traced.
        empty_outputs = tf.experimental.Optional.empty(None)

        def cond(execution_step, optional_outputs, next_optional_inputs):
            return tf.logical_and(
                tf.less(execution_step, steps), next_optional_inputs.has_value()
            )

        def body(execution_step, optional_outputs, next_optional_inputs):
            data = _without_optionals(next_optional_inputs.get_value())
            outputs = tf.experimental.Optional.from_value(one_step_on_data(data))
            empty_outputs._element_spec = outputs.element_spec
            return (
                execution_step + 1,
                outputs,
                tf.cond(
                    tf.less(execution_step + 1, steps),
                    iterator.get_next_as_optional,
                    lambda: next_optional_inputs,
                ),
            )

        _, final_optional_outputs, _ = tf.while_loop(
            cond,
            body,
            loop_vars=[
                tf.constant(0),
                empty_outputs,
                iterator.get_next_as_optional(),
            ],
        )
        final_optional_outputs._element_spec = empty_outputs.element_spec
        return final_optional_outputs

    multi_step_on_iterator = tf.function(multi_step_on_iterator, reduce_retracing=True)

    def function(iterator):
        if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
            opt_outputs = multi_step_on_iterator(iterator)
            if not opt_outputs.has_value():
                raise StopIteration
            return opt_outputs.get_value()
        outputs = None
        for _, data in zip(range(model.steps_per_execution), iterator, strict=False):
            outputs = one_step_on_data(_without_optionals(data))
        return outputs

    return function
