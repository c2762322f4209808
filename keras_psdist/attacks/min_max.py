"""Min-Max and Min-Sum: the farthest forgery that still looks like an honest one.

Shejwalkar and Houmansadr's aggregation-agnostic attacks (NDSS 2021). Every
attacked replica sends

    forged = mu - gamma * p

with `mu` the mean of the HONEST replicas' gradients, `p` a perturbation
direction and `gamma >= 0` the largest factor for which the forgery is no
farther from the honest gradients than they are from each other (distances
between whole gradients, every variable concatenated):

- Min-Max: `max_i ||forged - x_i|| <= max_{i, j} ||x_i - x_j||`, the forgery
  no farther from any honest gradient than the two farthest apart;
- Min-Sum: `sum_i ||forged - x_i||^2 <= min_i sum_j ||x_i - x_j||^2`, its
  summed squared distances no larger than those of the most central honest
  gradient. (The authors' code, with which the paper's results were
  measured, bounds by the min; the paper's equation writes the max, a
  looser bound: the forgery's sum would only have to beat the outermost
  honest gradient's.)

The perturbation (`perturbation=`): `"unit_vector"`, `mu / ||mu||` (the
authors' code's default); `"std"`, the per-coordinate standard deviation of
the honest gradients (with Bessel's correction, as `torch.std`); `"sign"`,
`sign(mu)`. Subtracting it moves the forgery against the honest direction.

How gamma is found: `||forged - x_i||^2 = a_i + 2 gamma b_i + gamma^2 c`, with
`a_i = ||x_i - mu||^2`, `b_i = <x_i - mu, p>` and `c = ||p||^2`, so each
condition is a convex quadratic in gamma that holds at 0, and the largest
gamma satisfying it is a root, computed exactly from one `[k, k]` Gram matrix
of the k honest gradients (one pass over them). The authors search instead,
halving a step from gamma = 10 until it is below 1e-5, which cannot exceed
20 (gradients with a large spread against `||p||` allow more): this is the
largest gamma their condition admits. With `p = 0` (a zero mean, no spread)
gamma is 0 and the forgery is the honest mean.

These attackers are omniscient like `ALIE`: they see every honest gradient
of the step (the paper's "full knowledge" setting) and need not know the
rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.attacks.base import GradientAttack
from keras_psdist.attacks.crafted import _stats_dtype

PERTURBATIONS = ("unit_vector", "std", "sign")


class _DistanceBounded(GradientAttack):
    """`mu - gamma * p`, gamma the largest within the subclass's bound."""

    omniscient = True

    def __init__(self, replicas: Sequence[int], perturbation: str = "unit_vector"):
        super().__init__(replicas)
        if perturbation not in PERTURBATIONS:
            raise ValueError(
                f"{type(self).__name__}'s perturbation must be one of "
                f"{', '.join(map(repr, PERTURBATIONS))}. Received: "
                f"perturbation={perturbation!r}"
            )
        self.perturbation = perturbation

    def forge(self, honest, own):
        if not own or not own[0]:
            return [[] for _ in own]
        k = len(honest[0])
        dtypes = [tf.convert_to_tensor(values[0]).dtype for values in own]
        stats = _stats_dtype(dtypes[0])
        means, directions = [], []
        gram = tf.zeros([k, k], stats)
        along = tf.zeros([k], stats)  # b_i = <x_i - mu, p>
        length = tf.zeros([], stats)  # c = ||p||^2
        for values in honest:
            stacked = tf.cast(tf.stack(values), stats)
            mu = tf.reduce_mean(stacked, axis=0)
            centered = tf.reshape(stacked - mu, [k, -1])
            p = self._direction(mu, centered, k)
            gram += tf.matmul(centered, centered, transpose_b=True)
            along += tf.linalg.matvec(centered, tf.reshape(p, [-1]))
            length += tf.reduce_sum(tf.square(p))
            means.append(mu)
            directions.append(p)
        if self.perturbation == "unit_vector":
            # p = mu / ||mu|| over the whole model (0 for a zero mean).
            norm = tf.sqrt(length)
            scale = tf.math.divide_no_nan(tf.ones([], stats), norm)
            directions = [p * scale for p in directions]
            along *= scale
            length = tf.cast(norm > 0, stats)
        gamma = self._gamma(gram, along, length, k)
        return [
            [tf.cast(mu - gamma * p, dtype)] * len(own_values)
            for mu, p, dtype, own_values in zip(
                means, directions, dtypes, own, strict=True
            )
        ]

    def _direction(self, mu, centered, k):
        if self.perturbation == "sign":
            return tf.sign(mu)
        if self.perturbation == "std":
            spread = tf.reduce_sum(tf.square(centered), axis=0) / max(k - 1, 1)
            return tf.reshape(tf.sqrt(spread), tf.shape(mu))
        return mu  # normalised over the whole model in `forge`

    def _gamma(self, gram, along, length, k):
        raise NotImplementedError

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "perturbation": self.perturbation}


