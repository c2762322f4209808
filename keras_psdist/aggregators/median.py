"""Coordinate-wise median."""

from __future__ import annotations

from keras_psdist.aggregators.coordinatewise import OrderStatisticsMean


class Median(OrderStatisticsMean):
    """The coordinate-wise median of the replicas' values.

    At each coordinate, the middle value of the n replicas (for even n, the
    mean of the two middle values). Works variable by variable: the median is
    coordinate-wise, so splitting the gradient by variable changes nothing.
    NaN counts as +inf, so up to f non-finite replicas never reach the output.

    Condition: `num_replicas > 2 * num_byzantine` (a majority is honest).

    Report: `extreme_fraction[r]`, the fraction of replica r's coordinates
    outside the range between the f-th smallest and f-th largest values (zero
    when f = 0).

    Sparse gradients: a dense block over the rows any replica touched (see
    `keras_psdist.aggregators.sparse`); a replica that did not touch a row
    counts as zero there.

    Args:
        num_byzantine: The *f* this rule is built for, or `None` to take the
            strategy's. Defaults to `None`.
        jit_compile: Run the sorting network under XLA, about 30x faster than
            without on CPU. Defaults to `True`.

    Examples:

    >>> import tensorflow as tf
    >>> rule = Median()
    >>> column = [tf.constant([1.0, -1.0]), tf.constant([2.0, 100.0]), tf.constant([1e9, 0.0])]
    >>> [out] = rule.aggregate([column])
    >>> out.numpy().tolist()
    [2.0, 0.0]

    References:
        Yin, Chen, Ramchandran, Bartlett, "Byzantine-Robust Distributed
        Learning: Towards Optimal Statistical Rates", ICML 2018.
    """

    def kept(self, n: int) -> tuple[int, int]:
        return (n - 1) // 2, n // 2

    def report_depth(self, n: int) -> int:
        return min(self.f, (n - 1) // 2)
