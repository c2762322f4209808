"""Distances between whole replica vectors, shared by the whole-vector rules.

Krum, Bulyan, the geometric median, centered clipping and nearest-neighbour
mixing compare replicas as *full vectors*: every variable concatenated (and
static and adaptive clipping measure their norms, `squared_norms`). They
need the squared distances `D[i, j] = sum_v ||x_i^v - x_j^v||^2`, or distances
from each replica to a weighted combination of the replicas. Both follow from
one `[n, n]` matrix of inner products (a Gram matrix), so the values are read
once, whatever the rule does next.

How the Gram matrix is computed: each variable's replicas are stacked as
`[n, m]` blocks of at most `BLOCK` coordinates (small variables share a
block) and each block contributes `X @ X^T`. A block fits in the L2 cache, so
the matmul reads what the stack just wrote: at n = 8, d = 2**20 float32 on
two CPU cores the whole Gram matrix costs 1.5x to 2.7x the `mean` rule
(quiet to loaded machine); one `[n, d]` stack costs 3-4x, XLA's dot about
8x, a float64 Gram matrix about 9x. From `BATCHED_FROM` replicas on, a
large variable is cut into `PIECE`-coordinate pieces stacked as
`[c, n, PIECE]` batches of at most `CHUNK` coordinates, and each batch
contributes the sum over c of `X @ X^T`, one batched matrix product:
TensorFlow's CPU kernel splits a product of two `[32, K]` matrices poorly,
while a batch of small ones keeps both cores busy. Measured at n = 32,
d = 1e6: 3.6x to 3.9x the `mean` rule (of which the stacking copy, at the
speed of memory, is 1.5x to 1.9x), against 9x to 14x for `[n, BLOCK]`
blocks (OpenBLAS's `x @ x.T` of the stacked `[32, d]` NumPy array: 2.7x
`numpy.sum`); at n = 8 the batches are slower than the blocks (Krum 3.2x
the `mean` rule against 2.1x).

Round-off: `D[i, j] = G[i, i] + G[j, j] - 2 G[i, j]` loses about
`1e-7 * (||x_i||^2 + ||x_j||^2)` to cancellation, which matters only for
replicas much closer to each other than to the origin (measured at d=2**20:
replicas spread by 10% of their norm, D is off by 2e-5 relative; by 1%, 2e-3;
by 0.1%, 0.2). Rules that know a robust central point (the geometric median,
centered clipping) pass it as `center`, and the Gram matrix is taken of
`x_i - center`. Inputs of at most `DIRECT_LIMIT` values in all are kept as
one `[n, D]` matrix and distances are computed from differences, exact to
rounding.

Non-finite replicas (the spec's rule): a replica with a NaN or Inf anywhere is
at distance +inf from every other replica (0 from itself), is never selected,
and gets weight 0. Here a replica whose squared norm overflows float32 counts
as non-finite too: it is at distance +inf from everyone anyway.

Examples:

>>> import tensorflow as tf
>>> column = [tf.constant([0.0, 0.0]), tf.constant([3.0, 4.0]), tf.constant([float("nan"), 0.0])]
>>> pairwise_squared_distances([column]).numpy().tolist()
[[0.0, 25.0, inf], [25.0, 0.0, inf], [inf, inf, 0.0]]
>>> finite_replicas([column]).numpy().tolist()
[True, True, False]
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

import tensorflow as tf

# Coordinates per Gram block: n * BLOCK float32 values stay in a 2 MB L2 cache.
BLOCK = 2**15
# From this many replicas on, a large variable's Gram matrix is a batch of
# `[n, PIECE]` products in chunks of `CHUNK` coordinates (n * CHUNK float32
# values: 4 MB at n = 32), which bounds the stacking's extra memory. Chunks
# of 2**15 rather than 2**17 took Krum at n = 32, d = 1e6 from 4.2x-4.8x to
# 3.8x-4.1x the `mean` rule (`benchmarks/aggregators.py --n 32 --d 1e6`, the
# two sizes run alternately, twice each).
BATCHED_FROM = 16
PIECE = 2**12
CHUNK = 2**15
# At most this many values in all (n times the full vector's length), the
# replicas are kept as one matrix and distances are exact differences.
DIRECT_LIMIT = 2**16

_INF = float("inf")


def finite_replicas(per_replica: Sequence[Sequence[tf.Tensor]]) -> tf.Tensor:
    """Which replicas hold only finite values, in every variable.

    Args:
        per_replica: `per_replica[v][r]`, as in `Aggregator.aggregate`.

    Returns:
        A bool tensor of shape `[n]`.
    """
    n = len(per_replica[0])
    flags = []
    for r in range(n):
        per_variable = [
            tf.reduce_all(tf.math.is_finite(column[r])) for column in per_replica
        ]
        flags.append(tf.reduce_all(tf.stack(per_variable)))
    return tf.stack(flags)


def squared_norms(per_replica: Sequence[Sequence[tf.Tensor]]) -> tf.Tensor:
    """Each replica's squared norm over the full vector, in float32.

    A sum of squares per replica and variable, no Gram matrix. The spec's
    non-finite rule, as for distances: a replica with a NaN or Inf anywhere,
    or whose squared norm overflows float32 (a norm above about 1.8e19),
    gets +inf.

    Args:
        per_replica: `per_replica[v][r]`.

    Returns:
        float32 `[n]`, +inf for the non-finite replicas (never NaN).
    """
    n = len(per_replica[0])
    sums = []
    for r in range(n):
        parts = [
            tf.reduce_sum(tf.square(tf.cast(column[r], tf.float32)))
            for column in per_replica
        ]
        sums.append(tf.add_n(parts) if len(parts) > 1 else parts[0])
    sums = tf.stack(sums)
    return tf.where(tf.math.is_finite(sums), sums, _INF)


def zero_nonfinite(
    per_replica: Sequence[Sequence[tf.Tensor]], finite: tf.Tensor
) -> list[list[tf.Tensor]]:
    """Replaces the values of non-finite replicas by zeros (new tensors).

    Args:
        per_replica: `per_replica[v][r]`.
        finite: bool `[n]`, e.g. from `finite_replicas`.

    Returns:
        The same structure, replica r's values zero where `finite[r]` is False.
    """
    return [
        [tf.where(finite[r], x, tf.zeros_like(x)) for r, x in enumerate(column)]
        for column in per_replica
    ]


class Geometry(NamedTuple):
    """The replicas as points, relative to a center (see `geometry`).

    Attributes:
        gram: float32 `[n, n]`, inner products of the centered replicas; rows
            and columns of non-finite replicas are zero.
        finite: bool `[n]`, the replicas that take part.
        flat: float32 `[n, D]`, the centered replicas themselves (non-finite
            rows zero) when the input is small (see `DIRECT_LIMIT`), else
            `None`.
    """

    gram: tf.Tensor
    finite: tf.Tensor
    flat: tf.Tensor | None = None


def geometry(
    per_replica: Sequence[Sequence[tf.Tensor]],
    center: Sequence[tf.Tensor] | None = None,
    finite: tf.Tensor | None = None,
) -> Geometry:
    """Computes the replicas' inner products, in float32, over the full vector.

    Args:
        per_replica: `per_replica[v][r]`.
        center: One tensor per variable subtracted from every replica first
            (better round-off near it), or `None`.
        finite: bool `[n]` of replicas known to be finite, or `None` to tell
            from the squared norms.

    Returns:
        A `Geometry`.
    """
    sizes = [column[0].shape.num_elements() for column in per_replica]
    n = len(per_replica[0])
    centers = [None] * len(per_replica) if center is None else list(center)
    if all(s is not None for s in sizes) and n * sum(sizes) <= DIRECT_LIMIT:
        parts = zip(per_replica, centers, strict=True)
        flat = tf.concat([_stack(column, c) for column, c in parts], 1)
        ok = tf.math.is_finite(tf.reduce_sum(tf.square(flat), axis=1))
        if finite is not None:
            ok = tf.logical_and(ok, finite)
        flat = tf.where(ok[:, None], flat, tf.zeros_like(flat))
        return Geometry(tf.matmul(flat, flat, transpose_b=True), ok, flat)
    blocks = [_block_gram(x) for x in _blocks(per_replica, centers)]
    gram = tf.add_n(blocks or [tf.zeros([n, n])])
    ok = tf.math.is_finite(tf.linalg.diag_part(gram))
    if finite is not None:
        ok = tf.logical_and(ok, finite)
    both = tf.logical_and(ok[:, None], ok[None, :])
    return Geometry(tf.where(both, gram, tf.zeros_like(gram)), ok)


def squared_distances(geom: Geometry) -> tf.Tensor:
    """`D[i, j]`, the squared distances between replicas (see module doc).

    Returns:
        float32 `[n, n]`: 0 on the diagonal, +inf to and from non-finite
        replicas, never negative or NaN.
    """
    if geom.flat is not None:
        diff = geom.flat[:, None, :] - geom.flat[None, :, :]
        dist = tf.reduce_sum(tf.square(diff), axis=-1)
    else:
        norms = tf.linalg.diag_part(geom.gram)
        dist = norms[:, None] + norms[None, :] - 2.0 * geom.gram
    dist = _clean(dist)
    both = tf.logical_and(geom.finite[:, None], geom.finite[None, :])
    dist = tf.where(both, dist, _INF)
    return tf.linalg.set_diag(dist, tf.zeros_like(geom.finite, tf.float32))


def squared_distances_to(geom: Geometry, coeffs: tf.Tensor) -> tf.Tensor:
    """Squared distances from the point `center + sum_j coeffs[j] * y_j` to each replica.

    `y_j` is replica j minus the center, so `coeffs = 0` is the center itself.

    Args:
        geom: From `geometry`.
        coeffs: float32 `[n]`; entries of non-finite replicas must be 0.

    Returns:
        float32 `[n]`, +inf for non-finite replicas.
    """
    if geom.flat is not None:
        point = tf.matmul(coeffs[None, :], geom.flat)
        dist = tf.reduce_sum(tf.square(geom.flat - point), axis=1)
    else:
        g_a = tf.linalg.matvec(geom.gram, coeffs)
        dist = tf.reduce_sum(coeffs * g_a) - 2.0 * g_a + tf.linalg.diag_part(geom.gram)
    return tf.where(geom.finite, _clean(dist), _INF)


def pairwise_squared_distances(per_replica: Sequence[Sequence[tf.Tensor]]) -> tf.Tensor:
    """`D[i, j] = sum_v ||x_i^v - x_j^v||^2` with the spec's non-finite handling.

    Args:
        per_replica: `per_replica[v][r]`.

    Returns:
        float32 `[n, n]` (see `squared_distances`).
    """
    return squared_distances(geometry(per_replica))


def first_min(values: tf.Tensor, eligible: tf.Tensor) -> tf.Tensor:
    """The lowest index among the eligible entries with the smallest value.

    Args:
        values: float `[n]`, no NaN.
        eligible: bool `[n]`.

    Returns:
        An int32 scalar; `n` when nothing is eligible.
    """
    n = values.shape[0]
    masked = tf.where(eligible, values, _INF)
    hit = tf.logical_and(eligible, tf.equal(masked, tf.reduce_min(masked)))
    return tf.reduce_min(tf.where(hit, tf.range(n), n))


def stable_ranks(values: tf.Tensor, last: tf.Tensor | None = None) -> tf.Tensor:
    """Ranks along the last axis, ascending; ties by index (a stable sort's order).

    Args:
        values: float `[..., n]`, no NaN.
        last: Optional bool `[..., n]`: entries that rank after all others
            whatever their value (e.g. non-finite replicas).

    Returns:
        int32 `[..., n]`: entry i's position if the row were sorted.
    """
    n = values.shape[-1]
    mine, other = values[..., :, None], values[..., None, :]
    index = tf.range(n)
    before = tf.logical_or(
        other < mine,
        tf.logical_and(tf.equal(other, mine), index[None, :] < index[:, None]),
    )
    if last is not None:
        mine_last, other_last = last[..., :, None], last[..., None, :]
        same = tf.equal(mine_last, other_last)
        before = tf.logical_or(
            tf.logical_and(same, before),
            tf.logical_and(mine_last, tf.logical_not(other_last)),
        )
    return tf.reduce_sum(tf.cast(before, tf.int32), axis=-1)


def _clean(dist):
    """Round-off: negative -> 0; NaN (inf - inf) -> +inf."""
    return tf.where(tf.math.is_nan(dist), _INF, tf.maximum(dist, 0.0))


def _stack(column, center):
    """One variable's replicas as float32 `[n, size]`, minus the center."""
    x = tf.cast(tf.reshape(tf.stack(column), [len(column), -1]), tf.float32)
    if center is not None:
        x = x - tf.cast(tf.reshape(center, [1, -1]), tf.float32)
    return x


def _block_gram(x):
    """`X @ X^T` of an `[n, m]` block; the sum over c of those of a `[c, n, m]` batch."""
    product = tf.matmul(x, x, transpose_b=True)
    return tf.reduce_sum(product, axis=0) if x.shape.rank == 3 else product


def _blocks(per_replica, centers) -> Iterator[tf.Tensor]:
    """float32 blocks covering the full vector: `[n, m]` blocks (`m <= BLOCK`
    mostly) and, from `BATCHED_FROM` replicas on, `[c, n, PIECE]` batches of
    a large variable's pieces."""
    batched = len(per_replica[0]) >= BATCHED_FROM
    pending, pending_size = [], 0
    for column, center in zip(per_replica, centers, strict=True):
        size = column[0].shape.num_elements()
        if size is None:  # a sparse block: rows known only at run time
            yield _stack(column, center)
        elif size < (PIECE if batched else BLOCK):
            pending.append(_stack(column, center))
            pending_size += size
            if pending_size >= BLOCK:
                yield tf.concat(pending, 1)
                pending, pending_size = [], 0
        else:
            flat = [tf.reshape(x, [-1]) for x in column]
            flat_center = None if center is None else tf.reshape(center, [-1])
            whole = size - size % PIECE if batched else 0
            step = max(CHUNK - CHUNK % PIECE, PIECE)
            for start in range(0, whole, step):
                stop = min(start + step, whole)
                part = [x[start:stop] for x in flat]
                part_center = None if center is None else flat_center[start:stop]
                yield _stack_batch(part, part_center, (stop - start) // PIECE)
            for start in range(whole, size, BLOCK):
                part = [x[start : start + BLOCK] for x in flat]
                part_center = (
                    None if center is None else flat_center[start : start + BLOCK]
                )
                yield _stack(part, part_center)
    if pending:
        yield tf.concat(pending, 1) if len(pending) > 1 else pending[0]


def _stack_batch(part, center, count):
    """Flat pieces of `count * PIECE` values as float32 `[count, n, PIECE]`."""
    x = tf.stack([tf.reshape(v, [count, PIECE]) for v in part], axis=1)
    x = tf.cast(x, tf.float32)
    if center is not None:
        x = x - tf.cast(tf.reshape(center, [count, 1, PIECE]), tf.float32)
    return x
