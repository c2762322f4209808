"""Subsets of n - f replicas: what the exact subset-search rules compare.

MDA (the smallest diameter) and SMEA (the smallest largest eigenvalue) look at
every subset of n - f replicas, C(n, f) of them per step, which grows
exponentially in f; `check_subset_count` refuses a configuration beyond a rule's
limit when it is bound, saying up to where the rule is practical.

Examples:

>>> all_subsets(4, 3).tolist()
[[0, 1, 2], [0, 1, 3], [0, 2, 3], [1, 2, 3]]
>>> masks(all_subsets(3, 2), 3).astype(int).tolist()
[[1, 1, 0], [1, 0, 1], [0, 1, 1]]
"""

from __future__ import annotations

import itertools
import math

import numpy as np


def all_subsets(n: int, k: int) -> np.ndarray:
    """Every subset of k of n replicas, int64 `[C(n, k), k]`, in lexicographic order."""
    return np.array(list(itertools.combinations(range(n), k)), np.int64).reshape(-1, k)


def masks(subsets: np.ndarray, n: int) -> np.ndarray:
    """bool `[C(n, k), n]`: which of n replicas each subset holds."""
    out = np.zeros([len(subsets), n], bool)
    np.put_along_axis(out, subsets, True, axis=1)
    return out


def check_subset_count(
    rule: object, num_replicas: int, num_byzantine: int, limit: int, practical: str
) -> None:
    """Raises `ValueError` when C(n, f) is over `limit` subsets a step.

    Args:
        rule: The rule, for its name.
        num_replicas: n.
        num_byzantine: f.
        limit: The most subsets the rule compares in one step.
        practical: Where the rule is practical, e.g. "about n = 24 with f = n / 4".
    """
    count = math.comb(num_replicas, num_byzantine)
    if count > limit:
        raise ValueError(
            f"{type(rule).__name__} compares every subset of num_replicas - "
            f"num_byzantine replicas: C({num_replicas}, {num_byzantine}) = "
            f"{count:,} per step, over its limit of {limit:,} (practical up to "
            f"{practical}). Received: {num_replicas} replicas, "
            f"num_byzantine={num_byzantine}. Use a rule that is polynomial in n "
            "(caf, multi_krum, geometric_median, nnm>trimmed_mean), or fewer "
            "replicas."
        )
