"""Random-k sparsification with error feedback, the same coordinates on every
replica: each replica sends the values of its gradient plus residual at k
coordinates drawn from a seed that every replica derives alike, from the
compressor's `seed`, the step and the variable.

Since the coordinates follow from the seed, a replica sends only the k
values and the seed (two int64); the reduction device draws the same
coordinates again to put the values back. And since every replica sends the
same coordinates, a coordinate-wise rule after it sees, at each coordinate,
either every replica's value or none.

Examples:

>>> import tensorflow as tf
>>> random_k = RandomK(ratio=0.5, seed=1)
>>> a, _ = random_k.compress(tf.constant([1.0, 2.0, 3.0, 4.0]), random_k.init(tf.TensorSpec([4])), step=7)
>>> b, _ = random_k.compress(tf.constant([5.0, 6.0, 7.0, 8.0]), random_k.init(tf.TensorSpec([4])), step=7)
>>> bool(tf.reduce_all(random_k.indices(a) == random_k.indices(b)))
True
>>> a.values.shape
TensorShape([2])
"""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from keras_psdist.compression.base import (
    Compressor,
    check_ratio,
    check_seed,
    kept_count,
    scatter,
    zero_at,
)

# TensorFlow's number of the Philox algorithm (`tf.random.Algorithm.PHILOX`).
PHILOX = tf.random.Algorithm.PHILOX.value


class Seeded(NamedTuple):
    """What random-k sends: the `values` at the coordinates that `seed` (int64
    `[2]`) draws from a tensor of `shape` (int32, from `tf.shape`)."""

    values: tf.Tensor
    seed: tf.Tensor
    shape: tf.Tensor


class RandomK(Compressor):
    """`ratio` of the coordinates, drawn alike on every replica, with error
    feedback (`"random_k"`).

    Each step and variable, the coordinates are the first
    `k = max(1, ceil(ratio * size))` positions of a pseudorandom permutation
    (`tf.random.experimental.index_shuffle`, O(k) work) under the seed
    `fold_in(fold_in([seed, 0], step), variable)` (Philox): the same on
    every replica, different at every step and for every variable. A
    replica sends the k values and the seed (`k * 4 + 16` bytes for
    float32).

    Args:
        ratio: The fraction of each gradient's coordinates sent, in
            `(0, 1]`. Defaults to 0.01.
        seed: The run's seed, an int >= 0. Defaults to 0.

    Raises:
        ValueError: for a ratio outside `(0, 1]` or a negative seed.

    References:
        Stich, Cordonnier, Jaggi, "Sparsified SGD with Memory", NeurIPS
        2018 (random-k with memory); BytePS's `randomk` compressor, one seed
        on all workers and servers so the same coordinates are kept.
    """

    error_feedback = True
    uses_step = True

    def __init__(self, ratio: float = 0.01, seed: int = 0):
        self.ratio = check_ratio(ratio, "random_k")
        self.seed = check_seed(seed, "random_k")

    def encode(self, value: tf.Tensor, step: Any, key: int) -> Seeded:
        flat = tf.reshape(value, [-1])
        seed = self.seed_of(step, key)
        indices = _draw(seed, kept_count(self.ratio, flat), tf.size(flat))
        return Seeded(tf.gather(flat, indices), seed, tf.shape(value))

    def seed_of(self, step: tf.Tensor | int, key: int) -> tf.Tensor:
        """The seed of `step` and variable `key`: int64 `[2]`."""
        seed = tf.constant([self.seed, 0], tf.int64)
        seed = philox_fold_in(seed, tf.cast(step, tf.int64))
        return philox_fold_in(seed, tf.constant(key, tf.int64))

    def indices(self, payload: Seeded) -> tf.Tensor:
        """The flat coordinates a payload's values stand at (int64 `[k]`)."""
        size = tf.reduce_prod(payload.shape)
        return _draw(payload.seed, tf.size(payload.values), size)

    def decompress(self, payload: Seeded) -> tf.Tensor:
        return scatter(self.indices(payload), payload.values, payload.shape)

    def residual(self, value: tf.Tensor, payload: Seeded) -> tf.Tensor:
        return zero_at(value, self.indices(payload))

    def get_config(self) -> dict[str, Any]:
        return {"ratio": self.ratio, "seed": self.seed}


def philox_fold_in(seed: tf.Tensor, data: tf.Tensor) -> tf.Tensor:
    """`tf.random.fold_in(seed, data, alg="philox")` for an int64 `seed` and
    `data`, bit for bit, in 6 graph ops where it makes 48: TensorFlow
    scrambles the seed into Philox's key and counter with ops of its own,
    which `StatelessRandomGetKeyCounter` does in one kernel (the same
    scramble on CPU and GPU). Each replica draws each variable's seed in
    its step, so the ops add up: tracing a 7-replica step with `random_k`
    took 2.9 s, 2.0 of them here.

    >>> seed = tf.constant([3, 0], tf.int64)
    >>> bool(tf.reduce_all(philox_fold_in(seed, tf.constant(5, tf.int64))
    ...      == tf.random.fold_in(seed, tf.constant(5, tf.int64), alg="philox")))
    True
    """
    key, counter = tf.raw_ops.StatelessRandomGetKeyCounter(seed=seed)
    value = tf.raw_ops.StatelessRandomUniformFullIntV2(
        shape=tf.constant([], tf.int32),
        key=key,
        counter=counter,
        alg=tf.constant(PHILOX, tf.int32),
        dtype=tf.int64,
    )
    return tf.stack([value, data])


def _draw(seed: tf.Tensor, k: int | tf.Tensor, size: tf.Tensor) -> tf.Tensor:
    """The first `k` positions of the permutation of `range(size)` under
    `seed`: k distinct coordinates, int64."""
    size = tf.cast(size, tf.int64)
    return tf.random.experimental.index_shuffle(
        tf.range(tf.cast(k, tf.int64), dtype=tf.int64), seed, size - 1
    )
