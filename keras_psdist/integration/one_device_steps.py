"""Steps one device runs, run the same under a keras_psdist strategy.

Two places where Keras, under any `tf.distribute` strategy, departs from what
it does without one, in patterns a user keeps when swapping one line:

| pattern                                    | Keras under a strategy            |
|--------------------------------------------|-----------------------------------|
| `fit` of a model with no `call` of its own | builds it symbolically first and  |
| (keras-io's GAN: a `train_step` over two   | raises "Unable to automatically   |
| sub-models), built when the step is traced | build the model" (MirroredStrategy|
|                                            | too); one device builds it in the |
|                                            | traced step                       |
| a loss computed outside `strategy.run`,    | divides it by the replica count,  |
| under the scope (a training loop from      | though nothing sums it over       |
| scratch)                                   | replicas: the gradient is 1/n     |

`built_when_traced` wraps `TensorFlowTrainer._maybe_symbolic_build`: when the
symbolic build cannot run the model, the model is built where one device
builds it, in the traced step (a keras_psdist strategy creates variables
there, `PSExtended._create_variable`). `scaled_in_replicas_only` wraps
Keras's `scale_loss_for_distribution` and its inverse: they scale only in a
replica (inside `strategy.run`, where the replicas' gradients are summed).
Both act only under a keras_psdist strategy.
"""

from __future__ import annotations

import functools

import tensorflow as tf

from keras_psdist.integration.compile_checks import is_ours


def built_when_traced(maybe_symbolic_build):
    """Wraps `TensorFlowTrainer._maybe_symbolic_build` (see module doc)."""

    @functools.wraps(maybe_symbolic_build)
    def wrapper(self, *args, **kwargs):
        if not is_ours(getattr(self, "_distribute_strategy", None)):
            return maybe_symbolic_build(self, *args, **kwargs)
        try:
            return maybe_symbolic_build(self, *args, **kwargs)
        except RuntimeError as e:
            # Keras's "Unable to automatically build the model" (its own
            # errors of bad input are ValueErrors, and pass): what the
            # symbolic build could not do, the traced step does, as without
            # a strategy. A real error in the model surfaces there.
            if "Unable to automatically build" not in str(e):
                raise
            return None

    return wrapper


def scaled_in_replicas_only(scale):
    """Wraps Keras's `scale_loss_for_distribution` (or its inverse): the
    identity outside a replica of a keras_psdist strategy."""

    @functools.wraps(scale)
    def wrapper(value):
        if tf.distribute.in_cross_replica_context() and is_ours(
            tf.distribute.get_strategy()
        ):
            return value
        return scale(value)

    return wrapper
