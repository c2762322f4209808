"""The non-IID helpers: the Dirichlet split and the per-replica dataset."""

import numpy as np
import pytest
import tensorflow as tf

import keras_psdist as kpd
from keras_psdist.heterogeneity import dirichlet_split, per_replica_dataset

# 10 classes of 300 examples, in a scrambled order.
LABELS = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 300))


def _label_fractions(parts, labels=LABELS, num_classes=10):
    """`[num_parts, num_classes]`: each part's label distribution."""
    counts = np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])
    return counts / counts.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("alpha", [0.01, 0.5, 100.0])
@pytest.mark.parametrize("num_parts", [1, 4, 8])
def test_split_is_a_partition_without_empty_parts(num_parts, alpha):
    parts = dirichlet_split(LABELS, num_parts, alpha, seed=3)
    assert len(parts) == num_parts
    assert all(p.dtype == np.int64 and p.size > 0 for p in parts)
    assert all(np.all(np.diff(p) > 0) for p in parts)  # sorted, no repeats
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(3000))


def test_large_alpha_is_near_iid():
    fractions = _label_fractions(dirichlet_split(LABELS, 8, alpha=1e4, seed=1))
    # Each part holds about 375 examples, 37.5 per class.
    np.testing.assert_allclose(fractions, 0.1, atol=0.03)


def test_small_alpha_is_skewed():
    fractions = _label_fractions(dirichlet_split(LABELS, 8, alpha=0.05, seed=1))
    # Most of each part is one or two classes; IID parts would be at 0.1.
    assert np.median(fractions.max(axis=1)) > 0.6
    assert np.mean(fractions < 0.01) > 0.5
    # And more skewed than with a moderate alpha, seed for seed.
    moderate = _label_fractions(dirichlet_split(LABELS, 8, alpha=1.0, seed=1))
    assert fractions.max(axis=1).mean() > moderate.max(axis=1).mean()


def test_split_is_reproducible_by_seed():
    a = dirichlet_split(LABELS, 5, alpha=0.3, seed=7)
    b = dirichlet_split(LABELS, 5, alpha=0.3, seed=7)
    c = dirichlet_split(LABELS, 5, alpha=0.3, seed=8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_empty_parts_take_one_example_from_the_largest():
    # alpha tiny: each class lands whole in one part; 3 classes, 6 parts.
    labels = np.repeat([0, 1, 2], [10, 20, 30])
    parts = dirichlet_split(labels, 6, alpha=1e-4, seed=0)
    sizes = sorted(len(p) for p in parts)
    assert min(sizes) >= 1 and sum(sizes) == 60
    # At most num_parts - 1 examples moved off the classes' runs.
    assert sum(1 for s in sizes if s == 1) <= 5
    parts = dirichlet_split(np.zeros(4, int), 4, alpha=1e-4, seed=0)
    assert sorted(len(p) for p in parts) == [1, 1, 1, 1]


def test_split_accepts_column_labels_and_any_class_values():
    column = LABELS[:, None]
    a = dirichlet_split(column, 3, alpha=1.0)
    b = dirichlet_split(LABELS, 3, alpha=1.0)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    strings = np.array(["cat", "dog"])[LABELS % 2]
    parts = dirichlet_split(strings, 2, alpha=1.0)
    assert sum(len(p) for p in parts) == len(LABELS)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"alpha": 0.0}, "Received: alpha=0.0"),
        ({"alpha": -1.0}, "Received: alpha=-1.0"),
        ({"alpha": float("inf")}, "Received: alpha=inf"),
        ({"alpha": float("nan")}, "Received: alpha=nan"),
        ({"alpha": "1"}, "Received: alpha='1'"),
        ({"alpha": True}, "Received: alpha=True"),
        ({"num_parts": 0}, r"from 1 to the number of examples \(3000\).*num_parts=0"),
        ({"num_parts": 3001}, "num_parts=3001"),
        ({"num_parts": 2.0}, "num_parts=2.0"),
        ({"num_parts": True}, "num_parts=True"),
        ({"seed": 1.5}, "seed=1.5"),
    ],
)
def test_split_errors(kwargs, match):
    arguments = {"num_parts": 4, "alpha": 1.0, **kwargs}
    with pytest.raises(ValueError, match=match):
        dirichlet_split(LABELS, **arguments)


@pytest.mark.parametrize(
    "labels, match",
    [
        (np.zeros((10, 3)), r"np.argmax.*shape \(10, 3\)"),
        (np.array([]), r"non-empty.*shape \(0,\)"),
        (np.int64(3), r"shape \(\)"),
    ],
)
def test_split_rejects_other_labels(labels, match):
    with pytest.raises(ValueError, match=match):
        dirichlet_split(labels, 2, alpha=1.0)


