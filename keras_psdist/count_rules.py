"""Counts stated as rules of the number of workers: `replicas_to_aggregate`
and `num_byzantine` that follow the cluster.

`SyncReplicaStrategy(replicas_to_aggregate=..., num_byzantine=...)` take a
number, or a rule that derives it from the number of worker processes `n`
(and `PSStrategy(num_byzantine=...)` from its number of replicas), so the
same script runs on 3 workers or 30 with the same policy:

- `All()`: `n`.
- `AllButOne()`: `n - 1` (at least 1): one backup worker, so one straggler
  never holds an update (TF1's `SyncReplicasOptimizer` with
  `replicas_to_aggregate = total_num_replicas - 1`).
- `Fraction(0.75)` or the float `0.75`: that fraction of `n`, rounded up
  for `replicas_to_aggregate` ("aggregate at least 75%") and down for
  `num_byzantine` ("tolerate up to 25% faulty"), at least 1 for
  `replicas_to_aggregate` and at least 0 for `num_byzantine`.
- the strings `"all"` and `"all_but_one"`.

The strategy derives each count once, from its cluster, and says it in its
`repr`; the rule is bound to the derived counts and refuses them as it
would refuse the numbers (Krum with too few replicas, say).

Examples:

>>> count(AllButOne(), 4, "replicas_to_aggregate")
3
>>> count(0.75, 3, "replicas_to_aggregate")  # 2.25, rounded up
3
>>> count(Fraction(0.25), 7, "num_byzantine")  # 1.75, rounded down
1
>>> count("all", 5, "replicas_to_aggregate")
5
>>> count(Fraction(1.5), 4, "replicas_to_aggregate")
Traceback (most recent call last):
...
ValueError: Fraction's `fraction` must be a number in (0, 1]: the share of the workers it counts. Received: fraction=1.5
"""

from __future__ import annotations

import math
import numbers
from typing import Any


class CountRule:
    """A count derived from the number of workers (see the module doc)."""

    def count(self, n: int, round_up: bool) -> int:
        """The count for `n` workers (`round_up`: how a fraction rounds)."""
        raise NotImplementedError

    def __eq__(self, other: Any) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(vars(self).items()))))


class All(CountRule):
    """Every worker: `n`."""

    def count(self, n: int, round_up: bool) -> int:
        return n

    def __repr__(self) -> str:
        return "All()"


class AllButOne(CountRule):
    """All workers but one: `n - 1`, at least 1 (one backup worker)."""

    def count(self, n: int, round_up: bool) -> int:
        return max(1, n - 1)

    def __repr__(self) -> str:
        return "AllButOne()"


class Fraction(CountRule):
    """A share of the workers, `fraction * n`, rounded up for
    `replicas_to_aggregate` and down for `num_byzantine`.

    Args:
        fraction: In `(0, 1]`.

    Raises:
        ValueError: for a fraction outside `(0, 1]`.
    """

    def __init__(self, fraction: float):
        if (
            isinstance(fraction, bool)
            or not isinstance(fraction, numbers.Real)
            or not math.isfinite(fraction)
            or not 0 < fraction <= 1
        ):
            raise ValueError(
                "Fraction's `fraction` must be a number in (0, 1]: the share of "
                f"the workers it counts. Received: fraction={fraction!r}"
            )
        self.fraction = float(fraction)

    def count(self, n: int, round_up: bool) -> int:
        # A tolerance so 0.75 * 4 is 3, not 3.0000000000000004 rounded up.
        exact = self.fraction * n
        if round_up:
            return math.ceil(exact - 1e-9)
        return math.floor(exact + 1e-9)

    def __repr__(self) -> str:
        return f"Fraction({self.fraction:g})"


_NAMED = {"all": All, "all_but_one": AllButOne}


def get(value: Any, name: str) -> CountRule | int | None:
    """`value` as a `CountRule`, an int (a fixed count) or `None`.

    Args:
        value: An int >= 0, a float in `(0, 1)` (a `Fraction`), `"all"`,
            `"all_but_one"`, a `CountRule`, or `None`.
        name: The argument's name, for the error.

    Raises:
        ValueError: for anything else, naming what was received and what
            works.
    """
    if value is None or isinstance(value, CountRule):
        return value
    if isinstance(value, str) and value in _NAMED:
        return _NAMED[value]()
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"`{name}` must be >= 0. Received: {name}={value!r}")
        return int(value)
    if (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 < value < 1
    ):
        return Fraction(value)
    raise ValueError(
        f"`{name}` must be a count (an int), a fraction of the workers in "
        "(0, 1) (e.g. 0.75), 'all', 'all_but_one', or a "
        "keras_psdist.count_rules rule (All(), AllButOne(), Fraction(f)). "
        f"Received: {name}={value!r}"
    )


def count(value: Any, n: int, name: str) -> int:
    """The count `value` (see `get`) gives for `n` workers (or replicas):
    `replicas_to_aggregate` rounds a fraction up, at least 1; any other
    `name` rounds down, at least 0. An int is returned as it is."""
    value = get(value, name)
    if value is None or isinstance(value, int):
        return value
    round_up = name == "replicas_to_aggregate"
    return max(1 if round_up else 0, value.count(n, round_up))
