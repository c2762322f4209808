"""Cutting a global batch into the replicas' pieces.

Piece `k` of a batch of `B` examples cut into `n` pieces is rows
`piece_bounds(B, n, k)`: consecutive, in replica order, of sizes that differ by
at most one, so no piece is empty while `B >= n` (5 examples in 4 pieces: 2,
1, 1, 1). Every input pipeline of a PSStrategy cuts the same way (one host,
each in-graph worker, each async worker keeping its own pieces), which is
what makes an in-graph run equal a one-host run and gives async workers
disjoint data.
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf


@dataclass(frozen=True)
class Pieces:
    """Which pieces of every global batch one input pipeline keeps.

    Attributes:
        num_pieces: How many pieces a global batch is cut into (all replicas
            of the run).
        low: The first piece kept.
        high: One past the last piece kept.
    """

    num_pieces: int
    low: int
    high: int

    def cut(self, element):
        """The kept pieces of one global batch, as a tuple of structures like
        `element`."""
        size = _global_batch_size(element)
        pieces = []
        for k in range(self.low, self.high):
            start, stop = piece_bounds(size, self.num_pieces, k)
            pieces.append(
                tf.nest.map_structure(
                    lambda x, start=start, stop=stop: rows(x, start, stop), element
                )
            )
        return tuple(pieces)

    def reaches(self, element) -> tf.Tensor:
        """Whether a global batch is large enough to give piece `low` a row."""
        return _global_batch_size(element) > self.low


def _global_batch_size(element) -> tf.Tensor:
    return batch_size(tf.nest.flatten(element)[0])


def piece_bounds(size: tf.Tensor, num_pieces: int, index: int):
    """`(start, stop)` of piece `index` of `size` rows cut into `num_pieces`."""
    base = size // num_pieces
    extra = size % num_pieces
    start = index * base + tf.minimum(tf.constant(index, size.dtype), extra)
    stop = start + base + tf.cast(index < extra, size.dtype)
    return start, stop


def batch_size(x) -> tf.Tensor:
    """The leading (batch) dimension of a dense, ragged or sparse tensor, int64."""
    if isinstance(x, tf.SparseTensor):
        return x.dense_shape[0]
    if isinstance(x, tf.RaggedTensor):
        return x.nrows(out_type=tf.int64)
    return tf.shape(x, out_type=tf.int64)[0]


def rows(x, start: tf.Tensor, stop: tf.Tensor):
    """Rows `[start, stop)` of a dense, ragged or sparse tensor."""
    if isinstance(x, tf.SparseTensor):
        zeros = tf.zeros_like(x.dense_shape[1:])
        return tf.sparse.slice(
            x,
            tf.concat([[start], zeros], 0),
            tf.concat([[stop - start], x.dense_shape[1:]], 0),
        )
    return x[start:stop]
