"""How a partitioned variable's rows are split, and the row arithmetic.

`ShardLayout(rows)` says that shard `i` holds `rows[i]` consecutive rows
(TF's `ShardedVariable` convention: the first `num_rows % num_shards` shards
one row longer, see `partitioners.shard_rows`). It maps global row ids to
`(shard, local row)`, splits full-shape values (dense tensors into row blocks,
`IndexedSlices` into per-shard slices with local indices), joins them back,
and gathers rows from the shard variables, each read on its own device.

Examples:

>>> layout = ShardLayout((3, 2))
>>> layout.offsets
(0, 3)
>>> [int(t.shape[0]) for t in layout.split(tf.zeros([5, 4]))]
[3, 2]
>>> shard, local = layout.shard_of(tf.constant([0, 2, 3, 4], tf.int64))
>>> shard.numpy().tolist(), local.numpy().tolist()
([0, 0, 1, 1], [0, 2, 0, 1])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import tensorflow as tf


@dataclasses.dataclass(frozen=True, eq=False)
class ShardLayout:
    """How the rows of a partitioned variable are split: `rows[i]` rows in
    shard `i`, in order. A variable and its optimizer slots share one layout
    object (compared by identity)."""

    rows: tuple[int, ...]

    @property
    def num_shards(self) -> int:
        return len(self.rows)

    @property
    def num_rows(self) -> int:
        return sum(self.rows)

    @property
    def offsets(self) -> tuple[int, ...]:
        """The first global row of each shard."""
        return tuple(int(x) for x in np.cumsum((0,) + self.rows[:-1]))

    def shard_of(self, ids: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """`(shard index, row within the shard)` of each int64 global row id."""
        bounds = tf.constant(self.offsets[1:], tf.int64)
        shard = tf.searchsorted(bounds, ids, side="right", out_type=tf.int32)
        local = ids - tf.gather(tf.constant(self.offsets, tf.int64), shard)
        return shard, local

    def split(self, value):
        """Splits a full-shape value into per-shard values.

        A dense value is split into row blocks; `tf.IndexedSlices` (a sparse
        gradient) into per-shard slices with shard-local row indices, so each
        shard receives only the rows it owns.
        """
        if isinstance(value, tf.IndexedSlices):
            return self._split_sparse(value)
        return tf.split(tf.convert_to_tensor(value), list(self.rows), axis=0)

    def _split_sparse(self, slices: tf.IndexedSlices) -> list[tf.IndexedSlices]:
        ids = tf.cast(slices.indices, tf.int64)
        shard, local = self.shard_of(ids)
        parts = tf.dynamic_partition(local, shard, self.num_shards)
        values = tf.dynamic_partition(slices.values, shard, self.num_shards)
        tail = slices.values.shape[1:]
        return [
            tf.IndexedSlices(v, i, dense_shape=tf.constant([rows, *tail], tf.int64))
            for v, i, rows in zip(values, parts, self.rows, strict=True)
        ]

    def join(self, parts: Sequence, shape: tf.TensorShape, dtype: tf.DType):
        """The inverse of `split`: one full-shape value from per-shard ones.

        `None` parts are shards with no gradient; all `None` gives `None`.
        All-sparse parts stay sparse (global row indices); any dense part
        makes the result dense.
        """
        if all(p is None for p in parts):
            return None
        tail = shape[1:]
        if all(p is None or isinstance(p, tf.IndexedSlices) for p in parts):
            indices, values = [], []
            for p, offset in zip(parts, self.offsets, strict=True):
                if p is not None:
                    indices.append(tf.cast(p.indices, tf.int64) + offset)
                    values.append(p.values)
            return tf.IndexedSlices(
                tf.concat(values, axis=0),
                tf.concat(indices, axis=0),
                dense_shape=tf.constant(shape.as_list(), tf.int64),
            )
        dense = [
            tf.zeros([rows, *tail], dtype) if p is None else tf.convert_to_tensor(p)
            for p, rows in zip(parts, self.rows, strict=True)
        ]
        return tf.concat(dense, axis=0)

    def gather(self, shards: Sequence[tf.Variable], indices, name: str):
        """Rows `indices` of the logical variable, each read on its shard."""
        indices = tf.convert_to_tensor(indices)
        if not indices.dtype.is_integer:
            raise TypeError(
                f"Row indices into partitioned variable {name!r} must be "
                f"integers. Received dtype {indices.dtype.name}."
            )
        ids = tf.cast(tf.reshape(indices, [-1]), tf.int64)
        check = tf.debugging.assert_less(
            ids,
            tf.constant(self.num_rows, tf.int64),
            message=f"row index out of range for {name!r} ({self.num_rows} rows)",
        )
        check_low = tf.debugging.assert_non_negative(
            ids, message=f"negative row index into {name!r}"
        )
        with tf.control_dependencies([check, check_low]):
            shard, local = self.shard_of(ids)
        positions = tf.range(tf.size(ids))
        local_parts = tf.dynamic_partition(local, shard, self.num_shards)
        position_parts = tf.dynamic_partition(positions, shard, self.num_shards)
        rows = []
        for variable, part in zip(shards, local_parts, strict=True):
            with tf.device(variable.device):
                rows.append(variable.sparse_read(part))
        flat = tf.dynamic_stitch(position_parts, rows)
        tail = shards[0].shape[1:]
        out = tf.reshape(flat, tf.concat([tf.shape(indices), tail], axis=0))
        out.set_shape(indices.shape.concatenate(tail))
        return out
