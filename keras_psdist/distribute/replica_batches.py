"""The replicas' batches of one step: their shares, and stand-ins for empty ones.

A global batch smaller than the replica count (the last partial batch of an
epoch, or a tiny batch) leaves some replicas without data. Running a model on
an empty batch is not safe: TensorFlow 2.21's oneDNN `MaxPoolGrad` aborts the
whole process on one (tensorflow/tensorflow#126128), and other kernels may
too. So no replica does: one without data runs the step on a stand-in, the
first example of a replica that has data, and everything it contributes
weighs 0:

- its gradient and its statistics (BatchNormalization) are left out of the
  weighted mean (`PSExtended._combine_list`, `aggregators.base.weighted_sum`),
- its metric updates (`SUM` writes: totals and counts) are left out,
- outputs with a leading dimension of 1 (the stand-in's row) are cut to 0
  rows, so `predict` returns exactly one row per example,
- in a function of the user's own (a custom loop's `strategy.run`, not
  Keras's `train_step`, `test_step` or `predict_step`), its other outputs
  are zeros: what a sum, a count or `tf.nn.compute_average_loss` gives on
  an empty batch, so a loop that adds up the replicas' losses or counts
  gets the numbers of the examples there are. (Keras's steps return their
  metrics' results, which every replica reads alike, and stay as they are.)

The shares are read from the batches as they arrive, before any stand-in: each
replica's fraction of the global batch.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from keras_psdist._tf import distribute_utils, values
from keras_psdist.distribute.input.pieces import batch_size, rows


class ReplicaBatches:
    """The per-replica batches of one `strategy.run` call.

    Args:
        args: The positional arguments of `strategy.run`.
        kwargs: Its keyword arguments.
        num_replicas: The replica count.
    """

    def __init__(self, args: tuple, kwargs: dict, num_replicas: int):
        sizes = _batch_sizes(args, kwargs, num_replicas)
        #: Each replica's fraction of the global batch (0 for a replica
        #: without data), or None for equal shares: one replica, no batch,
        #: or batches whose equal sizes are known when tracing
        #: (`drop_remainder=True`), which then get no masking of replicas
        #: without data and no weighing of uneven ones.
        self.shares: list[tf.Tensor] | None = None
        #: Per replica, whether it got no data (a scalar bool), or None.
        self.without_data: list[tf.Tensor] | None = None
        if sizes is not None:
            total = tf.maximum(tf.add_n(sizes), 1.0)
            self.shares = [size / total for size in sizes]
            self.without_data = [tf.equal(size, 0.0) for size in sizes]

    def with_stand_ins(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """`(args, kwargs)` where every empty per-replica batch holds one
        stand-in example instead (see the module docstring)."""
        if self.shares is None:
            return args, kwargs
        any_empty = tf.reduce_any(self.without_data)

        def fill(value):
            return _fill_empty(value, self.without_data, any_empty)

        return tf.nest.map_structure(fill, (args, kwargs))

    def trim_outputs(self, outputs: Any, zero_the_rest: bool = False) -> Any:
        """Cuts stand-in rows out of the replicas' outputs; with
        `zero_the_rest`, a replica without data gives zeros for its other
        outputs (see the module docstring)."""
        if self.shares is None:
            return outputs

        def trim(value):
            if not isinstance(value, values.PerReplica):
                return value
            trimmed = [
                _without_stand_in(v, e, zero_the_rest)
                for v, e in zip(value.values, self.without_data, strict=True)
            ]
            return values.PerReplica(trimmed)

        return tf.nest.map_structure(trim, outputs)


def _batch_sizes(args, kwargs, num_replicas):
    """Examples per replica, read from the first batched per-replica tensor
    (dense, ragged or sparse); None when the shares are equal: one replica,
    no batch, or the same nonzero size in every replica's static shape."""
    if num_replicas == 1:
        return None
    firsts = []
    for r in range(num_replicas):
        flat = tf.nest.flatten(distribute_utils.select_replica(r, (args, kwargs)))
        first = next((t for t in flat if _is_batched(t)), None)
        if first is None:
            return None
        firsts.append(first)
    if all(map(_static_rows, firsts)) and len({f.shape[0] for f in firsts}) == 1:
        return None
    return [tf.cast(batch_size(first), tf.float32) for first in firsts]


def _fill_empty(value, without_data, any_empty):
    """A per-replica batch with each empty replica's batch (`without_data`,
    read once per step from the replicas' sizes) replaced by the first
    example of the first replica that has one."""
    if not isinstance(value, values.PerReplica):
        return value
    pieces = list(value.values)
    if not all(_is_batched(p) for p in pieces) or all(map(_static_rows, pieces)):
        return value
    # Built once, outside the per-replica conds, which then only pass a
    # tensor through: tracing costs a third of a stand-in built in every
    # replica's branch (about 1 s less per trace of an 8-replica step with
    # two inputs). Gathered from every replica only when one is empty.
    stand_in = tf.cond(
        any_empty,
        lambda: _concat([_head(p) for p in pieces]),
        lambda: _head(pieces[0]),
    )
    filled = [
        p
        if _static_rows(p)
        else tf.cond(
            empty,
            lambda: tf.identity(stand_in),
            lambda p=p: tf.identity(p),
        )
        for p, empty in zip(pieces, without_data, strict=True)
    ]
    return values.PerReplica(filled)


def _without_stand_in(value, replica_was_empty, zero_the_rest: bool):
    """An output of a replica's function, without the stand-in's part."""
    if zero_the_rest and isinstance(value, tf.Tensor):
        if _is_batched(value):
            return tf.cond(
                tf.logical_and(replica_was_empty, tf.not_equal(_rows(value), 1)),
                lambda: tf.zeros_like(value),
                lambda: _drop_stand_in_row(value, replica_was_empty),
            )
        return tf.where(replica_was_empty, tf.zeros_like(value), value)
    return _drop_stand_in_row(value, replica_was_empty)


def _drop_stand_in_row(value, replica_was_empty):
    if not _is_batched(value) or isinstance(value, tf.SparseTensor):
        return value
    rows = _rows(value)
    keep = tf.where(tf.logical_and(replica_was_empty, rows == 1), 0, rows)
    return value[:keep]


def _is_batched(x) -> bool:
    if isinstance(x, (tf.RaggedTensor, tf.SparseTensor)):
        return True
    return isinstance(x, tf.Tensor) and x.shape.rank is not None and x.shape.rank > 0


def _static_rows(x) -> bool:
    """Whether `x` is known, from its static shape, to have rows."""
    if isinstance(x, tf.SparseTensor):
        return False
    dim = x.shape[0]
    return dim is not None and dim > 0


def _rows(x) -> tf.Tensor:
    return tf.cast(batch_size(x), tf.int32)


def _head(x):
    """The first row of `x` (no rows if it has none)."""
    if not isinstance(x, tf.SparseTensor):
        return x[:1]
    size = batch_size(x)
    return rows(x, tf.zeros_like(size), tf.minimum(size, 1))


def _concat(heads):
    """The first row among `heads` (the first row of the first non-empty one)."""
    if isinstance(heads[0], tf.SparseTensor):
        joined = tf.sparse.concat(0, heads, expand_nonconcat_dims=True)
        return _head(joined)
    return tf.concat(heads, 0)[:1]
