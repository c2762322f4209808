"""Krum and Multi-Krum: keep the replicas whose nearest neighbours are closest."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.aggregators import combine, distances
from keras_psdist.aggregators.base import Aggregation, Aggregator
from keras_psdist.aggregators.configs import check_bool

REPORT_NAME = "selected"


class Krum(Aggregator):
    """The one replica whose n - f - 2 nearest neighbours are closest to it.

    Each replica i gets the score `sum of the n - f - 2 smallest D[i, j],
    j != i`, with `D[i, j]` the squared distance between the full vectors
    (every variable concatenated), and the replica with the smallest score is
    returned as is (ties: lowest index). This is Krum with the neighbour count
    of Blanchard et al., not Multi-Krum; see `MultiKrum` for the average of
    several. A replica with a NaN or Inf anywhere is at distance +inf from the
    others and is never selected.

    Condition: `num_replicas >= 2 * num_byzantine + 3`.

    Report: `selected[r]`, 1.0 for the chosen replica, 0.0 for the others.

    Sparse gradients: a dense block over the rows any replica touched (see
    `keras_psdist.aggregators.sparse`) is one more part of the full vector;
    rows nobody touched are zero for everyone and add nothing to a distance.

    Args:
        num_byzantine: The *f* this rule is built for, or `None` to take the
            strategy's. Defaults to `None`.

    Examples:

    >>> import tensorflow as tf
    >>> rule = Krum(num_byzantine=1)
    >>> column = [tf.constant([v]) for v in (1.0, 2.0, 3.0, 5.0, 100.0)]
    >>> result = rule.apply([column])
    >>> result.values[0].numpy().tolist()
    [2.0]
    >>> result.report["selected"].numpy().tolist()
    [0.0, 1.0, 0.0, 0.0, 0.0]

    References:
        Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine Learning with
        Adversaries: Byzantine Tolerant Gradient Descent", NeurIPS 2017.
    """

    report_names = (REPORT_NAME,)

    def check(self, num_replicas: int, num_byzantine: int = 0) -> None:
        super().check(num_replicas, num_byzantine)
        check_krum_condition(self, num_replicas, num_byzantine)

    def apply(
        self, per_replica: Sequence[Sequence[tf.Tensor]], state: Any = ()
    ) -> Aggregation:
        n = len(per_replica[0])
        geom = distances.geometry(per_replica)
        scores = krum_scores(distances.squared_distances(geom), n - self.f - 2)
        winner = distances.first_min(scores, geom.finite)
        values = select_replica(per_replica, winner)
        return Aggregation(values, {REPORT_NAME: tf.one_hot(winner, n)}, state)


class MultiKrum(Aggregator):
    """The average of the m replicas with the best Krum scores.

    Scores as `Krum` (the sum of the n - f - 2 smallest squared full-vector
    distances to the others), computed once; the m replicas with the
    smallest scores (ties: lowest index) are averaged. Non-finite replicas are
    never selected: if fewer than m replicas are finite, all the finite ones
    are averaged.

    Condition: `num_replicas >= 2 * num_byzantine + 3` and
    `1 <= m <= num_replicas - num_byzantine`.

    Report: `selected[r]`, 1.0 for the averaged replicas, 0.0 for the others.

    Sparse gradients: dense blocks over the touched rows, part of the full
    vector (see `Krum`).

    Args:
        num_byzantine: The *f* this rule is built for, or `None` to take the
            strategy's. Defaults to `None`.
        m: How many replicas to average, or `None` for `n - f`. Defaults to
            `None`.
        jit_compile: Compile the average with XLA. Defaults to `True`.

    Examples:

    >>> import tensorflow as tf
    >>> rule = MultiKrum(num_byzantine=1, m=2)
    >>> column = [tf.constant([v]) for v in (1.0, 2.0, 3.0, 5.0, 100.0)]
    >>> result = rule.apply([column])
    >>> result.values[0].numpy().tolist()
    [1.5]
    >>> result.report["selected"].numpy().tolist()
    [1.0, 1.0, 0.0, 0.0, 0.0]

    References:
        Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine Learning with
        Adversaries: Byzantine Tolerant Gradient Descent", NeurIPS 2017
        (Multi-Krum, Section 5).
    """

    needs_num_byzantine = True  # with m = None; see __init__
    without_num_byzantine = (
        "keeps and averages every replica: it is the plain mean, and defends "
        "against no faulty replica"
    )
    report_names = (REPORT_NAME,)

    def __init__(
        self,
        num_byzantine: int | None = None,
        *,
        m: int | None = None,
        jit_compile: bool = True,
    ):
        super().__init__(num_byzantine)
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ValueError(
                f"`m`, the number of replicas MultiKrum averages, must be an int >= 1 "
                f"or None (for n - num_byzantine). Received: m={m!r}"
            )
        self.m = m
        # With m set, f = 0 still selects the m most central replicas.
        self.needs_num_byzantine = m is None
        self.jit_compile = check_bool(type(self).__name__, "jit_compile", jit_compile)

    def check(self, num_replicas: int, num_byzantine: int = 0) -> None:
        super().check(num_replicas, num_byzantine)
        check_krum_condition(self, num_replicas, num_byzantine)
        if self.m is not None and self.m > num_replicas - num_byzantine:
            raise ValueError(
                f"MultiKrum averages m <= num_replicas - num_byzantine = "
                f"{num_replicas - num_byzantine} replicas. Received: m={self.m}, "
                f"{num_replicas} replicas, num_byzantine={num_byzantine}. Lower m "
                "or leave it None."
            )

    def apply(
        self, per_replica: Sequence[Sequence[tf.Tensor]], state: Any = ()
    ) -> Aggregation:
        n = len(per_replica[0])
        m = n - self.f if self.m is None else self.m
        if not 1 <= m <= n:
            raise ValueError(
                f"MultiKrum cannot average m={m} of {n} replicas. Received: "
                f"m={self.m}, num_byzantine={self.f}. Bind the rule to the "
                "strategy (`bind`) to check its configuration."
            )
        geom = distances.geometry(per_replica)
        scores = krum_scores(distances.squared_distances(geom), n - self.f - 2)
        nonfinite = tf.logical_not(geom.finite)
        ranks = distances.stable_ranks(scores, last=nonfinite)
        chosen = tf.logical_and(ranks < m, geom.finite)
        values = combine.mean_of_chosen(per_replica, chosen, self.jit_compile)
        return Aggregation(values, {REPORT_NAME: tf.cast(chosen, tf.float32)}, state)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "m": self.m, "jit_compile": self.jit_compile}


def krum_scores(
    squared: tf.Tensor, num_neighbours: int, members: tf.Tensor | None = None
) -> tf.Tensor:
    """Each replica's sum of its `num_neighbours` smallest distances to the others.

    Args:
        squared: float32 `[n, n]`, from `distances.squared_distances`.
        num_neighbours: How many distances a score sums (Krum: n - f - 2);
            at most 0 gives zero scores.
        members: Optional bool `[n]`: only distances between members count
            (Bulyan's remaining set); scores of non-members are meaningless.

    Returns:
        float32 `[n]`, +inf where fewer than `num_neighbours` finite distances
        exist.
    """
    n = squared.shape[0]
    others = tf.linalg.set_diag(squared, tf.fill([n], float("inf")))
    if members is not None:
        both = tf.logical_and(members[:, None], members[None, :])
        others = tf.where(both, others, float("inf"))
    if num_neighbours <= 0:
        return tf.zeros([n], tf.float32)
    nearest = tf.sort(others, axis=1)[:, :num_neighbours]
    return tf.reduce_sum(nearest, axis=1)


def select_replica(
    per_replica: Sequence[Sequence[tf.Tensor]], index: tf.Tensor
) -> list[tf.Tensor]:
    """Replica `index`'s values, every variable; zeros when `index == n`.

    A `switch_case` rather than a gather: the chosen tensors are handed on
    without copying the others into one stacked tensor first.
    """
    n = len(per_replica[0])
    branches = [
        lambda r=r: [tf.identity(column[r]) for column in per_replica] for r in range(n)
    ]
    branches.append(lambda: [tf.zeros_like(column[0]) for column in per_replica])
    return list(tf.switch_case(tf.cast(index, tf.int32), branches))


def check_krum_condition(
    rule: Aggregator, num_replicas: int, num_byzantine: int
) -> None:
    """Krum's condition: `n >= 2f + 3` (each score sums n - f - 2 >= f + 1 terms)."""
    needed = 2 * num_byzantine + 3
    if num_replicas < needed:
        raise ValueError(
            f"{type(rule).__name__} needs at least 2 * num_byzantine + 3 = {needed} "
            f"replicas. Received: {num_replicas} replicas, "
            f"num_byzantine={num_byzantine}. Add replicas or lower num_byzantine."
        )
