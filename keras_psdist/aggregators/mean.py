"""The arithmetic mean: plain data-parallel SGD, and the baseline rule."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from keras_psdist.aggregators.base import Aggregator, weighted_sum


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

    name = "mean"

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
        return [_sum(vs) / tf.cast(len(vs), vs[0].dtype) for vs in per_replica]

    def reduce(
        self,
        reduce_op: tf.distribute.ReduceOp,
        per_replica: Sequence[Sequence[tf.Tensor]],
        shares: Sequence[tf.Tensor] | None = None,
    ) -> list[tf.Tensor]:
        """The mean of the replicas' per-example gradients, weighted by batch.

        With equal shares, the SUM of 1/n-scaled values is the mean of the
        true-scale ones: one `add_n` per variable. When the global batch
        split unevenly, replica `r`'s value is weighted by `n * shares[r]`,
        which makes the result the gradient of the mean loss over the whole
        global batch, as on one device. Replicas with no data are left out.
        """
        if shares is None or not per_replica:
            return self._reduce_equal(reduce_op, per_replica)
        n = len(shares)
        scale = float(n) if reduce_op == tf.distribute.ReduceOp.SUM else 1.0
        even = tf.reduce_all(tf.abs(tf.stack(shares) - 1.0 / n) < 1e-6 / n)
        return tf.cond(
            even,
            lambda: self._reduce_equal(reduce_op, per_replica),
            lambda: [
                weighted_sum(vs, [s * scale for s in shares]) for vs in per_replica
            ],
        )

    def _reduce_equal(self, reduce_op, per_replica):
        if reduce_op == tf.distribute.ReduceOp.SUM:
            return [_sum(vs) for vs in per_replica]
        return self.aggregate(per_replica)

    def reduce_sparse(
        self,
        reduce_op: tf.distribute.ReduceOp,
        per_replica: Sequence[tf.IndexedSlices | tf.Tensor],
    ) -> tf.IndexedSlices | tf.Tensor:
        """Concatenates the replicas' rows; duplicates add up when applied.

        Under `SUM` this is exact (a scatter-add of the concatenation is the
        sum); under `MEAN` the values are divided by `n`. No dense table is
        ever built.
        """
        n = len(per_replica)
        if not all(isinstance(v, tf.IndexedSlices) for v in per_replica):
            dense = [tf.convert_to_tensor(v) for v in per_replica]
            return self.reduce(reduce_op, [dense])[0]
        out = tf.IndexedSlices(
            tf.concat([v.values for v in per_replica], axis=0),
            tf.concat([v.indices for v in per_replica], axis=0),
            per_replica[0].dense_shape,
        )
        if reduce_op == tf.distribute.ReduceOp.MEAN:
            out = tf.IndexedSlices(
                out.values / tf.cast(n, out.values.dtype), out.indices, out.dense_shape
            )
        return out


def _sum(values: Sequence[tf.Tensor]) -> tf.Tensor:
    if len(values) == 1:
        return tf.identity(values[0])
    return tf.add_n(list(values))
