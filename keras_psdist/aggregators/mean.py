"""The arithmetic mean: plain data-parallel SGD, and the baseline rule."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from keras_psdist.aggregators.base import Aggregation, Aggregator, weighted_sum


class Mean(Aggregator):
    """Averages the replicas' values: what `MirroredStrategy` computes.

    Not robust: one replica sending a huge or non-finite value moves the
    result arbitrarily far. It tolerates no Byzantine replica, so
    `check(n, num_byzantine)` refuses `num_byzantine > 0`.

    Examples:

    >>> import tensorflow as tf
    >>> rule = Mean()
    >>> [out] = rule.aggregate([[tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0])]])
    >>> out.numpy().tolist()
    [2.0, 3.0]

    References:
        The baseline of every Byzantine-robustness paper, e.g. Blanchard et
        al., "Machine Learning with Adversaries: Byzantine Tolerant Gradient
        Descent", NeurIPS 2017.
    """

    per_variable = True

    def check(self, num_replicas: int, num_byzantine: int = 0) -> None:
        super().check(num_replicas, num_byzantine)
        if num_byzantine > 0:
            raise ValueError(
                "The `mean` aggregator tolerates no Byzantine replica: one bad "
                "value moves the mean arbitrarily. Received: "
                f"num_byzantine={num_byzantine}. Use a robust rule such as "
                "'median' or 'trimmed_mean', or set num_byzantine=0."
            )

    def aggregate(self, per_replica: Sequence[Sequence[tf.Tensor]]) -> list[tf.Tensor]:
        # One value is its own mean: no division (a pass over the tensor).
        return [
            _sum(vs) if len(vs) == 1 else _sum(vs) / tf.cast(len(vs), vs[0].dtype)
            for vs in per_replica
        ]

    def step(self, reduce_op, per_replica, *, shares=None, state=()):
        """The mean of the replicas' per-example gradients, weighted by batch.

        With equal shares, the SUM of 1/n-scaled values is the mean of the
        true-scale ones: one `add_n` per variable. When the global batch
        split unevenly, replica `r`'s value is weighted by `n * shares[r]`,
        which makes the result the gradient of the mean loss over the whole
        global batch, as on one device. Replicas with no data are left out.
        Sparse values are concatenated (duplicate rows add up when applied),
        so an embedding table is never densified.
        """
        if not per_replica:
            return super().step(reduce_op, per_replica, shares=shares, state=state)
        n = len(per_replica[0])
        scale = float(n) if reduce_op == tf.distribute.ReduceOp.SUM else 1.0
        values = [None] * len(per_replica)
        dense = []
        for i, vs in enumerate(per_replica):
            if any(isinstance(v, tf.IndexedSlices) for v in vs):
                values[i] = _concat_sparse(reduce_op, vs, shares)
            else:
                dense.append(i)
        columns = [per_replica[i] for i in dense]
        if shares is None or not columns:
            reduced = self._reduce_equal(reduce_op, columns)
        else:
            even = tf.reduce_all(tf.abs(tf.stack(shares) - 1.0 / n) < 1e-6 / n)
            reduced = tf.cond(
                even,
                lambda: self._reduce_equal(reduce_op, columns),
                lambda: [
                    weighted_sum(vs, [s * scale for s in shares]) for vs in columns
                ],
            )
        for i, r in zip(dense, reduced, strict=True):
            values[i] = r
        return Aggregation(values, {}, state)

    def _reduce_equal(self, reduce_op, per_replica):
        if reduce_op == tf.distribute.ReduceOp.SUM:
            return [_sum(vs) for vs in per_replica]
        return self.aggregate(per_replica)


def _concat_sparse(reduce_op, column, shares=None):
    """Concatenates the replicas' rows: exact under SUM; MEAN divides by n.

    With `shares`, replica `r`'s rows are weighted by `n * shares[r]` as the
    dense values are (replicas without data are left out).
    """
    n = len(column)
    if not all(isinstance(v, tf.IndexedSlices) for v in column):
        dense = [tf.convert_to_tensor(v) for v in column]
        return Mean().reduce(reduce_op, [dense], shares)[0]
    parts = [v.values for v in column]
    if shares is not None:
        parts = [
            tf.where(
                tf.cast(share, p.dtype) > 0,
                p * tf.cast(share * n, p.dtype),
                tf.zeros_like(p),
            )
            for p, share in zip(parts, shares, strict=True)
        ]
    values = tf.concat(parts, axis=0)
    if reduce_op == tf.distribute.ReduceOp.MEAN:
        values = values / tf.cast(n, values.dtype)
    indices = tf.concat([v.indices for v in column], axis=0)
    return tf.IndexedSlices(values, indices, column[0].dense_shape)


def _sum(values: Sequence[tf.Tensor]) -> tf.Tensor:
    if len(values) == 1:
        return tf.identity(values[0])
    return tf.add_n(list(values))