# ------------------------------------------------------------- the dataset


def _indexed(num_examples):
    """`x` whose row i is `[i, -i]` (rows tell their index), `y = i % 10`."""
    i = np.arange(num_examples)
    return np.stack([i, -i], axis=1).astype(np.float32), (i % 10).astype(np.int32)


def test_slice_r_of_every_batch_comes_from_part_r():
    x, y = _indexed(3000)
    parts = dirichlet_split(LABELS, 4, alpha=0.3, seed=2)
    dataset = per_replica_dataset(x, y, parts, per_replica_batch=16, seed=5)
    steps = int(np.ceil(max(len(p) for p in parts) / 16))
    assert int(dataset.cardinality()) == steps
    assert dataset.element_spec[0].shape == (64, 2)
    seen = [set() for _ in parts]
    batches = list(dataset.as_numpy_iterator())
    assert len(batches) == steps
    for xb, yb in batches:
        rows = xb[:, 0].astype(np.int64)
        np.testing.assert_array_equal(yb, rows % 10)  # x and y stay aligned
        for r, part in enumerate(parts):
            piece = rows[r * 16 : (r + 1) * 16]
            assert np.isin(piece, part).all(), (r, piece)
            seen[r].update(piece.tolist())
    # The largest part is seen whole in an epoch; smaller ones repeat.
    largest = int(np.argmax([len(p) for p in parts]))
    assert seen[largest] == set(parts[largest].tolist())
    assert all(s == set(p.tolist()) for s, p in zip(seen, parts, strict=True))


def test_epochs_reshuffle_and_seeds_reproduce():
    x, y = _indexed(40)
    parts = [np.arange(0, 30), np.arange(30, 40)]

    def epoch(dataset):
        return np.concatenate([xb[:, 0] for xb, _ in dataset.as_numpy_iterator()])

    first = per_replica_dataset(x, y, parts, per_replica_batch=5, seed=1)
    again = per_replica_dataset(x, y, parts, per_replica_batch=5, seed=1)
    np.testing.assert_array_equal(epoch(first), epoch(again))
    assert not np.array_equal(epoch(first), epoch(first))  # next epoch reshuffled


def test_the_strategy_gives_replica_r_part_r(cpu_devices):
    # The contract the module relies on: PSStrategy's contiguous slices.
    x, y = _indexed(200)
    parts = [np.arange(50 * r, 50 * (r + 1)) for r in range(4)]
    strategy = kpd.PSStrategy(devices=cpu_devices[:4])
    dataset = per_replica_dataset(x, y, parts, per_replica_batch=5)
    distributed = strategy.experimental_distribute_dataset(dataset)
    for step, (xb, _) in enumerate(distributed):
        local = strategy.experimental_local_results(xb)
        assert len(local) == 4
        for r, value in enumerate(local):
            rows = value.numpy()[:, 0]
            assert len(rows) == 5 and np.isin(rows, parts[r]).all(), (step, r, rows)
        if step == 2:
            break


@pytest.mark.parametrize(
    "args, match",
    [
        ((np.zeros((5, 2)), np.zeros(4)), r"x of shape \(5, 2\), y of shape \(4,\)"),
        ((np.zeros((5, 2)), np.zeros(5), []), "parts=\\[\\]"),
        ((np.zeros((5, 2)), np.zeros(5), [np.array([], int)]), "part 0 of shape"),
        ((np.zeros((5, 2)), np.zeros(5), [np.array([0.5])]), "dtype float64"),
        ((np.zeros((5, 2)), np.zeros(5), [np.array([1, 5])]), "index 5.*0 to 4"),
        ((np.zeros((5, 2)), np.zeros(5), [np.array([-1])]), "index -1"),
        ((np.zeros((5, 2)), np.zeros(5), np.zeros((2, 2), int)), "list of index"),
        ((np.zeros((5, 2)), np.zeros(5), [np.array([1])], 0), "per_replica_batch=0"),
        ((np.zeros((5, 2)), np.zeros(5), [np.array([1])], 2.0), "per_replica_batch"),
    ],
)
def test_dataset_errors(args, match):
    full = list(args) + [[np.arange(5)], 2][len(args) - 2 :]
    with pytest.raises(ValueError, match=match):
        per_replica_dataset(*full)


def test_dataset_yields_tensors_of_the_inputs_dtypes():
    x, y = _indexed(10)
    dataset = per_replica_dataset(x, y, [np.arange(10)], per_replica_batch=4)
    xb, yb = next(iter(dataset))
    assert xb.dtype == tf.float32 and yb.dtype == tf.int32
    assert int(dataset.cardinality()) == 3
