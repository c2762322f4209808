"""How Keras's row lookups and optimizer updates reach parameter devices.

Two Keras internals decide what crosses the network each step, and
`keras_integration` wraps both with this module's `routed_take` and
`with_optimizer`, for variables of a keras_psdist strategy only
(every other call is passed through untouched):

| Keras does | keras_psdist does |
|---|---|
| `ops.take(table, ids, axis=0)` (`Embedding.call`): the TF backend first reads the *whole* table, then gathers | gathers the rows where they live: on the parameter device, or on each shard that owns some of them; only the touched rows travel to the replica |
| `optimizer.update_step(g, v, lr)` inside `extended.update` | once per shard of a partitioned `v`, on the shard's device, with the shard's rows of `g` and of every slot, when the optimizer's update is row-separable; else once, on the whole variable |

An update is row-separable when each row of the new variable and slots
depends only on that row of the old ones and of the gradient (plus scalars):
true of SGD, Adam, AdamW, RMSprop, Adagrad, Adadelta, Adamax, Nadam, Ftrl,
Lion and ScheduleFreeAdamW. Adafactor (factored moments), Lamb (whole-tensor
trust ratio) and Muon (orthogonalises whole matrices) are not: for them a
partitioned variable is gathered and updated whole, which is exact but moves
the variable each step (a warning says so once). A custom optimizer whose
`update_step` is elementwise can say so with `register_row_separable`.

Examples:

>>> import keras
>>> is_row_separable(keras.optimizers.Adam())
True
>>> is_row_separable(keras.optimizers.Lamb())
False
"""

from __future__ import annotations

import contextlib
import functools
import threading

import tensorflow as tf
from absl import logging

_state = threading.local()
_row_separable_updates: set = set()
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
    import keras

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
    if not _row_separable_updates:
        _register_keras_builtins()
    return type(optimizer).update_step in _row_separable_updates


def updating_optimizer():
    """The optimizer whose `update_step` this thread is running, or None."""
    return getattr(_state, "optimizer", None)


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


@contextlib.contextmanager
def _updating(optimizer):
    previous = updating_optimizer()
    _state.optimizer = optimizer
    try:
        yield
    finally:
        _state.optimizer = previous


def with_optimizer(update_step):
    """Wraps `TFOptimizer._distributed_tf_update_step`: `extended.update`
    learns which optimizer updates (see `_updating`)."""

    # `_distributed_tf_update_step` runs in cross-replica context (or, inside
    # a replica's `cond`, in the replica's thread) and calls
    # `extended.update` for each variable in the same thread.
    @functools.wraps(update_step)
    def wrapper(self, distribution, grads_and_vars, learning_rate):
        with _updating(self):
            return update_step(self, distribution, grads_and_vars, learning_rate)

    return wrapper


def routed_take(take):
    """Wraps the TF backend's `take`: rows of a keras_psdist variable are
    gathered where they live."""

    @functools.wraps(take)
    def routed(x, indices, axis=None):
        variable = placed_variable_of(x)
        if (
            variable is None
            or axis is None
            or not variable.shape.rank
            or axis not in (0, -variable.shape.rank)
            or isinstance(indices, tf.SparseTensor)
        ):
            return take(x, indices, axis=axis)
        out = gather_rows(variable, indices)
        autocast = getattr(x, "_maybe_autocast", None)
        return autocast(out) if autocast is not None else out

    return routed


def gather_rows(variable, indices):
    """Rows `indices` of `variable`, read where they live.

    Negative indices count from the end, as in Keras's `take`; ragged
    indices keep their row partitions.
    """
    rows = variable.shape[0]
    if isinstance(indices, tf.RaggedTensor):
        flat = _non_negative(indices.flat_values, rows)
        return indices.with_flat_values(variable.sparse_read(flat))
    indices = tf.convert_to_tensor(indices)
    return variable.sparse_read(_non_negative(indices, rows))


def _non_negative(indices, rows):
    return tf.where(indices < 0, indices + tf.cast(rows, indices.dtype), indices)


def placed_variable_of(x):
    """The keras_psdist variable behind `x` (a Keras variable or itself),
    or None for anything else."""
    import keras

    from keras_psdist.partitioned import PartitionedVariable
    from keras_psdist.variables import PSVariable

    value = x._value if isinstance(x, keras.Variable) else x
    if isinstance(value, PartitionedVariable):
        return value
    if isinstance(value, PSVariable):
        return value.get()
    return None
