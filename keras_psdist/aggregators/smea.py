"""Smallest maximum eigenvalue averaging: the mean of the least spread n - f replicas."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.aggregators import combine, distances, spectra, subsets
from keras_psdist.aggregators.base import Aggregation, Aggregator, check_honest_majority
from keras_psdist.aggregators.configs import check_bool

REPORT_NAME = "selected"
# The most subsets of n - f replicas SMEA compares in one step: an
# eigenvalue problem of size n - f each (C(16, 4) = 1,820; C(20, 5) =
# 15,504; C(24, 6) = 134,596 is refused).
MAX_SUBSETS = 20_000


class SMEA(Aggregator):
    """The mean of the n - f replicas whose covariance has the smallest top eigenvalue.

    Over every subset S of n - f replicas (in lexicographic order), the
    largest eigenvalue of its empirical covariance over the full vectors
    (every variable concatenated), `Sigma_S = 1/|S| sum_{i in S} (x_i -
    mu_S)(x_i - mu_S)^T`; the subset with the smallest (ties: the first) is
    averaged. The eigenvalues come exactly from the replicas' Gram matrix
    (`spectra.py`): one pass over the values, then C(n, f) eigenvalue
    problems of size n - f. A replica with a NaN or Inf anywhere makes every
    subset holding it +inf. With f = 0 it is the mean.

    Exact, and exponential in f: practical up to about n = 20 with f = n / 4
    (C(20, 5) = 15,504 subsets); a configuration over `MAX_SUBSETS` subsets
    is refused when bound.

    Condition: `num_replicas > 2 * num_byzantine`, and
    `C(num_replicas, num_byzantine) <= MAX_SUBSETS`.

    Report: `selected[r]`, 1.0 for the averaged replicas, 0.0 for the others.

    Args:
        num_byzantine: The *f* this rule is built for, or `None` to take the
            strategy's. Defaults to `None`.
        jit_compile: Compile the average with XLA. Defaults to `True`.

    Examples:

    >>> import tensorflow as tf
    >>> rule = SMEA(num_byzantine=1)
    >>> column = [tf.constant([v, 0.0]) for v in (1.0, 2.0, 3.0, 100.0)]
    >>> result = rule.apply([column])
    >>> result.values[0].numpy().tolist()
    [2.0, 0.0]
    >>> result.report["selected"].numpy().tolist()
    [1.0, 1.0, 1.0, 0.0]

    References:
        Allouah, Guerraoui, Gupta, Pinot, Stephan, "On the Privacy-Robustness-
        Utility Trilemma in Distributed Learning", ICML 2023 (SMEA); ByzFL's
        `SMEA` (LPD-EPFL/byzfl), there with one power-method step from a
        random vector for each eigenvalue, here exact.
    """

    needs_num_byzantine = True
    without_num_byzantine = (
        "averages every replica: it is the plain mean, and defends against no "
        "faulty replica"
    )
    report_names = (REPORT_NAME,)

    def __init__(self, num_byzantine: int | None = None, *, jit_compile: bool = True):
        super().__init__(num_byzantine)
        self.jit_compile = check_bool(type(self).__name__, "jit_compile", jit_compile)

    def check(self, num_replicas: int, num_byzantine: int = 0) -> None:
        super().check(num_replicas, num_byzantine)
        check_honest_majority(self, num_replicas, num_byzantine)
        subsets.check_subset_count(
            self,
            num_replicas,
            num_byzantine,
            MAX_SUBSETS,
            "about n = 20 with f = n / 4",
        )

    def apply(
        self, per_replica: Sequence[Sequence[tf.Tensor]], state: Any = ()
    ) -> Aggregation:
        n = len(per_replica[0])
        geom = distances.geometry(per_replica)
        every = subsets.all_subsets(n, n - self.f)
        held = subsets.masks(every, n)
        spread = spectra.largest_eigenvalues(tf.cast(geom.gram, tf.float64), every)
        # A subset with a non-finite replica never wins while one without does.
        clean = tf.reduce_all(
            tf.logical_or(tf.constant(~held), geom.finite[None, :]), axis=1
        )
        spread = tf.where(clean, spread, tf.constant(float("inf"), tf.float64))
        chosen = tf.gather(tf.constant(held), _first_smallest(spread))
        chosen = tf.logical_and(chosen, geom.finite)
        values = combine.mean_of_chosen(per_replica, chosen, self.jit_compile)
        return Aggregation(values, {REPORT_NAME: tf.cast(chosen, tf.float32)}, state)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "jit_compile": self.jit_compile}


def _first_smallest(values: tf.Tensor) -> tf.Tensor:
    """The lowest index of the smallest of `values` (no NaN): ties to the
    first subset, which `tf.argmin` does not promise."""
    count = tf.shape(values, out_type=tf.int64)[0]
    index = tf.range(count, dtype=tf.int64)
    return tf.reduce_min(tf.where(values <= tf.reduce_min(values), index, count))
