"""Adaptive attacks: ALIE, IPM and a label flip with their factor searched each step.

`OptimalALIE` and `OptimalIPM` forge what `ALIE` and `IPM` forge, but choose
the attack factor (ALIE's z, IPM's epsilon) anew at every step;
`OptimalLabelFlip` trains on flipped labels and scales the flipped gradients'
departure from the honest mean: each
candidate of a fixed grid is tried against the rule in use, and the one that
moves the rule's output farthest from the honest mean is sent. They get the
rule from `UnderAttack` (see `AdaptiveAttack`).

The damage of a factor c is the one ByzFL's optimal attacks maximise, the
distance between the rule's output and the honest replicas' mean, here
squared (the same argmax) and taken over the whole model:

    damage(c) = sum_v || rule(values with the attacked replicas sending
                forged_v(c))_v - mean(honest_v) ||^2

The candidates are 0, `num_candidates` values spaced geometrically between
the two ends of the range, and the fixed attack's default factor, so the
search never does less damage (by this measure) than `ALIE()` or `IPM()`.
The largest damage wins; ties go to the smallest factor, and a factor whose
damage is NaN never wins (if all are NaN, the first candidate, 0, is sent).

ByzFL searches with a line search instead (20 evaluations: from 0 with a
step of 10, doubled while the damage grows, then shrunk by 0.8); a fixed grid
keeps the search one `tf.while_loop` with a known cost, the rule run once per
candidate, one candidate at a time.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.attacks.base import (
    AdaptiveAttack,
    PerReplica,
    Rule,
    check_finite_number,
    check_rule,
)
from keras_psdist.attacks.crafted import ALIE, _stats_dtype
from keras_psdist.attacks.data import LabelFlip

# A variable's forged value is `base + factor * direction` (`base` None: 0).
_Line = tuple[tf.Tensor | None, tf.Tensor]


class _FactorSearch(AdaptiveAttack):
    """An attack `base + factor * direction` whose factor is searched on a grid.

    Subclasses set the names of the range arguments and implement `_line`
    and `_default_factor`.
    """

    _range_names: tuple[str, str] = ("min_factor", "max_factor")

    def __init__(
        self, replicas: Sequence[int], low: float, high: float, num_candidates: int
    ):
        super().__init__(replicas)
        owner = type(self).__name__
        low_name, high_name = self._range_names
        low = check_finite_number(owner, low_name, low, positive=True)
        high = check_finite_number(owner, high_name, high, positive=True)
        if high <= low:
            raise ValueError(
                f"{owner}: `{high_name}` must be greater than `{low_name}`. "
                f"Received: {low_name}={low!r}, {high_name}={high!r}. Swap them "
                "or widen the range."
            )
        if (
            isinstance(num_candidates, bool)
            or not isinstance(num_candidates, numbers.Integral)
            or num_candidates < 2
        ):
            raise ValueError(
                f"{owner}: `num_candidates` must be an int >= 2 (the range's two "
                "ends and the points spaced between them). Received: "
                f"num_candidates={num_candidates!r}"
            )
        self._low, self._high = low, high
        self.num_candidates = int(num_candidates)

    def candidates(self, num_replicas: int, num_attackers: int) -> list[float]:
        """The factors tried at each step, in increasing order.

        0, `num_candidates` values spaced geometrically over the range (both
        ends included), and the fixed attack's default, without repeats.

        Args:
            num_replicas: The replica count n.
            num_attackers: The number of attacked replicas f.
        """
        k = self.num_candidates - 1
        ratio = self._high / self._low
        grid = [self._low * ratio ** (i / k) for i in range(k)] + [self._high]
        default = self._default_factor(num_replicas, num_attackers)
        return sorted({0.0, *grid, default})

    def search(
        self, per_replica: PerReplica, rule: Rule
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """Every candidate factor and its damage against `rule`, for diagnostics.

        Args:
            per_replica: As in `apply`.
            rule: As in `apply`.

        Returns:
            `(factors, damages)`, float64 tensors of shape `[K]`: the
            candidates in increasing order and the damage of each (see the
            module docstring). `apply` sends the factor of the largest.
        """
        check_rule(self, rule)
        if not per_replica:
            raise ValueError(
                f"{self!r}.search needs the values of at least one variable. "
                "Received: per_replica=[]"
            )
        factors, damages, _ = self._search(*self._against(per_replica, rule))
        return factors, damages

    def forge(self, honest, own, aggregate):
        factors, damages, forged_for = self._search(honest, own, aggregate)
        return forged_for(tf.gather(factors, _first_max(damages)))

    def _search(
        self,
        honest: list[list[tf.Tensor]],
        own: list[list[tf.Tensor]],
        aggregate: Callable[[list[list[tf.Tensor]]], list[tf.Tensor]],
    ) -> tuple[tf.Tensor, tf.Tensor, Callable[[tf.Tensor], list[list[tf.Tensor]]]]:
        num_attackers = len(own[0])
        grid = self.candidates(len(honest[0]) + num_attackers, num_attackers)
        factors = tf.constant(grid, tf.float64)
        dtypes = [tf.convert_to_tensor(values[0]).dtype for values in own]
        stacked = [
            tf.cast(tf.stack(values), _stats_dtype(dtype))
            for values, dtype in zip(honest, dtypes, strict=True)
        ]
        means = [tf.reduce_mean(s, axis=0) for s in stacked]
        theirs = [
            tf.cast(tf.stack(values), s.dtype)
            for values, s in zip(own, stacked, strict=True)
        ]
        lines = [
            self._line(s, m, o) for s, m, o in zip(stacked, means, theirs, strict=True)
        ]

        def forged_for(factor: tf.Tensor) -> list[list[tf.Tensor]]:
            forged = []
            for (base, direction), dtype in zip(lines, dtypes, strict=True):
                value = tf.cast(factor, direction.dtype) * direction
                if base is not None:
                    value = base + value
                forged.append([tf.cast(value, dtype)] * num_attackers)
            return forged

        def damage(factor: tf.Tensor) -> tf.Tensor:
            values = aggregate(forged_for(factor))
            return tf.add_n(
                [
                    tf.reduce_sum(
                        tf.square(tf.cast(v, tf.float64) - tf.cast(m, tf.float64))
                    )
                    for v, m in zip(values, means, strict=True)
                ]
            )

        def body(k, damages):
            return k + 1, damages.write(k, damage(tf.gather(factors, k)))

        # One candidate at a time: the rule's intermediates of one evaluation
        # are alive at once, not K of them.
        _, damages = tf.while_loop(
            lambda k, _: k < len(grid),
            body,
            (tf.constant(0), tf.TensorArray(tf.float64, size=len(grid))),
            parallel_iterations=1,
        )
        return factors, damages.stack(), forged_for

    def _line(self, stacked: tf.Tensor, mean: tf.Tensor, own: tf.Tensor) -> _Line:
        """`(base, direction)` of one variable from the honest values
        (`stacked`, their `mean`) and the attacked replicas' own (`own`)."""
        raise NotImplementedError

    def _default_factor(self, num_replicas: int, num_attackers: int) -> float:
        raise NotImplementedError


