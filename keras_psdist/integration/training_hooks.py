"""Where a mode's training meets Keras: the optimizer's apply and `fit`.

A mode that changes how a worker's gradients are applied (its
`keras_psdist.modes.Mode.training` is not None) declares the hooks of
`keras_psdist.modes.Training`. Keras's optimizer applies gradients itself
inside the train step, so `integration.keras_patches` wraps two Keras methods
with this module's `sync_apply` and `sync_fit`, for models and optimizers of
such a run only (everything else is untouched):

| method            | in such a run                                          |
|-------------------|--------------------------------------------------------|
| `Optimizer.apply` | `Training.worker_apply`; it is handed Keras's own      |
|                   | apply (a sync-replica worker pushes and waits; the     |
|                   | chief's update service calls Keras's apply)            |
| `Model.fit`       | runs inside `Training.session(model)`, with a callback |
|                   | that calls `before_step` and `progress` around each    |
|                   | step (and stops a straggler's fit when told to)        |

Sync replicas (`sync.training.SyncTraining`) and bounded staleness
(`sync.staleness.BoundedStaleness`) are the two such trainings: the one
pushes and waits, the other applies only fresh gradients and holds a worker
that is too far ahead before each step.
"""

from __future__ import annotations

import functools
import inspect

import keras


def sync_training_of(strategy):
    """The strategy's `keras_psdist.modes.Training` (its mode's part in the
    training, `extended.services.training`), else `None` (another
    strategy's, or none)."""
    services = getattr(getattr(strategy, "extended", None), "services", None)
    return getattr(services, "training", None)


def sync_apply(apply):
    """Wraps `Optimizer.apply`: a sync-replica (or bounded-staleness) worker
    hands its gradients to `worker_apply`."""

    @functools.wraps(apply)
    def wrapper(self, grads, trainable_variables=None):
        training = sync_training_of(getattr(self, "_distribution_strategy", None))
        if training is None:
            return apply(self, grads, trainable_variables)
        if trainable_variables is None:
            trainable_variables = self._trainable_variables
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
            self.built = True
        return training.worker_apply(
            self, functools.partial(apply, self), list(grads), trainable_variables
        )

    return wrapper


def sync_fit(fit):
    """Wraps `Model.fit`: a sync-replica run trains inside its session."""
    signature = inspect.signature(fit)

    @functools.wraps(fit)
    def wrapper(self, *args, **kwargs):
        training = sync_training_of(getattr(self, "distribute_strategy", None))
        if training is None:
            return fit(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        callbacks = list(bound.arguments.get("callbacks") or [])
        bound.arguments["callbacks"] = [_Progress(training), *callbacks]
        with training.session(self):
            return fit(*bound.args, **bound.kwargs)

    return wrapper


class _Progress(keras.callbacks.Callback):
    """Tells the protocol when a step starts and when it has finished, and
    how many of the fit's steps have run."""

    def __init__(self, training):
        super().__init__()
        self._training = training
        self._first_epoch = None
        self._run = 0  # steps of this fit run so far
        self._run_before_epoch = 0

    def on_train_begin(self, logs=None):
        steps = self.params.get("steps")
        if steps is not None:
            self._training.check_steps(steps * self.params.get("epochs", 1))

    def on_epoch_begin(self, epoch, logs=None):
        if self._first_epoch is None:
            self._first_epoch = epoch  # `initial_epoch`
        self._run_before_epoch = self._run

    def on_train_batch_begin(self, batch, logs=None):
        self._training.before_step()

    def on_train_batch_end(self, batch, logs=None):
        # `batch` is the epoch's last step index run (several with
        # steps_per_execution > 1).
        self._run = self._run_before_epoch + batch + 1
        steps = self.params.get("steps")
        planned = (
            None
            if steps is None
            else steps * (self.params.get("epochs", 1) - (self._first_epoch or 0))
        )
        if self._training.progress(self._run, planned):
            self.model.stop_training = True
