"""Statistics of measured values: medians, ratios paired round by round,
and how far repeated training runs fall below each other by chance
(`chance_gap`, `points_below`).

Not named ``statistics.py``: run from this folder, that name would hide the
standard library's module, which this one uses.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def median_or_none(values: Iterable[float]) -> float | None:
    """The median, or None for no values.

    >>> median_or_none([3, 1, 2]), median_or_none([])
    (2, None)
    """
    values = list(values)
    return statistics.median(values) if values else None


def paired_ratios(
    values: Mapping[Any, float | None], baseline: Mapping[Any, float | None]
) -> list[float]:
    """Per round present in both (and non-zero in `baseline`): value / baseline.

    >>> paired_ratios({0: 2.0, 1: 3.0, 2: None}, {0: 1.0, 1: 2.0, 2: 1.0})
    [2.0, 1.5]
    """
    return [
        v / baseline[r] for r, v in values.items() if v is not None and baseline.get(r)
    ]


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing (or b is 0).

    >>> ratio(3.0, 2.0), ratio(None, 2.0), ratio(1.0, 0)
    (1.5, None, None)
    """
    return a / b if a is not None and b else None


def chance_gap(
    clean: Sequence[float],
    runs: Sequence[float],
    columns: int,
    tolerance: float,
    draws: int = 20_000,
) -> tuple[float, float]:
    """How far the worst of `columns` runs falls below one clean run by chance.

    `clean` and `runs` are accuracies in [0, 1] of repeated runs without any
    attack (the clean reference's and a configuration's); each draw takes
    one of `clean` and the lowest of `columns` of `runs`, with replacement.
    Returns the expected gap in points and the fraction of draws whose gap
    exceeds `tolerance` points (seeded: the same inputs give the same
    answer).

    >>> chance_gap([0.9, 0.9], [0.9, 0.9], columns=11, tolerance=2.0)
    (0.0, 0.0)
    >>> chance_gap([0.98], [0.95, 0.97], columns=11, tolerance=2.0)  # 1 in 2**11: 1.0
    (3.0, 0.999)
    """
    rng = random.Random(0)
    gaps = [
        100 * (rng.choice(clean) - min(rng.choices(runs, k=columns)))
        for _ in range(draws)
    ]
    over = sum(gap > tolerance for gap in gaps) / draws
    return round(statistics.fmean(gaps), 2), round(over, 3)


def points_below(
    reference: Sequence[float], runs: Sequence[float]
) -> tuple[float, float]:
    """How far the mean of `runs` lies below the mean of `reference` (accuracies
    in [0, 1]), in points, and that difference's standard error (unequal
    variances; each needs two runs or more).

    >>> points_below([0.97, 0.99], [0.95, 0.95])
    (3.0, 1.0)
    """
    a, b = list(reference), list(runs)
    se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    gap = statistics.fmean(a) - statistics.fmean(b)
    return round(100 * gap, 2), round(100 * se, 2)