class OptimalALIE(_FactorSearch):
    """ALIE with z chosen at every step to do the rule in use the most damage.

    Every attacked replica sends `mu - z * sigma` per coordinate, as `ALIE`
    does (mean and population standard deviation of the HONEST replicas), with
    z the candidate of largest damage (see the module docstring): 0,
    `num_candidates` values spaced geometrically from `min_z` to `max_z`, and
    `ALIE.paper_z(n, f)`, ALIE's default. Against a rule whose damage grows
    without bound in z (the mean), the search takes `max_z`.

    The attack needs the rule: a strategy hands it over (`attack=`); called
    directly, `apply` takes `rule=` (see `AdaptiveAttack`). The rule runs
    once per candidate at every step, at most `num_candidates + 2` times.

    Args:
        replicas: The ids of the attacked replicas.
        min_z: The smallest nonzero candidate, a finite number > 0. Defaults
            to `0.1`.
        max_z: The largest candidate, a finite number > `min_z` (not the
            paper's z_max, which is always a candidate). Defaults to `10.0`.
        num_candidates: How many candidates span `[min_z, max_z]`, an int
            >= 2. Defaults to `16`.

    Examples:

    >>> import tensorflow as tf
    >>> from keras_psdist import aggregators
    >>> attack = OptimalALIE(replicas=[4], min_z=0.5, max_z=2.0, num_candidates=3)
    >>> [round(z, 4) for z in attack.candidates(num_replicas=5, num_attackers=1)]
    [0.0, 0.2533, 0.5, 1.0, 2.0]
    >>> column = [tf.constant([x]) for x in (1.0, 2.0, 3.0, 6.0, 0.0)]
    >>> krum = aggregators.get("krum").bind(5, 1)
    >>> factors, damages = attack.search([column], rule=krum.aggregate)
    >>> damages.numpy().round(4).tolist()
    [0.0, 0.2246, 0.875, 3.5, 1.0]
    >>> [out] = attack.apply([column], rule=krum.aggregate)
    >>> round(float(out[4][0]), 4)  # z = 1: Krum picks mu - sigma
    1.1292

    References:
        Baruch, Baruch, Goldberg, "A Little Is Enough: Circumventing Defenses
        For Distributed Learning", NeurIPS 2019 (the attack);
        Allouah, Farhadkhani, Guerraoui, Gupta, Pinot, Stephan, "Fixing by
        Mixing: A Recipe for Optimal Byzantine ML under Heterogeneity",
        AISTATS 2023, and ByzFL's `Optimal_ALittleIsEnough` (the factor
        searched for the largest distance between the rule's output and the
        honest mean).
    """

    _range_names = ("min_z", "max_z")

    def __init__(
        self,
        replicas: Sequence[int],
        min_z: float = 0.1,
        max_z: float = 10.0,
        num_candidates: int = 16,
    ):
        super().__init__(replicas, min_z, max_z, num_candidates)

    @property
    def min_z(self) -> float:
        """The smallest nonzero candidate z."""
        return self._low

    @property
    def max_z(self) -> float:
        """The largest candidate z."""
        return self._high

    def _line(self, stacked, mean, own):
        sigma = tf.sqrt(tf.reduce_mean(tf.square(stacked - mean), axis=0))
        return mean, -sigma

    def _default_factor(self, num_replicas, num_attackers):
        return ALIE.paper_z(num_replicas, num_attackers)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "min_z": self.min_z,
            "max_z": self.max_z,
            "num_candidates": self.num_candidates,
        }


