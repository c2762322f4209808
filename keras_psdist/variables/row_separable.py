"""Which optimizers may update a partitioned variable shard by shard.

An update is row-separable when each row of the new variable and slots
depends only on that row of the old ones and of the gradient (plus scalars).
`keras_psdist.variables.shard_updates.update_shards` asks `is_row_separable` of the
optimizer that is updating. Keras's `extended.update(var, fn)` passes a
closure, not the optimizer; `with_optimizer` hands Keras's update step to the
strategy's `optimizer_update` hook instead, which calls `update` with
`optimizer_update_step` and the optimizer as its `optimizer` argument. The
public names are also in `keras_psdist.routing`.
"""

from __future__ import annotations

import functools

from absl import logging

_row_separable_updates: set = set()
_builtins_registered = False
_warned: set = set()


def register_row_separable(optimizer_class: type) -> type:
    """Declares `optimizer_class.update_step` row-separable (see module doc).

    Partitioned variables are then updated shard by shard, where each shard
    lives, by this optimizer. Usable as a class decorator.

    Args:
        optimizer_class: A `keras.optimizers.Optimizer` subclass.

    Returns:
        `optimizer_class`.

    Raises:
        ValueError: if it is not a Keras optimizer class.

    Examples:

    >>> import keras
    >>> @register_row_separable
    ... class SignSGD(keras.optimizers.Optimizer):
    ...     def update_step(self, gradient, variable, learning_rate):
    ...         variable.assign_sub(learning_rate * keras.ops.sign(gradient))
    >>> is_row_separable(SignSGD(learning_rate=0.1))
    True
    """
    import keras

    if not (
        isinstance(optimizer_class, type)
        and issubclass(optimizer_class, keras.optimizers.Optimizer)
    ):
        raise ValueError(
            "register_row_separable expects a keras.optimizers.Optimizer "
            f"subclass. Received: {optimizer_class!r}."
        )
    _row_separable_updates.add(optimizer_class.update_step)
    return optimizer_class


def _register_keras_builtins() -> None:
    global _builtins_registered
    import keras

    _builtins_registered = True
    for name in (
        "SGD",
        "Adam",
        "AdamW",
        "RMSprop",
        "Adagrad",
        "Adadelta",
        "Adamax",
        "Nadam",
        "Ftrl",
        "Lion",
        "ScheduleFreeAdamW",
    ):
        optimizer_class = getattr(keras.optimizers, name, None)
        if optimizer_class is not None:
            register_row_separable(optimizer_class)


def is_row_separable(optimizer) -> bool:
    """Whether `optimizer`'s `update_step` may run shard by shard.

    Decided by the function, not the class name: a subclass that keeps a
    registered `update_step` (a new learning-rate schedule, say) is
    separable; one that overrides it is not, until registered.
    """
    # Not "while the set is empty": a user's class registered first (before
    # any optimizer was asked about) must not keep Keras's own out.
    if not _builtins_registered:
        _register_keras_builtins()
    return type(optimizer).update_step in _row_separable_updates


def optimizer_update_step(var, grad, learning_rate, *, optimizer):
    """Keras's per-variable update of `var`, with the optimizer an argument.

    The function a strategy's `optimizer_update` hook hands to
    `extended.update`, so the update of a partitioned variable can ask
    `is_row_separable(optimizer)`.
    """
    return optimizer.update_step(grad, var, learning_rate)


def warn_whole_update(optimizer, variable_name: str) -> None:
    """Says once per optimizer class that partitioned variables move whole."""
    key = type(optimizer).__name__
    if key in _warned:
        return
    _warned.add(key)
    logging.warning(
        "%s's update is not row-separable, so partitioned variables (first: "
        "%r) are gathered and updated whole on their first shard's device "
        "each step. The result is exact, but the variable crosses the "
        "network. Use an elementwise optimizer (SGD, Adam, AdamW, RMSprop, "
        "Adagrad, ...) to update each shard where it lives, or "
        "keras_psdist.routing.register_row_separable(%s) if its update_step "
        "is elementwise.",
        key,
        variable_name,
        key,
    )


def with_optimizer(update_step):
    """Wraps `TFOptimizer._distributed_tf_update_step`: a strategy whose
    extended has an `optimizer_update(optimizer, grads_and_vars,
    learning_rate)` hook runs the update step itself, knowing the optimizer;
    every other strategy runs Keras's."""

    @functools.wraps(update_step)
    def wrapper(self, distribution, grads_and_vars, learning_rate):
        hook = getattr(distribution.extended, "optimizer_update", None)
        if hook is None:
            return update_step(self, distribution, grads_and_vars, learning_rate)
        return hook(self, grads_and_vars, learning_rate)

    return wrapper
