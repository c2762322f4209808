"""How Keras's row lookups and optimizer updates reach parameter devices.

Two Keras internals decide what crosses the network each step, and
`keras_psdist.integration.keras_patches` wraps both, with `routed_take` here and
`row_separable.with_optimizer`, for variables of a keras_psdist strategy only
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

import functools

import keras
import tensorflow as tf

from keras_psdist.variables.partitioned import PartitionedVariable
from keras_psdist.variables.row_separable import (  # noqa: F401 (public here)
    is_row_separable,
    register_row_separable,
)
from keras_psdist.variables.values import PSVariable


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
    value = x._value if isinstance(x, keras.Variable) else x
    if isinstance(value, PartitionedVariable):
        return value
    if isinstance(value, PSVariable):
        return value.get()
    return None
