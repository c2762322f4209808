"""Crafted gradient attacks: forged from the honest replicas' gradients.

These attackers are omniscient: they see every honest replica's gradient of
the step before sending their own, the strongest (and usual) threat model of
the papers. All attacked replicas send the same forged value.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import tensorflow as tf

from keras_psdist.attacks.base import GradientAttack, check_finite_number


class ALIE(GradientAttack):
    """ "A Little Is Enough": a small shift, hidden in the honest spread.

    Per coordinate j, with `mu_j` the mean and `sigma_j` the population
    standard deviation (ddof = 0) of the HONEST replicas' values (the
    attacked replicas' own gradients are left out), every attacked replica
    sends

        forged_j = mu_j - z * sigma_j

    Sign convention: `mu - z * sigma`, with `z >= 0` from the formula below;
    some implementations add `z * sigma` instead. A negative `z` passed
    explicitly shifts the other way.

    `z=None` takes the paper's z_max, with n the total replica count and f the
    number of attacked replicas (`len(replicas)`, not the strategy's
    `num_byzantine`):

        s = floor(n / 2 + 1) - f      (honest "supporters" the attackers need)
        z = Phi^{-1}((n - s) / n)     (Phi: the standard normal CDF)

    (Some implementations use `(n - f - s) / (n - f)` instead; this is the
    paper's.) `s` is clamped to `[1, n - 1]`: with `f >= floor(n / 2 + 1)`
    the attackers are a majority on their own, `s <= 0` and the formula
    gives `z = inf`; `s = 1` gives the largest finite value it yields,
    `Phi^{-1}((n - 1) / n)`. With at least one attacker and one honest
    replica, `s` is otherwise already in range. See `paper_z`.

    Args:
        replicas: The ids of the attacked replicas.
        z: The shift in honest standard deviations, a finite number, or
            `None` for the paper's z_max. Defaults to `None`.

    Examples:

    >>> import tensorflow as tf
    >>> round(ALIE.paper_z(num_replicas=8, num_attackers=2), 4)
    0.3186
    >>> attack = ALIE(replicas=[2], z=1.0)
    >>> column = [tf.constant([1.0, 0.0]), tf.constant([3.0, 0.0]), tf.constant([9.0, 9.0])]
    >>> [out] = attack.apply([column])
    >>> [v.numpy().tolist() for v in out]
    [[1.0, 0.0], [3.0, 0.0], [1.0, 0.0]]

    References:
        Baruch, Baruch, Goldberg, "A Little Is Enough: Circumventing Defenses
        For Distributed Learning", NeurIPS 2019 (the paper's z_max; the
        statistics here are over the honest replicas only).
    """

    omniscient = True

    def __init__(self, replicas: Sequence[int], z: float | None = None):
        super().__init__(replicas)
        self.z = None if z is None else check_finite_number("ALIE", "z", z)

    @staticmethod
    def paper_z(num_replicas: int, num_attackers: int) -> float:
        """The paper's z_max for n replicas, f of them attacked (see the class).

        Args:
            num_replicas: The total replica count n, >= 2.
            num_attackers: The number of attacked replicas f, `1 <= f < n`.

        Returns:
            `Phi^{-1}((n - s) / n)` with `s = floor(n / 2 + 1) - f` clamped
            to `[1, n - 1]`.
        """
        n, f = num_replicas, num_attackers
        if not (isinstance(n, int) and isinstance(f, int) and 1 <= f < n):
            raise ValueError(
                "ALIE.paper_z needs ints with 1 <= num_attackers < num_replicas. "
                f"Received: num_replicas={n!r}, num_attackers={f!r}"
            )
        supporters = min(max(math.floor(n / 2 + 1) - f, 1), n - 1)
        return NormalDist().inv_cdf((n - supporters) / n)

    def forge(self, honest, own):
        if not own:
            return []
        n = len(honest[0]) + len(own[0])
        z = self.paper_z(n, len(own[0])) if self.z is None else self.z
        forged = []
        for honest_values, own_values in zip(honest, own, strict=True):
            dtype = tf.convert_to_tensor(own_values[0]).dtype
            stacked = tf.cast(tf.stack(honest_values), _stats_dtype(dtype))
            mu = tf.reduce_mean(stacked, axis=0)
            sigma = tf.sqrt(tf.reduce_mean(tf.square(stacked - mu), axis=0))
            value = tf.cast(mu - tf.cast(z, mu.dtype) * sigma, dtype)
            forged.append([value] * len(own_values))
        return forged

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "z": self.z}


class IPM(GradientAttack):
    """Inner-Product Manipulation: send a small negative of the honest mean.

    Every attacked replica sends `-epsilon * mean(honest)`, the mean of the
    HONEST replicas' values. With a small `epsilon` the forged value stays
    close to the honest ones (and passes distance-based filters) while its
    inner product with the true gradient is negative; a large one (e.g. 100)
    overwhelms the mean.

    Args:
        replicas: The ids of the attacked replicas.
        epsilon: The factor, a finite number > 0. Defaults to `0.1`.

    Examples:

    >>> import tensorflow as tf
    >>> attack = IPM(replicas=[2], epsilon=0.5)
    >>> column = [tf.constant([1.0, -2.0]), tf.constant([3.0, 4.0]), tf.constant([9.0, 9.0])]
    >>> [out] = attack.apply([column])
    >>> out[2].numpy().tolist()
    [-1.0, -0.5]

    References:
        Xie, Koyejo, Gupta, "Fall of Empires: Breaking Byzantine-tolerant SGD
        by Inner Product Manipulation", UAI 2019 (the omniscient variant:
        the mean over the honest replicas).
    """

    omniscient = True

    def __init__(self, replicas: Sequence[int], epsilon: float = 0.1):
        super().__init__(replicas)
        self.epsilon = check_finite_number("IPM", "epsilon", epsilon, positive=True)

    def forge(self, honest, own):
        forged = []
        for honest_values, own_values in zip(honest, own, strict=True):
            dtype = tf.convert_to_tensor(own_values[0]).dtype
            stacked = tf.cast(tf.stack(honest_values), _stats_dtype(dtype))
            mean = tf.reduce_mean(stacked, axis=0)
            value = tf.cast(tf.cast(-self.epsilon, mean.dtype) * mean, dtype)
            forged.append([value] * len(own_values))
        return forged

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "epsilon": self.epsilon}


class Mimic(GradientAttack):
    """Every attacked replica sends a copy of one honest replica's gradient.

    No value is out of place, so no rule can single the copies out; what
    they do is give one honest replica's data `1 + len(replicas)` votes.
    Under heterogeneous (non-IID) data, that biases every step towards that
    replica's data (see `keras_psdist.heterogeneity`).

    The target is fixed, as in ByzFL's `Mimic(epsilon)` (which indexes the
    honest vectors; `target` here is a replica id). The paper also picks the
    target adaptively, by the honest gradients' direction of largest
    variance; that choice is not implemented.

    Args:
        replicas: The ids of the attacked replicas.
        target: The id of the honest replica to copy, an int not in
            `replicas`, or `None` for the honest replica with the lowest id.
            Defaults to `None`.

    Raises:
        ValueError: if `target` is not an int >= 0 or is an attacked
            replica; `check` also refuses a target outside the strategy's
            replicas.

    Examples:

    >>> import tensorflow as tf
    >>> column = [tf.constant([1.0]), tf.constant([2.0]), tf.constant([3.0]), tf.constant([9.0])]
    >>> [out] = Mimic(replicas=[0, 3]).apply([column])
    >>> [v.numpy().tolist() for v in out]
    [[2.0], [2.0], [3.0], [2.0]]
    >>> [out] = Mimic(replicas=[0, 3], target=2).apply([column])
    >>> [v.numpy().tolist() for v in out]
    [[3.0], [2.0], [3.0], [3.0]]

    References:
        Karimireddy, He, Jaggi, "Byzantine-Robust Learning on Heterogeneous
        Datasets via Bucketing", ICLR 2022 (the mimic attack: the Byzantine
        workers all send one honest worker's gradient).
    """

    omniscient = True

    def __init__(self, replicas: Sequence[int], target: int | None = None):
        super().__init__(replicas)
        if target is not None:
            if (
                isinstance(target, bool)
                or not isinstance(target, numbers.Integral)
                or target < 0
            ):
                raise ValueError(
                    "Mimic: `target` must be the id of the honest replica to "
                    "copy (an int >= 0), or None for the first honest replica. "
                    f"Received: target={target!r}"
                )
            target = int(target)
            if target in self.replicas:
                raise ValueError(
                    f"Mimic: `target` must be an honest replica, but replica "
                    f"{target} is one of the attacked replicas. Received: "
                    f"target={target}, replicas={list(self.replicas)}. Pick a "
                    "replica not in `replicas`, or None for the first honest one."
                )
        self.target = target

    def check(self, num_replicas: int) -> None:
        super().check(num_replicas)
        if self.target is not None and self.target >= num_replicas:
            raise ValueError(
                f"{self!r} copies replica {self.target}, but there are only "
                f"{num_replicas} replicas (valid ids: 0 to {num_replicas - 1}). "
                f"Received: target={self.target}, num_replicas={num_replicas}. "
                f"Pick a target below {num_replicas}, or None for the first "
                "honest replica."
            )

    def forge(self, honest, own):
        # `honest` lists the honest replicas in id order: the target's place
        # is its id minus the attacked replicas before it.
        index = 0
        if self.target is not None:
            index = self.target - sum(r < self.target for r in self.replicas)
        return [
            [honest_values[index]] * len(own_values)
            for honest_values, own_values in zip(honest, own, strict=True)
        ]

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "target": self.target}


def _stats_dtype(dtype: tf.DType) -> tf.DType:
    # Half-precision means and variances lose too much; compute in float32.
    return tf.float32 if dtype in (tf.float16, tf.bfloat16) else dtype
