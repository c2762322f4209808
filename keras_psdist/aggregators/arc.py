"""Adaptive robust clipping: clip the largest replicas to the norm of the next one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.aggregators import distances
from keras_psdist.aggregators.base import Aggregator, check_honest_majority
from keras_psdist.aggregators.clipping import clip
from keras_psdist.aggregators.configs import check_bool
from keras_psdist.aggregators.pre_aggregation import PreAggregation, Transformed


def clipped_count(num_replicas: int, num_byzantine: int) -> int:
    """ARC's k: how many replicas it clips, `floor(2 * (f / n) * (n - f))`.

    Computed in integers, `2 f (n - f) // n`; ByzFL's float expression gives
    the same for every n <= 200 with n > 2f.

    >>> [clipped_count(n, 1) for n in (3, 4, 8, 32)]
    [1, 1, 1, 1]
    >>> [clipped_count(n, 2) for n in (5, 8, 32)], clipped_count(32, 8)
    ([2, 3, 3], 12)
    """
    return 2 * num_byzantine * (num_replicas - num_byzantine) // num_replicas


class ARC(PreAggregation):
    """Adaptive robust clipping: clips the k largest replicas, then runs a rule.

    With n replicas and f = `num_byzantine`, `k = floor(2 * (f / n) * (n - f))`
    (`clipped_count`). The threshold is the (k+1)-th largest replica norm, the
    norm over the full vector (every variable concatenated, as the
    whole-vector rules measure it, `distances.squared_norms`); every replica
    above it is scaled to it, `min(1, threshold / ||x_r||) * x_r`, keeping its
    direction. Those are exactly the k largest (ties at the threshold are left
    as they are, which changes nothing), so with f = 0 nothing is clipped. The
    inner rule then aggregates the n clipped values with the same n and f.

    A replica with a NaN or Inf anywhere (or whose squared norm overflows
    float32) counts as the largest and becomes zeros, as the whole-vector
    rules treat a non-finite replica. With at most f of them the threshold is
    the norm of a finite replica (k >= f when n >= 2f).

    Condition: `num_replicas > 2 * num_byzantine` and the inner rule's
    condition for the same n and f.

    Report: the inner rule's.

    Sparse gradients: `Aggregator.step` gives them dense blocks over the rows
    any replica touched (`keras_psdist.aggregators.sparse`). The rows nobody
    touched are zero, so the norms over the blocks are the norms over the
    whole table, and the blocks are scaled like any other variable; the table
    is never densified.

    Args:
        aggregator: The inner rule: a string id, a config dict or an
            `Aggregator`. Defaults to `"trimmed_mean"`.
        num_byzantine: The *f* this rule is built for, or `None` to take the
            inner rule's, else the strategy's. Defaults to `None`.
        jit_compile: Compile the scaling with XLA. Defaults to `True`.

    Examples:

    >>> import tensorflow as tf
    >>> rule = ARC("median", num_byzantine=1)  # n = 4: k = floor(2 * 1/4 * 3) = 1
    >>> column = [tf.constant(v) for v in ([1.0, 0.0], [0.0, 2.0], [3.0, 4.0], [0.0, 50.0])]
    >>> [out] = rule.aggregate([column])  # [0, 50] is clipped to norm 5: [0, 5]
    >>> out.numpy().tolist()
    [0.5, 3.0]
    >>> ARC(num_byzantine=2).check(num_replicas=4, num_byzantine=2)
    Traceback (most recent call last):
      ...
    ValueError: ARC needs more than 2 * num_byzantine = 4 replicas (an honest majority). Received: 4 replicas, num_byzantine=2. Add replicas or lower num_byzantine.

    References:
        Allouah, Guerraoui, Gupta, Jellouli, Rizk, Stephan, "Boosting
        Robustness by Clipping Gradients in Distributed Learning",
        arXiv:2405.14432, 2024 (later versions: "Adaptive Gradient Clipping
        for Robust Federated Learning"), Adaptive Robust Clipping. The
        variant of ByzFL's `ARC` (LPD-EPFL/byzfl,
        `byzfl/aggregators/preaggregators.py`: `nb_clipped =
        int((2 * f / n) * (n - f))`, threshold the norm of the largest
        unclipped vector), over the full vector.
    """

    needs_num_byzantine = True
    without_num_byzantine = "clips no replica: it adds no defence to its inner rule"

    def __init__(
        self,
        aggregator: str | dict[str, Any] | Aggregator = "trimmed_mean",
        *,
        num_byzantine: int | None = None,
        jit_compile: bool = True,
    ):
        super().__init__(aggregator, num_byzantine)
        self.jit_compile = check_bool(type(self).__name__, "jit_compile", jit_compile)

    def check(self, num_replicas: int, num_byzantine: int = 0) -> None:
        # ARC's own condition first: its error names ARC, not the inner rule.
        Aggregator.check(self, num_replicas, num_byzantine)
        check_honest_majority(self, num_replicas, num_byzantine)
        super().check(num_replicas, num_byzantine)

    def transform(self, per_replica: Sequence[Sequence[tf.Tensor]]) -> Transformed:
        n = len(per_replica[0])
        squared = distances.squared_norms(per_replica)  # +inf: non-finite
        k = clipped_count(n, self.f)
        largest_first = tf.sort(squared, direction="DESCENDING")
        threshold = tf.sqrt(largest_first[k])
        return Transformed(clip(per_replica, squared, threshold, self.jit_compile))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "jit_compile": self.jit_compile}
