"""Minimum diameter averaging: the mean of the tightest n - f replicas."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from keras_psdist.aggregators import combine, distances, subsets
from keras_psdist.aggregators.base import Aggregation, Aggregator, check_honest_majority
from keras_psdist.aggregators.configs import check_bool

REPORT_NAME = "selected"
# The most subsets of n - f replicas MDA compares in one step: C(n, f) grows
# exponentially in f (C(16, 4) = 1,820, C(24, 6) = 134,596, C(32, 8) =
# 10,518,300); beyond this the rule is refused when bound.
MAX_SUBSETS = 200_000


class MinimumDiameterAveraging(Aggregator):
    """The mean of the n - f replicas whose largest pairwise distance is smallest.

    Over every subset S of n - f replicas (in lexicographic order), its
    diameter `max over i, j in S of ||x_i - x_j||`, the distance between the
    full vectors (every variable concatenated); the subset with the smallest
    diameter (ties: the first) is averaged. A replica with a NaN or Inf
    anywhere is at distance +inf from the others, so no subset with it wins
    while one without it exists. With f = 0 it is the mean.

    Exact, and exponential in f: each step compares C(n, f) subsets, which
    is practical up to about n = 24 with f = n / 4 (C(24, 6) = 134,596);
    a configuration over `MAX_SUBSETS` subsets is refused when bound.

    Condition: `num_replicas > 2 * num_byzantine`, and
    `C(num_replicas, num_byzantine) <= MAX_SUBSETS`.

    Report: `selected[r]`, 1.0 for the averaged replicas, 0.0 for the others.

    Sparse gradients: dense blocks over the touched rows, part of the full
    vector (as `Krum`).

    Args:
        num_byzantine: The *f* this rule is built for, or `None` to take the
            strategy's. Defaults to `None`.
        jit_compile: Compile the average with XLA. Defaults to `True`.

    Examples:

    >>> import tensorflow as tf
    >>> rule = MinimumDiameterAveraging(num_byzantine=1)
    >>> column = [tf.constant([v]) for v in (1.0, 2.0, 3.0, 100.0)]
    >>> result = rule.apply([column])
    >>> result.values[0].numpy().tolist()
    [2.0]
    >>> result.report["selected"].numpy().tolist()
    [1.0, 1.0, 1.0, 0.0]

    References:
        El Mhamdi, Guerraoui, Rouault, "The Hidden Vulnerability of
        Distributed Learning in Byzantium", ICML 2018 (MDA); ByzFL's `MDA`
        (LPD-EPFL/byzfl).
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
            "about n = 24 with f = n / 4",
        )

    def apply(
        self, per_replica: Sequence[Sequence[tf.Tensor]], state: Any = ()
    ) -> Aggregation:
        n = len(per_replica[0])
        k = n - self.f
        geom = distances.geometry(per_replica)
        every = subsets.all_subsets(n, k)
        chosen = tf.gather(
            tf.constant(subsets.masks(every, n)),
            _tightest(distances.squared_distances(geom), every, n),
        )
        chosen = tf.logical_and(chosen, geom.finite)
        values = combine.mean_of_chosen(per_replica, chosen, self.jit_compile)
        return Aggregation(values, {REPORT_NAME: tf.cast(chosen, tf.float32)}, state)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "jit_compile": self.jit_compile}


def _tightest(squared: tf.Tensor, every: np.ndarray, n: int) -> tf.Tensor:
    """The index of the first of the subsets `every` with the smallest
    diameter (squared distances order subsets as distances do)."""
    k = every.shape[1]
    if k < 2:
        return tf.constant(0, tf.int64)
    first, second = np.triu_indices(k, 1)
    pairs = every[:, first] * n + every[:, second]  # [S, pairs]
    diameters = tf.reduce_max(tf.gather(tf.reshape(squared, [-1]), pairs), axis=1)
    # NaN (never from `squared_distances`, which gives +inf) would be skipped.
    return tf.argmin(diameters, output_type=tf.int64)
