"""The attack interface: what a simulated Byzantine replica does.

An attack names the replicas it controls and changes what they contribute,
so a robust aggregation rule can be evaluated against it:

- a *gradient attack* (`GradientAttack`) replaces the attacked replicas'
  gradients after every replica has computed its own: `UnderAttack` (in
  `harness.py`) calls `apply(dense)` with `dense[v][r]`, replica r's
  true-scale gradient of variable v, and the rule aggregates what `apply`
  returns;
- an *adaptive attack* (`AdaptiveAttack`) is a gradient attack that also
  gets the rule in use, `UnderAttack` calling `apply(dense, rule=...)`, and
  forges its values to do the rule the most damage;
- a *data attack* (e.g. `LabelFlip`) corrupts the attacked replicas' batches
  before the forward pass through `corrupt_batch`; their gradients are then
  honest gradients of bad data.

Attacks never edit their inputs: `apply` returns a new list of lists that
shares the honest replicas' tensors.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.families import ATTACKS
from keras_psdist.registry import check_arguments

PerReplica = Sequence[Sequence[tf.Tensor]]
# An aggregation rule as an adaptive attack sees it: `rule(values)`, with
# `values[v][r]` replica r's value of variable v, is one tensor per variable.
Rule = Callable[[list[list[tf.Tensor]]], Sequence[tf.Tensor]]


class Attack:
    """Base class of simulated Byzantine attacks.

    The base class attacks nothing: `apply` and `corrupt_batch` return their
    input. Gradient attacks subclass `GradientAttack`; data attacks override
    `corrupt_batch`.

    Args:
        replicas: The ids of the attacked replicas, each in `0 .. n - 1` for
            a strategy with n replicas, without duplicates. At least one
            replica must stay honest (see `check`).

    Attributes:
        name: The string id the attack is registered under.
        replicas: The attacked replica ids, a tuple in the order given.

    Raises:
        ValueError: if `replicas` is empty, holds a non-int, a negative id or
            a duplicate.

    Examples:

    >>> attack = Attack(replicas=[6, 7])
    >>> attack
    Attack(replicas=[6, 7])
    >>> attack.check(num_replicas=8)
    >>> Attack.from_config(attack.get_config()).replicas
    (6, 7)

    References:
        Lamport, Shostak, Pease, "The Byzantine Generals Problem", ACM TOPLAS
        1982 (the fault model: attacked replicas may send anything).
    """

    name = ATTACKS.id_attribute(default="attack")
    # Whether it forges from the honest replicas' values of the step (the
    # papers' omniscient attacker): a worker process of a sync run, which
    # sees only its own gradient, cannot run it.
    omniscient: bool = False

    def __init__(self, replicas: Sequence[int]):
        self.replicas: tuple[int, ...] = _check_replicas(replicas)

    def check(self, num_replicas: int) -> None:
        """Raises `ValueError` unless the attack can run with `num_replicas`.

        The strategy calls it when it is built. Every attacked id must be a
        replica, and at least one replica must stay honest: crafted attacks
        (`ALIE`, `IPM`) forge their values from the honest replicas'.

        Args:
            num_replicas: The strategy's replica count n.
        """
        if (
            isinstance(num_replicas, bool)
            or not isinstance(num_replicas, numbers.Integral)
            or num_replicas < 1
        ):
            raise ValueError(
                f"`num_replicas` must be an int >= 1. Received: num_replicas={num_replicas!r}"
            )
        outside = [r for r in self.replicas if r >= num_replicas]
        if outside:
            raise ValueError(
                f"{self!r} attacks replica {outside[0]}, but there are only "
                f"{num_replicas} replicas (valid ids: 0 to {num_replicas - 1}). "
                f"Received: replicas={list(self.replicas)}, num_replicas={num_replicas}. "
                f"Pick replica ids below {num_replicas} or add replicas."
            )
        if len(self.replicas) >= num_replicas:
            raise ValueError(
                f"{self!r} attacks every one of the {num_replicas} replicas; at "
                "least one must stay honest (crafted attacks such as ALIE forge "
                "their values from the honest replicas'). Received: "
                f"replicas={list(self.replicas)}, num_replicas={num_replicas}. "
                "Attack fewer replicas or add replicas."
            )

    def apply(self, per_replica: PerReplica) -> list[list[tf.Tensor]]:
        """Returns the values the aggregator sees, the attacked ones replaced.

        Args:
            per_replica: `per_replica[v][r]` is replica r's true-scale value
                of variable v. Not edited.

        Returns:
            A new list of lists of the same structure. The base class returns
            a copy of its input.
        """
        return [list(column) for column in per_replica]

    def corrupt_batch(self, data: Any) -> Any:
        """Returns an attacked replica's batch, as its model will see it.

        Args:
            data: A Keras batch: `x`, `(x,)`, `(x, y)` or
                `(x, y, sample_weight)`.

        Returns:
            The batch to train on. The base class returns `data` unchanged.
        """
        return data

    def get_config(self) -> dict[str, Any]:
        """Returns the attack's constructor arguments."""
        return {"replicas": list(self.replicas)}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Attack:
        """Builds the attack from `get_config()`'s output.

        Raises:
            ValueError: for a key the attack does not take or an argument it
                needs, listing the ones it accepts.
        """
        check_arguments(cls, config)
        return cls(**config)

    def __repr__(self) -> str:
        args = ", ".join(
            f"{k}={v!r}" for k, v in self.get_config().items() if v is not None
        )
        return f"{type(self).__name__}({args})"


