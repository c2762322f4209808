"""Which optimizers may update a partitioned variable shard by shard.

An update is row-separable when each row of the new variable and slots
depends only on that row of the old ones and of the gradient (plus scalars).
`keras_psdist.variables.shard_updates.update_shards` asks `is_row_separable` of the
optimizer that is updating. Keras's `extended.update(var, fn)` passes a
closure, not the optimizer; `with_optimizer` hands Keras's update step to the
strategy's `optimizer_update` hook instead, which calls `update` with
`optimizer_update_step` and the optimizer as its `optimizer` argument.
`is_row_separable` and `register_row_separable` are
`keras_psdist.partitioners`'s (public there).
"""

from __future__ import annotations

import functools

from absl import logging

from keras_psdist.partitioners import (  # noqa: F401 (the callers' names)
    is_row_separable,
    register_row_separable,
)

_warned: set = set()


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
        "keras_psdist.partitioners.register_row_separable(%s) if its update_step "
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
