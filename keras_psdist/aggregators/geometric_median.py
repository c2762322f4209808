"""The geometric median of the full vectors, by smoothed Weiszfeld iterations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.aggregators import combine, distances
from keras_psdist.aggregators.base import Aggregation, Aggregator, check_honest_majority
from keras_psdist.aggregators.configs import check_bool

REPORT_NAME = "weight"


class GeometricMedian(Aggregator):
    """The point minimising the sum of full-vector distances to the replicas.

    Smoothed Weiszfeld iterations, as in RFA (Pillutla et al.): start from
    `z_0`, the coordinate-wise median (non-finite replicas counted as zeros);
    then, `iterations` times, `w_i = 1 / max(smoothing, ||z - x_i||)` with the
    norm over the full vector (every variable concatenated) and
    `z = sum_i w_i x_i / sum_i w_i`. A replica with a NaN or Inf anywhere gets
    `w_i = 0`.

    Only the weights are iterated: every `z` after the first is a
    combination of the replicas, so its distances to them follow from one
    Gram matrix of the replicas minus `z_0` (see `distances`), and the values
    are combined once at the end. One pass over the inputs for the median,
    one for the Gram matrix and one for the result, whatever `iterations` is.

    Condition: `num_replicas > 2 * num_byzantine` (breakdown point 1/2).

    Report: `weight[r]`, replica r's share `w_r / sum_i w_i` in the last
    iteration.

    Sparse gradients: dense blocks over the touched rows are part of the full
    vector (see `keras_psdist.aggregators.sparse`).

    Args:
        num_byzantine: The *f* this rule is built for, or `None` to take the
            strategy's. Only checked against the condition; the rule itself
            does not use f. Defaults to `None`.
        iterations: Weiszfeld iterations, an int >= 1. Defaults to 8.
        smoothing: The smallest distance used in a weight, a float > 0
            (the smoothing nu of RFA). Defaults to `1e-6`.
        jit_compile: Compile the median and the final sum with XLA. Defaults
            to `True`.

    Examples:

    >>> import tensorflow as tf
    >>> rule = GeometricMedian(iterations=50)
    >>> points = [(0.0, 0.0), (4.0, 0.0), (0.0, 4.0), (4.0, 4.0), (2.0, 2.0), (100.0, 100.0)]
    >>> column = [tf.constant(p) for p in points]
    >>> [out] = rule.aggregate([column])  # the mean is (18.3, 18.3)
    >>> [round(v, 1) for v in out.numpy().tolist()]
    [2.0, 2.0]

    References:
        Pillutla, Kakade, Harchaoui, "Robust Aggregation for Federated
        Learning", IEEE Transactions on Signal Processing 70, 2022.
    """

    report_names = (REPORT_NAME,)

    def __init__(
        self,
        num_byzantine: int | None = None,
        *,
        iterations: int = 8,
        smoothing: float = 1e-6,
        jit_compile: bool = True,
    ):
        super().__init__(num_byzantine)
        check_iterations(self, iterations)
        if (
            isinstance(smoothing, bool)
            or not isinstance(smoothing, int | float)
            or not smoothing > 0
        ):
            raise ValueError(
                f"GeometricMedian's `smoothing` must be a float > 0. Received: smoothing={smoothing!r}"
            )
        self.iterations = iterations
        self.smoothing = float(smoothing)
        self.jit_compile = check_bool(type(self).__name__, "jit_compile", jit_compile)

    def check(self, num_replicas: int, num_byzantine: int = 0) -> None:
        super().check(num_replicas, num_byzantine)
        check_honest_majority(self, num_replicas, num_byzantine)

    def apply(
        self, per_replica: Sequence[Sequence[tf.Tensor]], state: Any = ()
    ) -> Aggregation:
        n = len(per_replica[0])
        finite = distances.finite_replicas(per_replica)
        start = combine.zeroed_median(per_replica, finite, self.jit_compile)
        geom = distances.geometry(per_replica, center=start, finite=finite)
        coeffs = tf.zeros([n], tf.float32)  # z = z_0
        for _ in range(self.iterations):
            dist = tf.sqrt(distances.squared_distances_to(geom, coeffs))
            w = tf.where(geom.finite, 1.0 / tf.maximum(dist, self.smoothing), 0.0)
            coeffs = w / tf.maximum(tf.reduce_sum(w), 1e-30)
        sums = combine.weighted_sums(per_replica, coeffs[None, :], self.jit_compile)
        return Aggregation([rows[0] for rows in sums], {REPORT_NAME: coeffs}, state)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "iterations": self.iterations,
            "smoothing": self.smoothing,
            "jit_compile": self.jit_compile,
        }


def check_iterations(rule: Aggregator, iterations: Any) -> None:
    """Raises unless `iterations` is an int >= 1, naming the rule."""
    if (
        isinstance(iterations, bool)
        or not isinstance(iterations, int)
        or iterations < 1
    ):
        raise ValueError(
            f"{type(rule).__name__}'s `iterations` must be an int >= 1. "
            f"Received: iterations={iterations!r}"
        )