class GradientAttack(Attack):
    """Base class of attacks that replace the attacked replicas' gradients.

    `apply` splits each variable's values into the honest replicas' and the
    attacked replicas' own (what they would have sent honestly), calls
    `forge`, and puts the forged values in the attacked replicas' places.
    Subclasses implement `forge` with TF ops only: it runs inside the
    strategy's `tf.function`, where a sparse variable's block has an unknown
    first dimension.

    Args:
        replicas: The ids of the attacked replicas (see `Attack`).

    Examples:

    >>> import tensorflow as tf
    >>> class Zero(GradientAttack):
    ...     def forge(self, honest, own):
    ...         return [[tf.zeros_like(g) for g in values] for values in own]
    >>> [column] = Zero(replicas=[0]).apply([[tf.constant([1.0]), tf.constant([2.0])]])
    >>> [v.numpy().tolist() for v in column]
    [[0.0], [2.0]]

    References:
        Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine Learning with
        Adversaries: Byzantine Tolerant Gradient Descent", NeurIPS 2017 (the
        omniscient gradient-replacing adversary: Byzantine workers see the
        honest gradients before sending theirs).
    """

    def forge(
        self, honest: list[list[tf.Tensor]], own: list[list[tf.Tensor]]
    ) -> list[list[tf.Tensor]]:
        """Forges the attacked replicas' values.

        Args:
            honest: `honest[v]`, the honest replicas' values of variable v, in
                replica order.
            own: `own[v]`, the attacked replicas' own honest values of
                variable v, in `self.replicas` order.

        Returns:
            Per variable, the forged value of each attacked replica, in
            `self.replicas` order, each of the shape and dtype of its input.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement `forge`.")

    def apply(self, per_replica: PerReplica) -> list[list[tf.Tensor]]:
        if not per_replica:
            return []
        honest, own = self._split(per_replica)
        return self._place(per_replica, self.forge(honest, own))

    def _split(
        self, per_replica: PerReplica
    ) -> tuple[list[list[tf.Tensor]], list[list[tf.Tensor]]]:
        """`(honest, own)` as `forge` takes them, after checking the count."""
        n = len(per_replica[0])
        self.check(n)
        attacked = set(self.replicas)
        honest_ids = [r for r in range(n) if r not in attacked]
        honest = [[column[r] for r in honest_ids] for column in per_replica]
        own = [[column[r] for r in self.replicas] for column in per_replica]
        return honest, own

    def _place(
        self, per_replica: PerReplica, forged: Sequence[Sequence[tf.Tensor]]
    ) -> list[list[tf.Tensor]]:
        """A copy of `per_replica` with `forged` in the attacked replicas' places."""
        if len(forged) != len(per_replica) or any(
            len(values) != len(self.replicas) for values in forged
        ):
            raise ValueError(
                f"{type(self).__name__}.forge must return, for each of the "
                f"{len(per_replica)} variables, one value per attacked replica "
                f"({len(self.replicas)}). Received: "
                f"{[len(values) for values in forged]} values per variable."
            )
        out = [list(column) for column in per_replica]
        for column, values in zip(out, forged, strict=True):
            for r, value in zip(self.replicas, values, strict=True):
                column[r] = value
        return out


