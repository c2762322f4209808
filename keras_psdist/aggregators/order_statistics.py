"""Coordinate-wise order statistics of n tensors, by a sorting network.

`tf.sort` over a stacked `[n, d]` tensor is slow for the small n of data
parallelism (about 0.45 GB/s at n=8 on two CPU cores): it is a general sort
along a strided axis. A sorting network for a fixed n is a list of
compare-exchange pairs `(i, j)`: `lo, hi = min(x_i, x_j), max(x_i, x_j)`,
elementwise over whole tensors. Compiled with XLA the whole network becomes one
fused loop that reads each input once and writes only the order statistics the
rule uses (the others are dead code and vanish), which is close to memory
bandwidth.

NaN compares neither smaller nor larger, so `sanitize` first turns NaN into
+inf: a non-finite value then sorts to the top, where a rule that trims the f
largest and smallest values discards it.

Examples:

>>> import tensorflow as tf
>>> cols = [tf.constant([3.0, 0.0]), tf.constant([1.0, 5.0]), tf.constant([2.0, 4.0])]
>>> [s.numpy().tolist() for s in sort_columns(cols)]
[[1.0, 0.0], [2.0, 4.0], [3.0, 5.0]]
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import tensorflow as tf


@functools.cache
def network(n: int) -> tuple[tuple[int, int], ...]:
    """Batcher's odd-even merge sort comparators for `n` inputs.

    Built for the next power of two; comparators touching a padding index are
    dropped, which is valid because padding would hold +inf and never move.
    The result sorts ascending: after applying every `(i, j)` in order as
    `x_i, x_j = min, max`, `x_0 <= ... <= x_{n-1}`.
    """
    size = 1
    while size < n:
        size *= 2
    pairs = []
    p = 1
    while p < size:
        k = p
        while k >= 1:
            for j in range(k % p, size - k, 2 * k):
                for i in range(min(k, size - j - k)):
                    a, b = i + j, i + j + k
                    if a // (2 * p) == b // (2 * p) and b < n:
                        pairs.append((a, b))
            k //= 2
        p *= 2
    return tuple(pairs)


def sanitize(value: tf.Tensor) -> tf.Tensor:
    """NaN -> +inf, so a non-finite value sorts to the top (see module doc)."""
    return tf.where(
        tf.math.is_nan(value), tf.constant(float("inf"), value.dtype), value
    )


def sort_columns(column: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """Returns the coordinate-wise order statistics, smallest first.

    Args:
        column: n tensors of one shape (one variable's per-replica values).

    Returns:
        n tensors: element k holds, at each coordinate, the k-th smallest of
        the inputs there. Run inside an XLA-compiled function, unused order
        statistics cost nothing.
    """
    values = list(column)
    for i, j in network(len(values)):
        values[i], values[j] = (
            tf.minimum(values[i], values[j]),
            tf.maximum(values[i], values[j]),
        )
    return values


def sum_without_extremes(values: Sequence[tf.Tensor], t: int) -> tf.Tensor:
    """The sum of the values less, at each coordinate, the t largest and t smallest.

    The sum of the order statistics `t .. n-1-t` without sorting: the t
    largest and smallest are kept by insertion as the values go by (`4t + 1`
    operations per value; a sorting network of 32 inputs makes 12), then
    taken from the total. The difference loses digits when the extremes
    are much larger than the result, so it is only for values of one
    magnitude (NNM's mixed replicas, `keras_psdist.aggregators.nnm`).

    Args:
        values: n tensors of one shape, finite.
        t: How many to leave out on each side, `2t < n`.

    Returns:
        One tensor.
    """
    total = values[0] if len(values) == 1 else tf.add_n(list(values))
    largest, smallest = [], []
    for value in values:
        up, down = value, value
        for i, (top, bottom) in enumerate(zip(largest, smallest, strict=True)):
            largest[i], up = tf.maximum(top, up), tf.minimum(top, up)
            smallest[i], down = tf.minimum(bottom, down), tf.maximum(bottom, down)
        if len(largest) < t:
            largest.append(up)
            smallest.append(down)
    if t == 0:
        return total
    return total - tf.add_n(largest) - tf.add_n(smallest)


def insertion_is_cheaper(n: int, t: int) -> bool:
    """Whether `sum_without_extremes` makes fewer operations than the network."""
    return (4 * t + 1) * n < 2 * len(network(n))
