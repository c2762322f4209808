"""Non-IID data: a Dirichlet split of a dataset over replicas, and its input.

Robust rules are usually evaluated with every replica drawing from the same
distribution; under heterogeneous data, honest replicas disagree and an
attacker hides more easily (`attacks.Mimic` exploits exactly that). Two
helpers make such a run:

- `dirichlet_split(labels, num_parts, alpha)` splits a dataset's indices
  into parts whose label proportions follow a Dirichlet(alpha) draw per
  class: a large alpha gives near-IID parts, a small one parts dominated by
  a few classes;
- `per_replica_dataset(x, y, parts, per_replica_batch)` makes the
  `tf.data.Dataset` that feeds part r to replica r. A `PSStrategy` with n
  replicas cuts every global batch into n contiguous equal slices, in
  replica order (`keras_psdist/distribute/input/pieces.py`), so slice r of
  each batch is drawn from part r.

Examples:

>>> import numpy as np
>>> labels = np.repeat(np.arange(4), 25)
>>> parts = dirichlet_split(labels, num_parts=4, alpha=0.1, seed=0)
>>> sorted(np.concatenate(parts).tolist()) == list(range(100))
True
>>> dataset = per_replica_dataset(np.eye(100), labels, parts, per_replica_batch=8)
>>> x, y = next(iter(dataset))
>>> x.shape  # 4 replicas x 8 rows
TensorShape([32, 100])

References:
    Hsu, Qi, Brown, "Measuring the Effects of Non-Identical Data
    Distribution for Federated Visual Classification", arXiv 1909.06335,
    2019 (the per-class Dirichlet split).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf


def dirichlet_split(
    labels: Any, num_parts: int, alpha: float, seed: int = 0
) -> list[np.ndarray]:
    """Splits example indices into `num_parts` parts with Dirichlet label skew.

    For each class c, its examples (shuffled) are cut into `num_parts`
    consecutive runs whose sizes follow proportions `p_c ~
    Dirichlet(alpha, ..., alpha)`, drawn independently per class (each cut
    rounded down). Part k gets run k of every class. Every index is used
    exactly once.

    No part is left empty: a part that received nothing takes one example,
    the last, from the part holding the most examples, until every part has
    one (at most `num_parts - 1` examples move; with a moderate alpha and
    many examples per part, none do).

    Args:
        labels: The class of every example: a 1-D array (or `(N, 1)`) of
            integers or any sortable values. One-hot labels: pass
            `np.argmax(y, axis=-1)`.
        num_parts: The number of parts (replicas), an int >= 1 and at most
            the number of examples.
        alpha: The Dirichlet concentration, a finite number > 0: large
            (e.g. 1000) gives parts with nearly the overall label
            distribution, small (e.g. 0.1) parts dominated by a few classes.
        seed: The seed of the numpy generator that draws the proportions and
            shuffles the examples. Defaults to `0`.

    Returns:
        `num_parts` int64 arrays of indices into `labels`, each sorted and
        non-empty; together a partition of `range(len(labels))`.

    Raises:
        ValueError: for labels that are not 1-D or are empty, a `num_parts`
            that is not an int in `[1, len(labels)]`, an `alpha` that is not
            a finite number > 0, or a `seed` that is not an int.

    Examples:

    >>> import numpy as np
    >>> labels = np.repeat([0, 1], 50)
    >>> parts = dirichlet_split(labels, num_parts=2, alpha=1000.0)
    >>> [np.bincount(labels[p], minlength=2).tolist() for p in parts]
    [[23, 24], [27, 26]]
    >>> parts = dirichlet_split(labels, num_parts=2, alpha=0.01)
    >>> [np.bincount(labels[p], minlength=2).tolist() for p in parts]
    [[50, 0], [0, 50]]

    References:
        Hsu, Qi, Brown, "Measuring the Effects of Non-Identical Data
        Distribution for Federated Visual Classification", arXiv 1909.06335,
        2019 (one Dirichlet draw per class over the parts).
    """
    labels = _check_labels(labels)
    if (
        isinstance(num_parts, bool)
        or not isinstance(num_parts, numbers.Integral)
        or not 1 <= num_parts <= len(labels)
    ):
        raise ValueError(
            f"`num_parts` must be an int from 1 to the number of examples "
            f"({len(labels)}), so that every part gets one. Received: "
            f"num_parts={num_parts!r}"
        )
    if (
        isinstance(alpha, bool)
        or not isinstance(alpha, numbers.Real)
        or not math.isfinite(alpha)
        or alpha <= 0
    ):
        raise ValueError(
            "`alpha` must be a finite number > 0 (e.g. 0.1 for strongly "
            f"skewed parts, 1000 for nearly IID ones). Received: alpha={alpha!r}"
        )
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"`seed` must be an int. Received: seed={seed!r}")
    rng = np.random.default_rng(int(seed))
    num_parts = int(num_parts)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_parts)]
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        proportions = rng.dirichlet(np.full(num_parts, float(alpha)))
        cuts = (np.cumsum(proportions)[:-1] * len(members)).astype(np.int64)
        for part, run in zip(parts, np.split(members, cuts), strict=True):
            part.append(run)
    out = [np.concatenate(p).astype(np.int64) for p in parts]
    for k in range(num_parts):
        if out[k].size == 0:
            largest = max(range(num_parts), key=lambda j: out[j].size)
            out[k], out[largest] = out[largest][-1:], out[largest][:-1]
    return [np.sort(p) for p in out]


def per_replica_dataset(
    x: Any,
    y: Any,
    parts: Sequence[Any],
    per_replica_batch: int,
    seed: int = 0,
) -> tf.data.Dataset:
    """A dataset of global batches whose slice r comes from `parts[r]`.

    Each element is `(x_batch, y_batch)` of `len(parts) * per_replica_batch`
    rows: rows `r * per_replica_batch` to `(r + 1) * per_replica_batch - 1`
    are examples of part r. Pass it to `model.fit` under a strategy with
    `len(parts)` replicas, which gives slice r to replica r.

    Each part is read as an endless stream, reshuffled at every pass, so a
    part smaller than the largest repeats within an epoch and every step has
    data for every replica. One epoch (one iteration of the dataset) is
    `ceil(max(len(p) for p in parts) / per_replica_batch)` steps: the
    largest part is seen about once; `dataset.cardinality()` gives the
    number. Each iteration (each epoch of `fit`) reshuffles, so pass
    `shuffle=False` to `fit` (Keras warns that it ignores `shuffle=True` for
    a dataset, its default). For epochs of a set length, `.repeat()` it and
    pass `steps_per_epoch`, as `benchmarks/robustness.py` does (11 steps).

    Args:
        x: The features, an array with one row per example.
        y: The labels, an array with as many rows as `x`.
        parts: The index arrays of each replica's examples (e.g. from
            `dirichlet_split`), each non-empty, with indices into `x`.
        per_replica_batch: The rows each replica gets per step, an int >= 1.
        seed: The shuffles' seed: part r is shuffled with op seed `seed + r`
            (with TensorFlow's global seed, if set). Defaults to `0`.

    Returns:
        A finite `tf.data.Dataset` of `(x_batch, y_batch)` with a static
        batch dimension.

    Raises:
        ValueError: if `x` and `y` differ in length, `parts` is empty or
            holds an empty part or an index outside `x`, or
            `per_replica_batch` is not an int >= 1.

    Examples:

    >>> import numpy as np
    >>> x = np.arange(10.0)[:, None]  # example i has feature i
    >>> parts = [np.array([0, 1, 2, 3, 4, 5]), np.array([8, 9])]
    >>> dataset = per_replica_dataset(x, np.zeros(10), parts, per_replica_batch=2)
    >>> int(dataset.cardinality())  # ceil(6 / 2)
    3
    >>> slices = [(xb[:2, 0].numpy(), xb[2:, 0].numpy()) for xb, _ in dataset]
    >>> all(set(a) <= {0, 1, 2, 3, 4, 5} and sorted(b) == [8, 9] for a, b in slices)
    True
    """
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim == 0 or y.ndim == 0 or len(x) != len(y):
        raise ValueError(
            "`x` and `y` must be arrays with one row per example, as many in "
            f"both. Received: x of shape {x.shape}, y of shape {y.shape}."
        )
    if (
        isinstance(per_replica_batch, bool)
        or not isinstance(per_replica_batch, numbers.Integral)
        or per_replica_batch < 1
    ):
        raise ValueError(
            "`per_replica_batch` must be an int >= 1. Received: "
            f"per_replica_batch={per_replica_batch!r}"
        )
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"`seed` must be an int. Received: seed={seed!r}")
    indices = _check_parts(parts, len(x))
    batch = int(per_replica_batch)
    steps = math.ceil(max(len(p) for p in indices) / batch)
    streams = tuple(
        tf.data.Dataset.from_tensor_slices(p)
        .shuffle(len(p), seed=int(seed) + r, reshuffle_each_iteration=True)
        .repeat()
        .batch(batch, drop_remainder=True)
        for r, p in enumerate(indices)
    )
    features, labels = tf.constant(x), tf.constant(y)

    def gather(*slices):
        rows = tf.concat(slices, axis=0)
        return tf.gather(features, rows), tf.gather(labels, rows)

    return tf.data.Dataset.zip(streams).take(steps).map(gather)


def _check_labels(labels: Any) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.ndim != 1 or labels.size == 0:
        raise ValueError(
            "`labels` must be a non-empty 1-D array of class ids (or of shape "
            "(N, 1)); for one-hot labels pass np.argmax(y, axis=-1). "
            f"Received: labels of shape {labels.shape}."
        )
    return labels


def _check_parts(parts: Any, num_examples: int) -> list[np.ndarray]:
    if isinstance(parts, np.ndarray | str) or not isinstance(parts, Sequence):
        raise ValueError(
            "`parts` must be a list of index arrays, one per replica (e.g. "
            f"from dirichlet_split). Received: {type(parts).__name__}."
        )
    if not parts:
        raise ValueError(
            "`parts` must hold one index array per replica. Received: parts=[]"
        )
    out = []
    for r, part in enumerate(parts):
        part = np.asarray(part)
        if (
            part.ndim != 1
            or part.size == 0
            or not np.issubdtype(part.dtype, np.integer)
        ):
            raise ValueError(
                f"Each part must be a non-empty 1-D array of example indices. "
                f"Received: part {r} of shape {part.shape} and dtype {part.dtype}."
            )
        outside = part[(part < 0) | (part >= num_examples)]
        if outside.size:
            raise ValueError(
                f"Part {r} holds index {int(outside[0])}, outside the "
                f"{num_examples} examples of `x` (valid: 0 to {num_examples - 1}). "
                "Build the parts from the same arrays."
            )
        out.append(part.astype(np.int64))
    return out
