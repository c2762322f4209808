"""Simple gradient attacks: each attacked replica corrupts its own gradient."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.attacks.base import GradientAttack, check_finite_number


class SignFlip(GradientAttack):
    """Each attacked replica sends its own gradient, negated and scaled.

    Replica r sends `-scale * g_r`, where `g_r` is its honest gradient.

    Args:
        replicas: The ids of the attacked replicas.
        scale: The factor applied after negation, a finite number > 0.
            Defaults to `1.0`.

    Examples:

    >>> import tensorflow as tf
    >>> attack = SignFlip(replicas=[1], scale=2.0)
    >>> [column] = attack.apply([[tf.constant([1.0, 2.0]), tf.constant([3.0, -4.0])]])
    >>> [v.numpy().tolist() for v in column]
    [[1.0, 2.0], [-6.0, 8.0]]

    References:
        Karimireddy, He, Jaggi, "Learning from History for Byzantine Robust
        Optimization", ICML 2021 (the "bit flipping" attack, `-g_r`; `scale`
        generalises it).
    """

    def __init__(self, replicas: Sequence[int], scale: float = 1.0):
        super().__init__(replicas)
        self.scale = check_finite_number("SignFlip", "scale", scale, positive=True)

    def forge(self, honest, own):
        return [[tf.cast(-self.scale, g.dtype) * g for g in values] for values in own]

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "scale": self.scale}


class Scale(GradientAttack):
    """Each attacked replica sends its own gradient times a factor.

    Replica r sends `factor * g_r`. A large factor is the classic "one bad
    replica breaks the mean" failure; a negative one flips the sign too.

    Args:
        replicas: The ids of the attacked replicas.
        factor: The multiplier, a finite number.

    Examples:

    >>> import tensorflow as tf
    >>> attack = Scale(replicas=[0], factor=100.0)
    >>> [column] = attack.apply([[tf.constant([1.0]), tf.constant([2.0])]])
    >>> [v.numpy().tolist() for v in column]
    [[100.0], [2.0]]

    References:
        Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine Learning with
        Adversaries: Byzantine Tolerant Gradient Descent", NeurIPS 2017 (a
        single replica can move the average anywhere).
    """

    def __init__(self, replicas: Sequence[int], factor: float):
        super().__init__(replicas)
        self.factor = check_finite_number("Scale", "factor", factor)

    def forge(self, honest, own):
        return [[tf.cast(self.factor, g.dtype) * g for g in values] for values in own]

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "factor": self.factor}


class GaussianNoise(GradientAttack):
    """Each attacked replica sends Gaussian noise instead of its gradient.

    Replica r sends a fresh sample of `N(0, stddev^2)` in every coordinate,
    drawn anew at every step, independent across replicas and variables.

    Randomness: stateful `tf.random.normal` ops, one per variable, with the
    op seed `seed + v` for variable v (or TF's own choice when `seed` is
    `None`). With a fixed `seed` (and global seed) a run's sequence of noise
    is reproducible; it advances at each call.

    Args:
        replicas: The ids of the attacked replicas.
        stddev: The noise's standard deviation, a finite number >= 0.
            Defaults to `1.0`.
        seed: An int op seed, or `None`. Defaults to `None`.

    Examples:

    >>> import tensorflow as tf
    >>> attack = GaussianNoise(replicas=[1], stddev=0.0, seed=1)
    >>> [column] = attack.apply([[tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0])]])
    >>> [v.numpy().tolist() for v in column]
    [[1.0, 2.0], [0.0, 0.0]]

    References:
        Xie, Koyejo, Gupta, "Generalized Byzantine-tolerant SGD", arXiv
        1802.10116, 2018 (the "Gaussian" Byzantine value).
    """

    def __init__(
        self, replicas: Sequence[int], stddev: float = 1.0, seed: int | None = None
    ):
        super().__init__(replicas)
        stddev = check_finite_number("GaussianNoise", "stddev", stddev)
        if stddev < 0:
            raise ValueError(
                f"GaussianNoise: `stddev` must be >= 0. Received: stddev={stddev!r}"
            )
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(
                f"GaussianNoise: `seed` must be an int or None. Received: seed={seed!r}"
            )
        self.stddev = stddev
        self.seed = seed

    def forge(self, honest, own):
        forged = []
        for v, values in enumerate(own):
            like = tf.convert_to_tensor(values[0])
            shape = tf.concat([[len(values)], tf.shape(like)], axis=0)
            # One op for all attacked replicas: ops sharing a seed repeat
            # each other's samples.
            noise = tf.random.normal(
                shape,
                stddev=self.stddev,
                dtype=like.dtype,
                seed=None if self.seed is None else self.seed + v,
            )
            forged.append(tf.unstack(noise, num=len(values)))
        return forged

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "stddev": self.stddev, "seed": self.seed}


_NON_FINITE = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


class NonFinite(GradientAttack):
    """Each attacked replica sends NaN or an infinity in every coordinate.

    What a replica with a diverged loss or an overflow sends; a robust rule
    must keep it out of the result (see the rules' non-finite contract).

    Args:
        replicas: The ids of the attacked replicas.
        value: `"nan"`, `"inf"` or `"-inf"`. Defaults to `"nan"`.

    Examples:

    >>> import tensorflow as tf
    >>> attack = NonFinite(replicas=[0], value="-inf")
    >>> [column] = attack.apply([[tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0])]])
    >>> [v.numpy().tolist() for v in column]
    [[-inf, -inf], [3.0, 4.0]]

    References:
        Guerraoui, Gupta, Pinot, "Robust Machine Learning: Distributed
        Methods for Safe AI", Springer 2024 (the Byzantine fault model: a
        faulty replica may send any value).
    """

    def __init__(self, replicas: Sequence[int], value: str = "nan"):
        super().__init__(replicas)
        if not isinstance(value, str) or value not in _NON_FINITE:
            raise ValueError(
                "NonFinite: `value` must be one of 'nan', 'inf', '-inf'. "
                f"Received: value={value!r}"
            )
        self.value = value

    def forge(self, honest, own):
        fill = _NON_FINITE[self.value]
        return [
            [tf.fill(tf.shape(g), tf.constant(fill, g.dtype)) for g in values]
            for values in own
        ]

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "value": self.value}