class AdaptiveAttack(GradientAttack):
    """Base class of gradient attacks that forge their values against the rule.

    An adaptive attacker knows the aggregation rule in use and tunes what it
    sends to it. `apply` takes the rule as `rule`, a function from
    per-replica values (`values[v][r]`) to the aggregated values (one tensor
    per variable); `UnderAttack` passes the strategy's rule, with its state of
    the step, so the `Aggregator` interface never hears of attacks. Called
    directly, pass e.g. a bound rule's `aggregate`.

    Subclasses implement `forge(honest, own, aggregate)`: as
    `GradientAttack.forge`, plus `aggregate(forged)`, which returns what the
    rule outputs when the attacked replicas send `forged` (one list per
    variable, one value per attacked replica) and the honest replicas their
    values.

    Args:
        replicas: The ids of the attacked replicas (see `Attack`).

    Examples:

    >>> import tensorflow as tf
    >>> from keras_psdist import aggregators
    >>> class Opposite(AdaptiveAttack):
    ...     # Sends minus what the rule outputs when everyone is honest.
    ...     def forge(self, honest, own, aggregate):
    ...         clean = aggregate(own)
    ...         return [[-v] * len(values) for v, values in zip(clean, own)]
    >>> column = [tf.constant([1.0]), tf.constant([3.0]), tf.constant([5.0])]
    >>> [out] = Opposite(replicas=[2]).apply([column], rule=aggregators.Mean().aggregate)
    >>> out[2].numpy().tolist()
    [-3.0]

    References:
        Allouah, Farhadkhani, Guerraoui, Gupta, Pinot, Stephan, "Fixing by
        Mixing: A Recipe for Optimal Byzantine ML under Heterogeneity",
        AISTATS 2023 (attacks that tune their factor against the rule in use,
        as ByzFL's `Optimal_ALittleIsEnough` / `Optimal_InnerProductManipulation`).
    """

    omniscient = True

    def forge(
        self,
        honest: list[list[tf.Tensor]],
        own: list[list[tf.Tensor]],
        aggregate: Callable[[list[list[tf.Tensor]]], list[tf.Tensor]],
    ) -> list[list[tf.Tensor]]:
        """Forges the attacked replicas' values against the rule.

        Args:
            honest: As in `GradientAttack.forge`.
            own: As in `GradientAttack.forge`.
            aggregate: `aggregate(forged)`, the rule's output when the
                attacked replicas send `forged` (structured as the return
                value).

        Returns:
            As in `GradientAttack.forge`.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement `forge`.")

    def apply(
        self, per_replica: PerReplica, rule: Rule | None = None
    ) -> list[list[tf.Tensor]]:
        """Returns the values the aggregator sees, forged against `rule`.

        Args:
            per_replica: As in `Attack.apply`. Not edited.
            rule: The rule in use, as a function from per-replica values to
                the aggregated values (e.g. a bound aggregator's
                `aggregate`). Required.

        Raises:
            ValueError: if `rule` is missing.
        """
        check_rule(self, rule)
        if not per_replica:
            return []
        honest, own, aggregate = self._against(per_replica, rule)
        return self._place(per_replica, self.forge(honest, own, aggregate))

    def _against(self, per_replica: PerReplica, rule: Rule):
        """`(honest, own, aggregate)` as `forge` takes them."""
        honest, own = self._split(per_replica)

        def aggregate(forged):
            return list(rule(self._place(per_replica, forged)))

        return honest, own, aggregate


def check_finite_number(
    owner: str, name: str, value: Any, *, positive: bool = False
) -> float:
    """Returns `value` as a float; raises `ValueError` unless it is a finite real.

    Args:
        owner: The attack's class name, for the message.
        name: The argument's name.
        value: What was received.
        positive: Also require `value > 0`.
    """
    valid = (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value > 0 or not positive)
    )
    if not valid:
        kind = "a finite number > 0" if positive else "a finite number"
        raise ValueError(
            f"{owner}: `{name}` must be {kind}. Received: {name}={value!r}"
        )
    return float(value)


def check_rule(attack: Attack, rule: Any) -> None:
    """Raises `ValueError` unless `rule` is callable, naming `attack` and the fix."""
    if not callable(rule):
        raise ValueError(
            f"{attack!r} forges its values against the aggregation rule in "
            "use, so `apply` needs it: pass `rule=`, a function from "
            "per-replica values to the aggregated values (e.g. "
            "`aggregators.get('median').bind(n, f).aggregate`), or pass the "
            "attack to a strategy (`attack=`), which hands it the rule. "
            f"Received: rule={rule!r}"
        )


def _check_replicas(replicas: Any) -> tuple[int, ...]:
    if isinstance(replicas, str | bytes) or not isinstance(replicas, Sequence):
        raise ValueError(
            "`replicas` must be a non-empty list of replica ids (ints >= 0), "
            f"e.g. replicas=[6, 7]. Received: replicas={replicas!r}"
        )
    bad = [
        r
        for r in replicas
        if isinstance(r, bool) or not isinstance(r, numbers.Integral) or r < 0
    ]
    if not replicas or bad:
        raise ValueError(
            "`replicas` must be a non-empty list of replica ids (ints >= 0), "
            f"e.g. replicas=[6, 7]. Received: replicas={list(replicas)!r}"
        )
    ids = tuple(int(r) for r in replicas)
    duplicates = sorted({r for r in ids if ids.count(r) > 1})
    if duplicates:
        raise ValueError(
            f"`replicas` lists replica {duplicates[0]} more than once. List "
            f"each attacked replica once. Received: replicas={list(ids)!r}"
        )
    return ids
