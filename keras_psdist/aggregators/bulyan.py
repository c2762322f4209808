"""Bulyan: Krum rounds to pick a set, then a trimmed mean around its median."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.aggregators import distances
from keras_psdist.aggregators.base import Aggregation, Aggregator
from keras_psdist.aggregators.configs import check_bool
from keras_psdist.aggregators.krum import REPORT_NAME, krum_scores
from keras_psdist.aggregators.order_statistics import sort_columns


class Bulyan(Aggregator):
    """Krum, applied n - 2f times, then a coordinate-wise mean around the median.

    Selection: theta = n - 2f rounds of Krum on the remaining set R (at first
    every replica): a member's score is the sum of its `max(|R| - f - 2, 0)`
    smallest squared full-vector distances to the other members; the member
    with the smallest score (ties: lowest index) moves from R to the selected
    set S. A non-finite replica is never selected while a finite one remains.

    Aggregation: beta = theta - 2f. At each coordinate, the theta values of S
    are sorted and m is their median (even count: mean of the two middle
    values); among the windows of beta consecutive sorted values
    `s_t .. s_{t+beta-1}`, `0 <= t <= 2f`, the one minimising
    `max(m - s_t, s_{t+beta-1} - m)` (ties: smallest t) is averaged. This is
    the "beta closest to the median" step of El Mhamdi et al. with the
    closest values taken as a window of the sorted order.

    Condition: `num_replicas >= 4 * num_byzantine + 3`.

    Report: `selected[r]`, 1.0 for the replicas of S, 0.0 for the others.

    Sparse gradients: dense blocks over the touched rows are part of the full
    vector for the selection and are aggregated coordinate-wise like any
    other variable (see `keras_psdist.aggregators.sparse`).

    Args:
        num_byzantine: The *f* this rule is built for, or `None` to take the
            strategy's. Defaults to `None`.
        jit_compile: Run the coordinate-wise phase (a sorting network) under
            XLA. Defaults to `True`.

    Examples:

    >>> import tensorflow as tf
    >>> rule = Bulyan(num_byzantine=1)
    >>> column = [tf.constant([v]) for v in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 100.0)]
    >>> result = rule.apply([column])
    >>> result.values[0].numpy().tolist()  # S = 1..5; the window 2, 3, 4
    [3.0]
    >>> result.report["selected"].numpy().tolist()
    [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0]

    References:
        El Mhamdi, Guerraoui, Rouault, "The Hidden Vulnerability of
        Distributed Learning in Byzantium", ICML 2018.
    """

    coordinatewise = True
    needs_num_byzantine = True
    without_num_byzantine = (
        "selects and keeps every replica: it is the plain mean, and defends "
        "against no faulty replica"
    )
    report_names = (REPORT_NAME,)

    def __init__(self, num_byzantine: int | None = None, *, jit_compile: bool = True):
        super().__init__(num_byzantine)
        self.jit_compile = check_bool(type(self).__name__, "jit_compile", jit_compile)

    def check(self, num_replicas: int, num_byzantine: int = 0) -> None:
        super().check(num_replicas, num_byzantine)
        needed = 4 * num_byzantine + 3
        if num_replicas < needed:
            raise ValueError(
                f"Bulyan needs at least 4 * num_byzantine + 3 = {needed} replicas. "
                f"Received: {num_replicas} replicas, num_byzantine={num_byzantine}. "
                "Add replicas or lower num_byzantine."
            )

    def apply(
        self, per_replica: Sequence[Sequence[tf.Tensor]], state: Any = ()
    ) -> Aggregation:
        n, f = len(per_replica[0]), self.f
        theta = n - 2 * f
        beta = theta - 2 * f
        if beta < 1:
            raise ValueError(
                f"Bulyan with num_byzantine={f} keeps no value of {n} replicas "
                f"(n - 4f = {beta}). Received: {n} replicas, num_byzantine={f}. "
                "Add replicas or lower num_byzantine."
            )
        geom = distances.geometry(per_replica)
        squared = distances.squared_distances(geom)
        remaining = tf.ones([n], tf.bool)
        chosen = tf.zeros([n], tf.bool)
        for round_ in range(theta):
            scores = krum_scores(squared, n - round_ - f - 2, members=remaining)
            eligible = tf.logical_and(remaining, geom.finite)
            eligible = tf.where(tf.reduce_any(eligible), eligible, remaining)
            hit = tf.equal(tf.range(n), distances.first_min(scores, eligible))
            remaining = tf.logical_and(remaining, tf.logical_not(hit))
            chosen = tf.logical_or(chosen, hit)
        kept = tf.logical_and(chosen, geom.finite)
        columns = [list(column) for column in per_replica]
        static = all(x.shape.is_fully_defined() for column in columns for x in column)
        kernel = _kernel_xla if self.jit_compile and static else _kernel
        values = kernel(columns, chosen, kept, theta, beta)
        return Aggregation(values, {REPORT_NAME: tf.cast(chosen, tf.float32)}, state)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "jit_compile": self.jit_compile}


def _around_median(columns, chosen, kept, theta, beta):
    """Per coordinate: the mean of the beta sorted values of S nearest the median.

    Replicas outside S become +inf and sort above S's theta values; selected
    non-finite replicas (only when more than f are non-finite) count as 0.
    """
    outputs = []
    for column in columns:
        values = []
        for r, x in enumerate(column):
            outside = tf.fill(tf.shape(x), tf.constant(float("inf"), x.dtype))
            values.append(
                tf.where(kept[r], x, tf.where(chosen[r], tf.zeros_like(x), outside))
            )
        s = sort_columns(values)[:theta]
        mid = (s[(theta - 1) // 2] + s[theta // 2]) / tf.cast(2, s[0].dtype)
        best_cost = tf.maximum(mid - s[0], s[beta - 1] - mid)
        best = tf.zeros(tf.shape(mid), tf.int32)
        for t in range(1, theta - beta + 1):
            cost = tf.maximum(mid - s[t], s[t + beta - 1] - mid)
            better = cost < best_cost
            best_cost = tf.where(better, cost, best_cost)
            best = tf.where(better, t, best)
        total = tf.zeros_like(mid)
        for k in range(theta):
            inside = tf.logical_and(best <= k, k < best + beta)
            total += tf.where(inside, s[k], tf.zeros_like(s[k]))
        outputs.append(total / tf.cast(beta, total.dtype))
    return outputs


_kernel = tf.function(_around_median, autograph=False)
_kernel_xla = tf.function(_around_median, autograph=False, jit_compile=True)
