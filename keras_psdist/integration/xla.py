"""`compile(jit_compile=True)`: each replica's forward and backward pass
compiled with XLA on its own compute device.

Keras compiles a whole step with XLA: `tf.function(jit_compile=True)` around
`strategy.run(train_step)`. The replicas, the gradient reduction, the
optimizer update and every variable read then form one XLA cluster on one
device, which fails as soon as a variable lives on another device ("Trying to
access resource ... located in device CPU:1 from device CPU:0", under
MirroredStrategy too). An XLA cluster cannot read a variable of another
device, nor call `merge_call`.

So, under a keras_psdist strategy, Keras traces its step without XLA, and
Keras's own train and test steps are cut where the JAX backend cuts them
(`Model.stateless_call`, `Model.stateless_compute_loss`): only the pure part,
which takes the variables' values as tensors, is compiled.

    in each replica, on its compute device           parameter devices
    -----------------------------------------------  --------------------
    read every variable (outside XLA)       <------  variables, slots
    XLA: forward, loss (scaled), backward;
         the new values of non-trainable state
         (BatchNormalization's statistics, seeds)
         and of the metrics the loss updates
    assign the state that changed           ------>  (plain arithmetic)
    optimizer.apply_gradients               ------>  aggregator, update
    loss tracker, compiled metrics (outside XLA)

The gradient reduction (`_batch_reduce_to`, any aggregator) and the update
(`_update`, shard by shard for a partitioned variable) run where they run
without XLA. In between-graph and sync-replica runs each worker process
compiles its own replicas' passes the same way; what its optimizer step then
does (apply to the ps, or send to the chief) is unchanged.

`predict` compiles Keras's own `predict_step` the same way: the forward pass
(`Model.stateless_call`, `training=False`) on each replica's device, the
variables read outside XLA. Keras builds its predict function without XLA
and calls `predict_step` when that function is first traced, so the
compiled forward pass is swapped in there (`compiled_predict_step`).

A model that overrides `train_step` or `test_step` is refused at `compile`
(`check_supported`): its step cannot be cut automatically. A model that
overrides `predict_step` predicts without XLA (a `super().predict_step` call
in it is compiled).
"""

from __future__ import annotations

import contextlib
import functools
import weakref

import keras
import tensorflow as tf


def check_supported(model, strategy) -> None:
    """Raises a `ValueError` (with the fix) for a set-up that cannot compile
    per replica: a custom `train_step` or `test_step`."""
    kind = type(strategy).__name__
    for step in ("train_step", "test_step"):
        if getattr(type(model), step) is not getattr(keras.Model, step):
            raise ValueError(
                f"compile(jit_compile=True) under {kind} compiles Keras's own "
                f"train and test steps replica by replica, but "
                f"{type(model).__name__} overrides `{step}`: its optimizer "
                "step must run outside XLA (the gradient reduction and the "
                "update run on the parameter devices), and a custom step "
                "cannot be cut there automatically. Leave jit_compile out, or "
                "compile the pure part of your step yourself: a "
                "`tf.function(jit_compile=True)` that takes the variables' "
                "values (`model.stateless_call`) and returns the gradients, "
                "called before `optimizer.apply_gradients` (see "
                "docs/user_guide.md, XLA)."
            )


def _wants_xla(model) -> bool:
    from keras_psdist.distribute.extended import PSExtended

    strategy = getattr(model, "_distribute_strategy", None)
    if not isinstance(getattr(strategy, "extended", None), PSExtended):
        return False
    return not model.run_eagerly and model.jit_compile is True


@contextlib.contextmanager
def _keras_jit_off(model):
    """Keras builds its step functions without XLA; `model.jit_compile`
    still reads True outside (XLA is on, per replica)."""
    before = model._jit_compile
    model._jit_compile = False
    try:
        yield
    finally:
        model._jit_compile = before


def compiled_per_replica(make_function):
    """Wraps `TensorFlowTrainer._make_function` (train and test functions)."""

    @functools.wraps(make_function)
    def _make_function(self, step_function):
        if not _wants_xla(self):
            return make_function(self, step_function)
        check_supported(self, self._distribute_strategy)
        step = getattr(step_function, "__func__", None)
        if step is keras.Model.train_step and self.trainable_weights:
            step_function = _train_step(self)
        elif step is keras.Model.test_step:
            step_function = _test_step(self)
        with _keras_jit_off(self):
            return make_function(self, step_function)

    return _make_function


def predict_without_xla(make_predict_function):
    """Wraps `TensorFlowTrainer.make_predict_function`: built without XLA
    (the forward pass is compiled per replica by `compiled_predict_step`)."""

    @functools.wraps(make_predict_function)
    def make_predict(self, *args, **kwargs):
        if not _wants_xla(self):
            return make_predict_function(self, *args, **kwargs)
        with _keras_jit_off(self):
            return make_predict_function(self, *args, **kwargs)

    return make_predict


# ------------------------------------------------------------------ steps


class _State:
    """The model's variables, read outside XLA, and the writes of those the
    compiled part changed."""

    def __init__(self, model):
        self.trainable = list(model.trainable_variables)
        self.non_trainable = list(model.non_trainable_variables)
        self.metrics = list(model.metrics_variables)

    def values(self):
        read = [
            [tf.convert_to_tensor(v.value) for v in vs]
            for vs in (self.trainable, self.non_trainable, self.metrics)
        ]
        return tuple(read)

    def assign(self, changed_non_trainable, changed_metrics):
        """Assigns, in replica context, the values the compiled part changed
        (dicts of index: value): the strategy combines them as it combines
        Keras's own writes from replicas."""
        for variables, changed in (
            (self.non_trainable, changed_non_trainable),
            (self.metrics, changed_metrics),
        ):
            for i, value in changed.items():
                variables[i].assign(value)