def _largest_root(quadratic, linear, constant):
    """The larger root of `quadratic g^2 + 2 linear g + constant = 0` (with
    `constant <= 0`: a root >= 0), 0 where `quadratic` is 0."""
    discriminant = tf.maximum(tf.square(linear) - quadratic * constant, 0.0)
    return tf.maximum(
        tf.math.divide_no_nan(tf.sqrt(discriminant) - linear, quadratic), 0.0
    )


class MinMax(_DistanceBounded):
    """Min-Max: the forgery no farther from any honest gradient than the
    two farthest apart (see the module docstring).

    Args:
        replicas: The ids of the attacked replicas.
        perturbation: `"unit_vector"`, `"std"` or `"sign"`. Defaults to
            `"unit_vector"`.

    Examples:

    >>> import tensorflow as tf
    >>> attack = MinMax(replicas=[2])
    >>> column = [tf.constant([1.0, 0.0]), tf.constant([3.0, 0.0]), tf.constant([9.0, 9.0])]
    >>> [out] = attack.apply([column])
    >>> out[2].numpy().tolist()  # mu = (2, 0), p = (1, 0), gamma = 1: 2 from (3, 0)
    [1.0, 0.0]

    References:
        Shejwalkar, Houmansadr, "Manipulating the Byzantine: Optimizing Model
        Poisoning Attacks and Defenses for Federated Learning", NDSS 2021
        (AGR-agnostic Min-Max).
    """

    def _gamma(self, gram, along, length, k):
        squared = tf.linalg.diag_part(gram)
        distances = squared[:, None] + squared[None, :] - 2.0 * gram
        bound = tf.reduce_max(distances)
        # Each honest gradient's own root; the smallest keeps every condition.
        return tf.reduce_min(_largest_root(length, along, squared - bound))


class MinSum(_DistanceBounded):
    """Min-Sum: the forgery's summed squared distances to the honest gradients
    no larger than the smallest such sum of an honest gradient (see the
    module docstring).

    Args:
        replicas: The ids of the attacked replicas.
        perturbation: `"unit_vector"`, `"std"` or `"sign"`. Defaults to
            `"unit_vector"`.

    Examples:

    >>> import tensorflow as tf
    >>> attack = MinSum(replicas=[2])
    >>> column = [tf.constant([1.0, 0.0]), tf.constant([3.0, 0.0]), tf.constant([9.0, 9.0])]
    >>> [out] = attack.apply([column])
    >>> out[2].numpy().tolist()  # sums: (1, 0) and (3, 0) 4 each; 2 + 2 gamma^2 <= 4
    [1.0, 0.0]

    References:
        Shejwalkar, Houmansadr, "Manipulating the Byzantine: Optimizing Model
        Poisoning Attacks and Defenses for Federated Learning", NDSS 2021
        (AGR-agnostic Min-Sum, the bound of the authors' code).
    """

    def _gamma(self, gram, along, length, k):
        squared = tf.linalg.diag_part(gram)
        distances = squared[:, None] + squared[None, :] - 2.0 * gram
        bound = tf.reduce_min(tf.reduce_sum(distances, axis=1))
        return _largest_root(
            k * length, tf.reduce_sum(along), tf.reduce_sum(squared) - bound
        )