class OptimalIPM(_FactorSearch):
    """IPM with epsilon chosen at every step to do the rule in use the most damage.

    Every attacked replica sends `-epsilon * mean(honest)`, as `IPM` does,
    with epsilon the candidate of largest damage (see the module docstring):
    0, `num_candidates` values spaced geometrically from `min_epsilon` to
    `max_epsilon`, and `0.1`, IPM's default.

    The attack needs the rule: a strategy hands it over (`attack=`); called
    directly, `apply` takes `rule=` (see `AdaptiveAttack`). The rule runs
    once per candidate at every step, at most `num_candidates + 2` times.

    Args:
        replicas: The ids of the attacked replicas.
        min_epsilon: The smallest nonzero candidate, a finite number > 0.
            Defaults to `0.01`.
        max_epsilon: The largest candidate, a finite number > `min_epsilon`.
            Defaults to `100.0`.
        num_candidates: How many candidates span `[min_epsilon,
            max_epsilon]`, an int >= 2. Defaults to `16`.

    Examples:

    >>> import tensorflow as tf
    >>> from keras_psdist import aggregators
    >>> attack = OptimalIPM(replicas=[4], min_epsilon=1.0, max_epsilon=100.0, num_candidates=3)
    >>> attack.candidates(num_replicas=5, num_attackers=1)
    [0.0, 0.1, 1.0, 10.0, 100.0]
    >>> honest = [[1.0, 4.0], [0.0, -1.0], [4.0, 5.0], [-2.0, -2.0]]
    >>> column = [tf.constant(x) for x in honest] + [tf.zeros([2])]
    >>> krum = aggregators.get("krum").bind(5, 1)
    >>> factors, damages = attack.search([column], rule=krum.aggregate)
    >>> damages.numpy().round(4).tolist()
    [6.8125, 6.8125, 11.25, 6.8125, 6.8125]
    >>> [out] = attack.apply([column], rule=krum.aggregate)
    >>> out[4].numpy().tolist()  # epsilon = 1: Krum picks it
    [-0.75, -1.5]

    References:
        Xie, Koyejo, Gupta, "Fall of Empires: Breaking Byzantine-tolerant SGD
        by Inner Product Manipulation", UAI 2019 (the attack);
        Allouah, Farhadkhani, Guerraoui, Gupta, Pinot, Stephan, "Fixing by
        Mixing: A Recipe for Optimal Byzantine ML under Heterogeneity",
        AISTATS 2023, and ByzFL's `Optimal_InnerProductManipulation` (the
        factor searched for the largest distance between the rule's output
        and the honest mean).
    """

    _range_names = ("min_epsilon", "max_epsilon")

    def __init__(
        self,
        replicas: Sequence[int],
        min_epsilon: float = 0.01,
        max_epsilon: float = 100.0,
        num_candidates: int = 16,
    ):
        super().__init__(replicas, min_epsilon, max_epsilon, num_candidates)

    @property
    def min_epsilon(self) -> float:
        """The smallest nonzero candidate epsilon."""
        return self._low

    @property
    def max_epsilon(self) -> float:
        """The largest candidate epsilon."""
        return self._high

    def _line(self, stacked, mean, own):
        return None, -mean

    def _default_factor(self, num_replicas, num_attackers):
        return 0.1

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "min_epsilon": self.min_epsilon,
            "max_epsilon": self.max_epsilon,
            "num_candidates": self.num_candidates,
        }


