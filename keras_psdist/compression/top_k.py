"""Top-k sparsification with error feedback: each replica sends the k
coordinates of largest magnitude of its gradient plus residual.

Examples:

>>> import tensorflow as tf
>>> top_k = TopK(ratio=0.5)
>>> residual = top_k.init(tf.TensorSpec([4]))
>>> payload, residual = top_k.compress(tf.constant([0.1, -3.0, 0.2, 2.0]), residual)
>>> sorted(payload.indices.numpy().tolist())
[1, 3]
>>> top_k.decompress(payload).numpy().tolist()
[0.0, -3.0, 0.0, 2.0]
>>> residual.numpy().tolist()  # sent at a later step
[0.10000000149011612, 0.0, 0.20000000298023224, 0.0]
"""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from keras_psdist.compression.base import (
    Compressor,
    check_ratio,
    kept_count,
    scatter,
    zero_at,
)


class Sparse(NamedTuple):
    """What a sparsifier sends: `values` at the flat `indices` of a tensor
    of `shape` (int32, from `tf.shape`)."""

    indices: tf.Tensor
    values: tf.Tensor
    shape: tf.Tensor


class TopK(Compressor):
    """The `ratio` largest-magnitude coordinates, with error feedback (`"top_k"`).

    Each replica sends `k = max(1, ceil(ratio * size))` coordinates of each
    variable's `g + e` (indices and values: `k * 8` bytes for float32 with
    int32 indices, against `size * 4` uncompressed, so it saves bytes for a
    ratio below 0.5) and keeps the rest in its residual `e`. Replicas choose
    their coordinates independently.

    Args:
        ratio: The fraction of each gradient's coordinates sent, in
            `(0, 1]`. Defaults to 0.01.

    Raises:
        ValueError: for a ratio outside `(0, 1]`.

    References:
        Stich, Cordonnier, Jaggi, "Sparsified SGD with Memory", NeurIPS 2018
        (top-k with the memory added back: the variant here, per variable,
        ties to the lower index as `tf.math.top_k`); Lin et al., "Deep
        Gradient Compression", ICLR 2018.
    """

    error_feedback = True

    def __init__(self, ratio: float = 0.01):
        self.ratio = check_ratio(ratio, "top_k")

    def encode(self, value: tf.Tensor, step: Any, key: int) -> Sparse:
        flat = tf.reshape(value, [-1])
        _, indices = tf.math.top_k(
            tf.abs(flat), kept_count(self.ratio, flat), sorted=False
        )
        return Sparse(indices, tf.gather(flat, indices), tf.shape(value))

    def decompress(self, payload: Sparse) -> tf.Tensor:
        return scatter(payload.indices, payload.values, payload.shape)

    def residual(self, value: tf.Tensor, payload: Sparse) -> tf.Tensor:
        return zero_at(value, payload.indices)

    def get_config(self) -> dict[str, Any]:
        return {"ratio": self.ratio}
