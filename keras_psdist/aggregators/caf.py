"""Covariance-bound agnostic filter: down-weight along the covariance's top direction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.aggregators import combine, distances, spectra
from keras_psdist.aggregators.base import Aggregation, Aggregator, check_honest_majority
from keras_psdist.aggregators.configs import check_bool

REPORT_NAME = "weight"


class CAF(Aggregator):
    """A weighted mean whose weights a spectral filter lowers, without a covariance bound.

    Weights `c_i = 1` (0 for a replica with a NaN or Inf anywhere). While
    `sum_i c_i > n - 2f`:

    1. `mu_c`, the mean weighted by c, and the top eigenvalue `lambda` and
       eigenvector `v` of the weighted covariance `Sigma_c = sum_i c_i (x_i -
       mu_c)(x_i - mu_c)^T / sum_i c_i`, over the full vectors;
    2. if `lambda` is the smallest so far, `mu_c` is the answer so far;
    3. `tau_i = <x_i - mu_c, v>^2`, and `c_i <- c_i (1 - tau_i / tau_max)`,
       `tau_max` the largest over the replicas still weighted.

    The answer is the `mu_c` of the smallest `lambda` met (the mean when
    f = 0: the loop does not run). Each round zeroes the weight of at least
    one replica still weighted, so at most 2f rounds run. The eigenpairs come
    exactly from the replicas' Gram matrix (`spectra.py`), one pass over the
    values: polynomial in n, unlike SMEA.

    Condition: `num_replicas > 2 * num_byzantine`.

    Report: `weight[r]`, replica r's weight in the answer (summing to 1).

    Args:
        num_byzantine: The *f* this rule is built for, or `None` to take the
            strategy's. Defaults to `None`.
        jit_compile: Compile the weighted sum with XLA. Defaults to `True`.

    Examples:

    >>> import tensorflow as tf
    >>> rule = CAF(num_byzantine=1)
    >>> column = [tf.constant([v, 0.0]) for v in (1.0, 2.0, 3.0, 100.0)]
    >>> result = rule.apply([column])
    >>> [round(float(v), 3) for v in result.values[0]]  # 100 is filtered out first
    [2.007, 0.0]
    >>> [round(float(w), 3) for w in result.report["weight"]]
    [0.33, 0.333, 0.337, 0.0]

    References:
        Allouah, Guerraoui, Stephan, "Towards Trustworthy Federated Learning
        with Untrusted Participants", ICML 2025 (CAF); ByzFL's `CAF`
        (LPD-EPFL/byzfl), there with `tau_max` over every replica and one
        power-method step from a random vector for each eigenpair, here the
        largest over the replicas still weighted (so that every round zeroes
        one) and exact eigenpairs.
    """

    needs_num_byzantine = True
    without_num_byzantine = (
        "filters nothing: it is the plain mean, and defends against no faulty replica"
    )
    report_names = (REPORT_NAME,)

    def __init__(self, num_byzantine: int | None = None, *, jit_compile: bool = True):
        super().__init__(num_byzantine)
        self.jit_compile = check_bool(type(self).__name__, "jit_compile", jit_compile)

    def check(self, num_replicas: int, num_byzantine: int = 0) -> None:
        super().check(num_replicas, num_byzantine)
        check_honest_majority(self, num_replicas, num_byzantine)

    def apply(
        self, per_replica: Sequence[Sequence[tf.Tensor]], state: Any = ()
    ) -> Aggregation:
        n = len(per_replica[0])
        geom = distances.geometry(per_replica)
        weights = filtered_weights(
            tf.cast(geom.gram, tf.float64), geom.finite, n - 2 * self.f
        )
        [values] = zip(
            *combine.weighted_sums(
                per_replica, tf.cast(weights, tf.float32)[None, :], self.jit_compile
            ),
            strict=True,
        )
        return Aggregation(
            list(values), {REPORT_NAME: tf.cast(weights, tf.float32)}, state
        )

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "jit_compile": self.jit_compile}


def filtered_weights(gram: tf.Tensor, finite: tf.Tensor, stop_at: int) -> tf.Tensor:
    """The answer's weights (summing to 1) of the filter in the class doc.

    Args:
        gram: float64 `[n, n]`, the raw Gram matrix (zero rows for
            non-finite replicas).
        finite: bool `[n]`.
        stop_at: `n - 2f`: the rounds run while the weights sum to more.
    """
    n = gram.shape[0]
    c = tf.cast(finite, tf.float64)
    best = c / tf.reduce_sum(c)
    inf = tf.constant(float("inf"), tf.float64)

    def more(c, best, smallest, done):
        return tf.logical_and(tf.logical_not(done), tf.reduce_sum(c) > stop_at)

    def round_(c, best, smallest, done):
        w = c / tf.reduce_sum(c)
        value, tau = spectra.top_eigen(gram, w)
        better = value < smallest
        best = tf.where(better, w, best)
        smallest = tf.where(better, value, smallest)
        tau_max = tf.reduce_max(tf.where(c > 0, tau, tf.zeros_like(tau)))
        # All weighted replicas at one point: nothing is left to filter.
        done = tau_max <= 0
        c = tf.where(
            done, c, tf.maximum(c * (1.0 - tf.math.divide_no_nan(tau, tau_max)), 0.0)
        )
        # The replica of tau_max is exactly 0, not round-off above it.
        c = tf.where(tf.logical_and(c > 0, tau >= tau_max), tf.zeros_like(c), c)
        return c, best, smallest, done

    _, best, _, _ = tf.while_loop(
        more,
        round_,
        (c, best, inf, tf.constant(False)),
        maximum_iterations=n,
    )
    return best