class OptimalLabelFlip(_FactorSearch):
    """A label flip amplified, at every step, as far as the rule lets it through.

    The attacked replicas train on mirrored labels, as under `LabelFlip`
    (`corrupt_batch`), and then send, per variable,

        mu + s * (mean(own) - mu)

    with `mu` the honest replicas' mean, `own` their own gradients of the
    flipped data, and s the candidate of largest damage against the rule
    in use (see the module docstring): 0, `num_candidates` values spaced
    geometrically from `min_scale` to `max_scale`, and 1, where every
    attacked replica sends the mean of the flipped gradients (`LabelFlip`
    with its replicas' gradients averaged). A rule that lets the flipped
    direction through unclipped is pushed along it as far as it allows.

    The attack needs the rule: a strategy hands it over (`attack=`); called
    directly, `apply` takes `rule=` (see `AdaptiveAttack`), and the values
    it gets for the attacked replicas stand for their gradients of the
    flipped data.

    Args:
        replicas: The ids of the attacked replicas.
        num_classes: The number of classes, an int >= 2 (see `LabelFlip`).
        min_scale: The smallest nonzero candidate, a finite number > 0.
            Defaults to `0.5`.
        max_scale: The largest candidate, a finite number > `min_scale`.
            Defaults to `50.0`.
        num_candidates: How many candidates span `[min_scale, max_scale]`,
            an int >= 2. Defaults to `16`.

    Examples:

    >>> import tensorflow as tf
    >>> from keras_psdist import aggregators
    >>> attack = OptimalLabelFlip(replicas=[4], num_classes=10, num_candidates=3)
    >>> [round(s, 2) for s in attack.candidates(num_replicas=5, num_attackers=1)]
    [0.0, 0.5, 1.0, 5.0, 50.0]
    >>> x, y = attack.corrupt_batch((tf.zeros([2, 3]), tf.constant([0, 9])))
    >>> y.numpy().tolist()
    [9, 0]
    >>> column = [tf.constant([x]) for x in (1.0, 2.0, 3.0, 6.0, -4.0)]
    >>> [out] = attack.apply([column], rule=aggregators.get("mean").bind(5).aggregate)
    >>> float(out[4][0])  # the mean follows any scale: the largest, 3 + 50 * (-7)
    -347.0

    References:
        Karimireddy, He, Jaggi, "Learning from History for Byzantine Robust
        Optimization", ICML 2021 (the label flip, `T(y) = 9 - y`);
        Allouah et al., "Fixing by Mixing", AISTATS 2023, and ByzFL's
        optimal attacks (the factor searched for the largest distance
        between the rule's output and the honest mean), here along the
        flipped gradients' direction.
    """

    _range_names = ("min_scale", "max_scale")

    def __init__(
        self,
        replicas: Sequence[int],
        num_classes: int,
        min_scale: float = 0.5,
        max_scale: float = 50.0,
        num_candidates: int = 16,
    ):
        super().__init__(replicas, min_scale, max_scale, num_candidates)
        self._flip = LabelFlip(replicas, num_classes)

    @property
    def num_classes(self) -> int:
        """The number of classes."""
        return self._flip.num_classes

    @property
    def min_scale(self) -> float:
        """The smallest nonzero candidate scale."""
        return self._low

    @property
    def max_scale(self) -> float:
        """The largest candidate scale."""
        return self._high

    def corrupt_batch(self, data: Any) -> Any:
        """The batch with its labels mirrored, as `LabelFlip.corrupt_batch`."""
        return self._flip.corrupt_batch(data)

    def _line(self, stacked, mean, own):
        return mean, tf.reduce_mean(own, axis=0) - mean

    def _default_factor(self, num_replicas, num_attackers):
        return 1.0

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "num_classes": self.num_classes,
            "min_scale": self.min_scale,
            "max_scale": self.max_scale,
            "num_candidates": self.num_candidates,
        }


def _first_max(damages: tf.Tensor) -> tf.Tensor:
    """The index of the largest damage, the first on ties; NaN never wins."""
    damages = tf.where(
        tf.math.is_nan(damages), tf.constant(-float("inf"), damages.dtype), damages
    )
    count = tf.shape(damages)[0]
    first = tf.where(damages >= tf.reduce_max(damages), tf.range(count), count)
    return tf.reduce_min(first)
