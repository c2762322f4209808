"""Coordinate-wise trimmed mean."""

from __future__ import annotations

from keras_psdist.aggregators.coordinatewise import OrderStatisticsMean


class TrimmedMean(OrderStatisticsMean):
    """The coordinate-wise mean after dropping the f largest and f smallest values.

    At each coordinate, the n replicas' values are sorted and the mean of the
    middle `n - 2f` is kept, f being the run's `num_byzantine` (with f = 0 this
    is the mean). Coordinate-wise, so it works variable by variable. NaN
    counts as +inf and is trimmed when at most f replicas send one.

    Condition: `num_replicas > 2 * num_byzantine`.

    Report: `extreme_fraction[r]`, the fraction of replica r's coordinates
    that were trimmed (outside the f-th smallest .. f-th largest range).

    Sparse gradients: a dense block over the touched rows (see
    `keras_psdist.aggregators.sparse`).

    Args:
        num_byzantine: The *f* this rule is built for (values trimmed from
            each side), or `None` to take the strategy's. Defaults to `None`.
        jit_compile: Run the sorting network under XLA. Defaults to `True`.

    Examples:

    >>> import tensorflow as tf
    >>> rule = TrimmedMean(num_byzantine=1)
    >>> column = [tf.constant([v]) for v in (1.0, 2.0, 3.0, 4.0, 1e9)]
    >>> [out] = rule.aggregate([column])
    >>> out.numpy().tolist()
    [3.0]

    References:
        Yin, Chen, Ramchandran, Bartlett, "Byzantine-Robust Distributed
        Learning: Towards Optimal Statistical Rates", ICML 2018 (the
        beta-trimmed mean with beta = f / n).
    """

    needs_num_byzantine = True
    without_num_byzantine = (
        "trims nothing: it is the plain mean, and defends against no faulty replica"
    )

    def kept(self, n: int) -> tuple[int, int]:
        f = self.f
        if 2 * f >= n:
            raise ValueError(
                f"TrimmedMean with num_byzantine={f} trims every one of the {n} "
                "replicas' values. Lower num_byzantine below n / 2."
            )
        return f, n - 1 - f
