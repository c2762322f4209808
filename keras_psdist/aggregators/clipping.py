"""Static clipping: scale every replica to a norm of at most a threshold, then run a rule."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.aggregators import combine, distances
from keras_psdist.aggregators.base import Aggregator
from keras_psdist.aggregators.configs import check_bool
from keras_psdist.aggregators.pre_aggregation import PreAggregation, Transformed


class Clipping(PreAggregation):
    """Scales every replica to a norm of at most `threshold`, then runs a rule.

    Each replica `x_r` becomes `min(1, threshold / ||x_r||) * x_r`, the norm
    over the full vector (every variable concatenated, as the whole-vector
    rules measure it, `distances.squared_norms`): its direction is kept. The
    inner rule then aggregates the n clipped values with the same n and f.
    A replica with a NaN or Inf anywhere (or whose squared norm overflows
    float32) becomes zeros, as the whole-vector rules treat a non-finite
    replica.

    Clipping bounds how far any one replica can pull the aggregate, but a
    fixed threshold helps against some attacks and hurts against others
    (Allouah et al.); `ARC` takes the threshold from the replicas' norms
    instead.

    Condition: the inner rule's condition for the same n and f.

    Report: the inner rule's.

    Sparse gradients: `Aggregator.step` gives them dense blocks over the rows
    any replica touched (`keras_psdist.aggregators.sparse`). The rows nobody
    touched are zero, so the norm over the blocks is the norm over the whole
    table, and the blocks are scaled like any other variable; the table is
    never densified.

    Args:
        aggregator: The inner rule: a string id, a config dict or an
            `Aggregator`. Defaults to `"trimmed_mean"`, which is the mean
            when `num_byzantine` is 0.
        threshold: The largest norm a replica keeps, a finite number > 0, in
            the units of the true-scale gradient's norm. Defaults to 1.0.
        num_byzantine: The *f* this rule is built for, or `None` to take the
            inner rule's, else the strategy's. Defaults to `None`.
        jit_compile: Compile the scaling with XLA. Defaults to `True`.

    Raises:
        ValueError: for a `threshold` that is not a finite number > 0.

    Examples:

    >>> import tensorflow as tf
    >>> rule = Clipping("mean", threshold=5.0)
    >>> column = [tf.constant(v) for v in ([3.0, 4.0], [0.0, 1.0], [30.0, 40.0])]
    >>> [out] = rule.aggregate([column])  # [30, 40] becomes [3, 4]
    >>> out.numpy().tolist()
    [2.0, 3.0]
    >>> Clipping(threshold=0.0)
    Traceback (most recent call last):
      ...
    ValueError: Clipping's `threshold` must be a finite number > 0. Received: threshold=0.0. Pass the largest norm a replica's full gradient may keep, e.g. threshold=1.0.

    References:
        Allouah, Guerraoui, Gupta, Jellouli, Rizk, Stephan, "Boosting
        Robustness by Clipping Gradients in Distributed Learning",
        arXiv:2405.14432, 2024 (later versions: "Adaptive Gradient Clipping
        for Robust Federated Learning"): static clipping, the baseline of
        their adaptive rule. As ByzFL's `Clipping`
        (LPD-EPFL/byzfl, `byzfl/aggregators/preaggregators.py`), over the
        full vector.
    """

    def __init__(
        self,
        aggregator: str | dict[str, Any] | Aggregator = "trimmed_mean",
        *,
        threshold: float = 1.0,
        num_byzantine: int | None = None,
        jit_compile: bool = True,
    ):
        if (
            isinstance(threshold, bool)
            or not isinstance(threshold, numbers.Real)
            or not math.isfinite(threshold)
            or not threshold > 0
        ):
            raise ValueError(
                "Clipping's `threshold` must be a finite number > 0. Received: "
                f"threshold={threshold!r}. Pass the largest norm a replica's full "
                "gradient may keep, e.g. threshold=1.0."
            )
        super().__init__(aggregator, num_byzantine)
        self.threshold = float(threshold)
        self.jit_compile = check_bool(type(self).__name__, "jit_compile", jit_compile)

    def transform(self, per_replica: Sequence[Sequence[tf.Tensor]]) -> Transformed:
        squared = distances.squared_norms(per_replica)
        return Transformed(clip(per_replica, squared, self.threshold, self.jit_compile))

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "threshold": self.threshold,
            "jit_compile": self.jit_compile,
        }


def clip(
    per_replica: Sequence[Sequence[tf.Tensor]],
    squared_norms: tf.Tensor,
    threshold: float | tf.Tensor,
    jit_compile: bool = True,
) -> list[list[tf.Tensor]]:
    """Scales each replica to a norm of at most `threshold`; zeros if non-finite.

    Args:
        per_replica: `per_replica[v][r]`.
        squared_norms: float32 `[n]` from `distances.squared_norms` (+inf for
            a non-finite replica).
        threshold: A float32 scalar >= 0, or +inf for no clipping.
        jit_compile: Compile the scaling with XLA where the shapes are static.

    Returns:
        The same structure as `per_replica`, new tensors.
    """
    norms = tf.sqrt(squared_norms)
    threshold = tf.cast(threshold, tf.float32)
    # `norms > threshold` also keeps 0 / 0 out when both are 0.
    scales = tf.where(norms > threshold, threshold / norms, 1.0)
    scales = tf.where(tf.math.is_finite(norms), scales, 0.0)
    return combine.scaled(per_replica, scales, jit_compile)
