"""Attacks that learn from history: they see the rule's previous aggregate.

A rule with memory (centered clipping's centre, the previous step's
aggregate) can be attacked through that memory: an attacker that knows the
last aggregate places its value where the rule trusts it most. A
`HistoryAttack` keeps what it saw in a state, as a rule does: the gradient
path (`keras_psdist.gradients.Attacked`) or `UnderAttack` makes it with
`initial_state`, hands it to `apply(values, history=...)` each step, and
keeps `remember(history, aggregate)` for the next.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import tensorflow as tf

from keras_psdist.attacks.base import GradientAttack, PerReplica, check_finite_number
from keras_psdist.attacks.crafted import ALIE, _stats_dtype


class History(NamedTuple):
    """What a `HistoryAttack` remembers between steps.

    Attributes:
        previous: One tensor per variable, the rule's last aggregate (zeros
            before the first step).
        steps: How many aggregates it has seen (a float32 scalar).
    """

    previous: list[tf.Tensor]
    steps: tf.Tensor


class HistoryAttack(GradientAttack):
    """Base class of gradient attacks that see the previous aggregate.

    Subclasses implement `forge(honest, own, history)`: as
    `GradientAttack.forge`, plus `history`, a `History`.

    Args:
        replicas: The ids of the attacked replicas (see `Attack`).
    """

    omniscient = True

    def initial_state(self, specs: Sequence[tf.TensorSpec]) -> History:
        """The history before the first step: zeros of each variable's shape.

        Raises:
            ValueError: for a variable of unknown shape (a sparse gradient's
                rows change every step: there is no aggregate to keep).
        """
        unknown = [s for s in specs if not s.shape.is_fully_defined()]
        if unknown:
            raise ValueError(
                f"{type(self).__name__} keeps the previous aggregate of every "
                "variable, but a gradient has a shape that changes between steps "
                f"(a sparse variable's rows): {unknown[0].shape}. Train without "
                "sparse gradients (e.g. no embedding tables) under this attack."
            )
        return History(
            [tf.zeros(s.shape, _stats_dtype(s.dtype)) for s in specs],
            tf.zeros([], tf.float32),
        )

    def remember(self, history: History, aggregate: Sequence[tf.Tensor]) -> History:
        """The history after a step whose aggregate was `aggregate`."""
        return History(
            [
                tf.cast(a, p.dtype)
                for p, a in zip(history.previous, aggregate, strict=True)
            ],
            history.steps + 1.0,
        )

    def forge(
        self,
        honest: list[list[tf.Tensor]],
        own: list[list[tf.Tensor]],
        history: History,
    ) -> list[list[tf.Tensor]]:
        """As `GradientAttack.forge`, with the `History` of earlier steps."""
        raise NotImplementedError(f"{type(self).__name__} must implement `forge`.")

    def apply(
        self, per_replica: PerReplica, history: History | None = None
    ) -> list[list[tf.Tensor]]:
        """The values the aggregator sees, forged from `history` (None: the
        initial state, as on the first step)."""
        if not per_replica:
            return []
        if history is None:
            history = History(
                [
                    tf.zeros_like(column[0], _stats_dtype(column[0].dtype))
                    for column in per_replica
                ],
                tf.zeros([], tf.float32),
            )
        honest, own = self._split(per_replica)
        return self._place(per_replica, self.forge(honest, own, history))


class ROP(HistoryAttack):
    """Relocated orthogonal perturbation: sideways, from where the rule trusts.

    Aimed at centered clipping, which clips every value around the previous
    aggregate (its centre). With `mu` the honest replicas' mean and `prev`
    the previous aggregate (zeros at the first step), over the whole model:

        reference = reference_weight * prev + (1 - reference_weight) * mu
                    (mu itself at the first step)
        p         = ones - (<ones, reference> / ||reference||^2) reference,
                    then normalised: a unit vector orthogonal to `reference`
        p         = sin(angle) p + cos(angle) reference / ||reference||
        forged    = location * prev + (1 - location) * mu + z p / ||p||

    So the forgery sits at the centre (`location=1`), relocated from the
    honest mean, and pushes `z` away from it at a right angle to where the
    honest values point: inside a clipping radius above `z` it is never
    clipped, and the rule's output turns a little sideways every step.

    `z` is a length in gradient units (the authors' code: ALIE's z_max,
    as `ALIE.paper_z`, for `z=None`).

    Args:
        replicas: The ids of the attacked replicas.
        z: The perturbation's length, a finite number > 0, or `None` for
            `ALIE.paper_z(n, f)` (f: the attacked replicas). Defaults to
            `None`.
        reference_weight: `lambda`, the previous aggregate's weight in the
            reference direction, in [0, 1]. Defaults to 0.9.
        location: `pi`, the previous aggregate's weight in where the forgery
            sits, in [0, 1]. Defaults to 1 (at the previous aggregate).
        angle: Degrees between the perturbation and the reference. Defaults
            to 90 (orthogonal).

    Examples:

    >>> import tensorflow as tf
    >>> attack = ROP(replicas=[2], z=1.0)
    >>> column = [tf.constant([1.0, 0.0]), tf.constant([3.0, 0.0]), tf.constant([9.0, 9.0])]
    >>> [out] = attack.apply([column])  # first step: prev = 0, reference = mu = (2, 0)
    >>> out[2].numpy().tolist()  # at prev, 1 along (0, 1), orthogonal to mu
    [0.0, 1.0]

    References:
        Ozfatura, Ozfatura, Kupcu, Gunduz, "Byzantines Can Also Learn From
        History: Fall of Centered Clipping in Federated Learning", IEEE TIFS
        2024 (ROP; the defaults of the authors' `reloc` attack, their
        perturbation from the all-ones vector).
    """

    def __init__(
        self,
        replicas: Sequence[int],
        z: float | None = None,
        reference_weight: float = 0.9,
        location: float = 1.0,
        angle: float = 90.0,
    ):
        super().__init__(replicas)
        owner = type(self).__name__
        self.z = (
            None if z is None else check_finite_number(owner, "z", z, positive=True)
        )
        self.reference_weight = _check_fraction(
            owner, "reference_weight", reference_weight
        )
        self.location = _check_fraction(owner, "location", location)
        self.angle = check_finite_number(owner, "angle", angle)

    def forge(self, honest, own, history):
        if not own or not own[0]:
            return [[] for _ in own]
        n = len(honest[0]) + len(own[0])
        z = ALIE.paper_z(n, len(self.replicas)) if self.z is None else self.z
        first = tf.equal(history.steps, 0.0)
        dtypes = [tf.convert_to_tensor(values[0]).dtype for values in own]
        means, references = [], []
        for values, previous in zip(honest, history.previous, strict=True):
            mu = tf.reduce_mean(tf.cast(tf.stack(values), previous.dtype), axis=0)
            lam = self.reference_weight
            reference = tf.where(first, mu, lam * previous + (1.0 - lam) * mu)
            means.append(mu)
            references.append(reference)
        # Over the whole model: <ones, reference> and ||reference||^2.
        along = tf.add_n([tf.reduce_sum(r) for r in references])
        squared = tf.add_n([tf.reduce_sum(tf.square(r)) for r in references])
        share = tf.math.divide_no_nan(along, squared)
        sideways = [tf.ones_like(r) - share * r for r in references]
        # (Rounded: 90 degrees is exactly sideways, not 6e-17 along.)
        sin = round(math.sin(math.radians(self.angle)), 12)
        cos = round(math.cos(math.radians(self.angle)), 12)
        unit_side = tf.math.rsqrt(_squared_norm(sideways))
        unit_reference = tf.math.rsqrt(squared)
        turned = [
            sin * _finite(s * unit_side) + cos * _finite(r * unit_reference)
            for s, r in zip(sideways, references, strict=True)
        ]
        length = tf.math.divide_no_nan(
            tf.constant(z, turned[0].dtype), tf.sqrt(_squared_norm(turned))
        )
        pi = self.location
        return [
            [tf.cast(pi * previous + (1.0 - pi) * mu + length * p, dtype)]
            * len(own_values)
            for previous, mu, p, dtype, own_values in zip(
                history.previous, means, turned, dtypes, own, strict=True
            )
        ]

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "z": self.z,
            "reference_weight": self.reference_weight,
            "location": self.location,
            "angle": self.angle,
        }


def _squared_norm(tensors):
    return tf.add_n([tf.reduce_sum(tf.square(t)) for t in tensors])


def _finite(t):
    """`t` with the NaNs of a 0/0 normalisation (a zero vector) as zeros."""
    return tf.where(tf.math.is_finite(t), t, tf.zeros_like(t))


def _check_fraction(owner: str, name: str, value: Any) -> float:
    value = check_finite_number(owner, name, value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(
            f"{owner}: `{name}` must be in [0, 1]. Received: {name}={value!r}"
        )
    return value
