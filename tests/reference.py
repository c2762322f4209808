"""numpy reference implementations of every aggregation rule.

Each takes `per_replica`, an array of shape `(n, ...)` of true-scale values,
and returns the rule's estimate of their mean. The TF rules must match them.
"""

import numpy as np


def mean(per_replica: np.ndarray) -> np.ndarray:
    return np.mean(per_replica, axis=0)


REFERENCES = {"mean": mean}
