"""Keras's row lookups, read where the rows live (`routed_take`).

The TF backend's `ops.take(table, ids, axis=0)` (what `Embedding.call` runs)
first reads the *whole* table, then gathers. `keras_patches` wraps it with
`routed_take`, for variables of a keras_psdist strategy only: the rows are
gathered on the parameter device, or on each shard that owns some of them,
and only the touched rows travel to the replica. What this means for users,
and which optimizers update shard by shard, is in `keras_psdist.partitioners`.
"""

from __future__ import annotations

import functools

import keras
import tensorflow as tf

from keras_psdist.variables.partitioned import PartitionedVariable
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
