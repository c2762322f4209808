"""Bucketing: average random groups of replicas, then run a rule on the means."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.aggregators import combine
from keras_psdist.aggregators.base import Aggregator
from keras_psdist.aggregators.configs import check_bool
from keras_psdist.aggregators.pre_aggregation import PreAggregation, Transformed


class Bucketing(PreAggregation):
    """Runs a rule on the means of random buckets of replicas.

    Every step the n replicas are shuffled and cut into consecutive buckets of
    `bucket_size` (the last one smaller when `bucket_size` does not divide n),
    giving ceil(n / s) buckets; the inner rule aggregates the buckets' means
    with the same f. Averaging shrinks the honest replicas' spread under
    heterogeneous data, and at most f buckets hold a Byzantine replica
    (Karimireddy et al.). A bucket holding a NaN is NaN; the inner rule
    handles it like any non-finite value. The shuffle moves no values (the
    replicas are read in the new order) and each bucket's mean is one sum,
    so every value is read once (`combine.bucket_means`).

    Condition: the inner rule's condition for ceil(n / bucket_size) values
    and the same f.

    Report: the inner rule's, mapped back to replicas: `report[r]` is the
    inner report of the bucket that held replica r.

    Sparse gradients: dense blocks over the touched rows are averaged like
    any other variable (see `keras_psdist.aggregators.sparse`).

    Args:
        aggregator: The inner rule: a string id, a config dict or an
            `Aggregator`. Defaults to `"trimmed_mean"`.
        bucket_size: Replicas per bucket, an int >= 1. Defaults to 2.
        seed: The shuffle's op-level seed (`tf.random.shuffle`), or `None`.
            Defaults to `None`.
        num_byzantine: The *f* this rule is built for, or `None` to take the
            inner rule's, else the strategy's. Defaults to `None`.
        jit_compile: Compile the bucket means with XLA. Defaults to `True`.

    Examples:

    >>> import tensorflow as tf
    >>> rule = Bucketing("median", bucket_size=2)
    >>> column = [tf.constant([v]) for v in (1.0, 1.0, 1.0, 1.0, 1.0, 1.0)]
    >>> [out] = rule.aggregate([column])
    >>> out.numpy().tolist()
    [1.0]
    >>> rule = Bucketing("krum", bucket_size=2, num_byzantine=1)
    >>> rule.check(num_replicas=8, num_byzantine=1)
    Traceback (most recent call last):
      ...
    ValueError: Bucketing turns 8 replicas into ceil(8 / bucket_size=2) = 4 buckets, too few for its inner rule. Received: 8 replicas, num_byzantine=1. Add replicas, use smaller buckets or lower num_byzantine. (The inner rule says: Krum needs at least 2 * num_byzantine + 3 = 5 replicas. Received: 4 replicas, num_byzantine=1. Add replicas or lower num_byzantine.)

    References:
        Karimireddy, He, Jaggi, "Byzantine-Robust Learning on Heterogeneous
        Datasets via Bucketing", ICLR 2022.
    """

    def __init__(
        self,
        aggregator: str | dict[str, Any] | Aggregator = "trimmed_mean",
        *,
        bucket_size: int = 2,
        seed: int | None = None,
        num_byzantine: int | None = None,
        jit_compile: bool = True,
    ):
        if (
            isinstance(bucket_size, bool)
            or not isinstance(bucket_size, int)
            or bucket_size < 1
        ):
            raise ValueError(
                f"Bucketing's `bucket_size` must be an int >= 1. Received: bucket_size={bucket_size!r}"
            )
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(
                f"Bucketing's `seed` must be an int or None. Received: seed={seed!r}"
            )
        super().__init__(aggregator, num_byzantine)
        # Bucket means, then the inner rule: undefended when the inner is.
        self.needs_num_byzantine = self.aggregator.needs_num_byzantine
        self.without_num_byzantine = (
            f"averages buckets of {bucket_size} replicas, then "
            f"{self.aggregator.name} {self.aggregator.without_num_byzantine}"
        )
        self.bucket_size = bucket_size
        self.seed = seed
        self.jit_compile = check_bool(type(self).__name__, "jit_compile", jit_compile)

    def inner_replicas(self, num_replicas: int) -> int:
        return math.ceil(num_replicas / self.bucket_size)

    def check(self, num_replicas: int, num_byzantine: int = 0) -> None:
        Aggregator.check(self, num_replicas, num_byzantine)
        buckets = self.inner_replicas(num_replicas)
        try:
            self.aggregator.check(buckets, num_byzantine)
        except ValueError as error:
            raise ValueError(
                f"Bucketing turns {num_replicas} replicas into ceil({num_replicas} / "
                f"bucket_size={self.bucket_size}) = {buckets} buckets, too few for its "
                f"inner rule. Received: {num_replicas} replicas, num_byzantine="
                f"{num_byzantine}. Add replicas, use smaller buckets or lower "
                f"num_byzantine. (The inner rule says: {error})"
            ) from None

    def transform(self, per_replica: Sequence[Sequence[tf.Tensor]]) -> Transformed:
        n = len(per_replica[0])
        order = tf.random.shuffle(tf.range(n), seed=self.seed)
        # bucket_of[r]: the bucket replica r falls in.
        bucket_of = tf.scatter_nd(order[:, None], tf.range(n) // self.bucket_size, [n])
        means = combine.bucket_means(
            per_replica, order, self.bucket_size, self.jit_compile
        )
        return Transformed(means, bucket_of)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "bucket_size": self.bucket_size,
            "seed": self.seed,
            "jit_compile": self.jit_compile,
        }