def _changed(new, old) -> dict[int, tf.Tensor]:
    """The values that the stateless scope replaced (by index): an unchanged
    variable's value is the very tensor passed in."""
    return {i: n for i, (n, o) in enumerate(zip(new, old, strict=True)) if n is not o}


def _forward(model, trainable, non_trainable, metrics, x, y, sample_weight, training):
    """Keras's forward pass and loss, stateless (as its JAX trainer's
    `compute_loss_and_updates`)."""
    kwargs = {"training": training} if model._call_has_training_arg else {}
    y_pred, new_non_trainable, losses = model.stateless_call(
        trainable, non_trainable, x, return_losses=True, **kwargs
    )
    if losses:
        # The forward pass's losses (activity regularizers, `add_loss`),
        # seen by `compute_loss` as the JAX trainer shows them.
        model._losses_override.clear()
        model._losses_override = losses
    try:
        loss, (_, new_non_trainable, new_metrics) = model.stateless_compute_loss(
            trainable,
            new_non_trainable,
            metrics,
            x=x,
            y=y,
            y_pred=y_pred,
            sample_weight=sample_weight,
            training=training,
        )
    finally:
        if losses:
            model._losses_override.clear()
    changes = (
        _changed(new_non_trainable, non_trainable),
        _changed(new_metrics, metrics),
    )
    return y_pred, loss, changes


def _batch_size(x):
    return tf.shape(next(i for i in tf.nest.flatten(x) if i is not None))[0]


def _record(model, state, changes, loss, x):
    """After the compiled part: writes the state it changed and tracks the
    loss, as Keras's own steps do."""
    state.assign(*changes)
    # Keras divides each replica's loss by the replica count
    # (`scale_loss_for_distribution`); its tracker logs the undivided loss.
    n = tf.distribute.get_strategy().num_replicas_in_sync
    tracked = loss * tf.cast(n, loss.dtype) if n > 1 else loss
    model._loss_tracker.update_state(tracked, sample_weight=_batch_size(x))


def _train_step(model):
    """Keras's `train_step`, its forward and backward pass compiled."""

    def forward_backward(trainable, non_trainable, metrics, x, y, sw, scale):
        with tf.GradientTape() as tape:
            tape.watch(trainable)
            y_pred, loss, changes = _forward(
                model, trainable, non_trainable, metrics, x, y, sw, training=True
            )
            scaled = loss * tf.cast(scale, loss.dtype)
        return tape.gradient(scaled, trainable), loss, y_pred, changes

    compiled = tf.function(forward_backward, jit_compile=True, reduce_retracing=True)

    def train_step(data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        state = _State(model)
        # The optimizer's loss scale (LossScaleOptimizer, loss_scale_factor),
        # read here: `scale_loss` multiplies the loss by it.
        scale = tf.convert_to_tensor(
            model.optimizer.scale_loss(tf.constant(1.0)), tf.float32
        )
        grads, loss, y_pred, changes = compiled(
            *state.values(), x, y, sample_weight, scale
        )
        _record(model, state, changes, loss, x)
        model.optimizer.apply_gradients(zip(grads, state.trainable, strict=True))
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    return train_step


def _test_step(model):
    """Keras's `test_step`, its forward pass compiled."""

    def forward(trainable, non_trainable, metrics, x, y, sw):
        y_pred, loss, changes = _forward(
            model, trainable, non_trainable, metrics, x, y, sw, training=False
        )
        return loss, y_pred, changes

    compiled = tf.function(forward, jit_compile=True, reduce_retracing=True)

    def test_step(data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        state = _State(model)
        loss, y_pred, changes = compiled(*state.values(), x, y, sample_weight)
        _record(model, state, changes, loss, x)
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    return test_step


def compiled_predict_step(predict_step):
    """Wraps `TensorFlowTrainer.predict_step`: while Keras traces its predict
    function for a model under a keras_psdist strategy with
    `jit_compile=True`, the forward pass is compiled on the replica's
    device; otherwise (eagerly, other strategies, no XLA) Keras's own."""

    @functools.wraps(predict_step)
    def step(self, data):
        if not (_wants_xla(self) and tf.inside_function()):
            return predict_step(self, data)
        # One compiled forward pass per model, shared by its replicas (as
        # `_train_step`'s is): each replica's call places it on its device.
        if self not in _compiled_predict_steps:
            _compiled_predict_steps[self] = _predict_step(self)
        return _compiled_predict_steps[self](data)

    return step


# model -> its compiled `predict_step` (`_predict_step`), made the first time
# a predict function of the model is traced with XLA.
_compiled_predict_steps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _predict_step(model):
    """Keras's `predict_step`, its forward pass compiled."""

    def forward(trainable, non_trainable, x):
        kwargs = {"training": False} if model._call_has_training_arg else {}
        y_pred, new_non_trainable = model.stateless_call(
            trainable, non_trainable, x, **kwargs
        )
        return y_pred, _changed(new_non_trainable, non_trainable)

    compiled = tf.function(forward, jit_compile=True, reduce_retracing=True)

    def predict_step(data):
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        state = _State(model)
        trainable, non_trainable, _ = state.values()
        y_pred, changed = compiled(trainable, non_trainable, x)
        state.assign(changed, {})
        return y_pred

    return predict_step
