"""Sparse (`IndexedSlices`) gradients through every rule's `reduce`.

A robust rule sees dense blocks over the union of the rows any replica touched
(`aggregators/sparse.py`). Its result must be `IndexedSlices` over exactly
those rows, never a table of the full `dense_shape`, and equal the rule on the
densified inputs there (rows nobody touched are zero for every replica, so the
rule gives zero there too). `mean` concatenates the slices instead.

Each example touches exactly `TOUCHED` rows in all, so the blocks keep one
shape and each rule is traced once.
"""

import functools
import os
from typing import NamedTuple

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_psdist import aggregators
from tests.reference import assert_matches, condition, identical_output, spec_config

ROBUST = [name for name in aggregators.names() if name != "mean"]
ROWS, WIDTH, TOUCHED = 1000, 3, 5  # the table, and the rows touched per step
DENSE_SHAPE = (4,)  # a dense variable reduced in the same call
SPECS = [tf.TensorSpec([None, WIDTH]), tf.TensorSpec(DENSE_SHAPE)]
# Rules with a state between steps (centered clipping).
STATEFUL = [
    name
    for name in ROBUST
    if tf.nest.flatten(aggregators.get(name).initial_state(SPECS))
]
SUM, MEAN = tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN

EXAMPLES = int(os.environ.get("KERAS_PSDIST_EXAMPLES", "8"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, database=None)


@functools.cache
def _bound(name):
    """The rule bound to the smallest n it accepts with f = 1 (else f = 0)."""
    rule_name, config = spec_config(aggregators.get(name))
    for f in (1, 0):
        for n in range(3, 13):
            if condition(rule_name, n, f, **config):
                return aggregators.get(name).bind(n, f)
    raise AssertionError(f"{name!r} accepts no n <= 12")


class SparseCase(NamedTuple):
    indices: list  # per replica, int32 `[k_r]`, duplicates allowed
    rows: list  # per replica, float32 `[k_r, WIDTH]` at true scale
    dense: np.ndarray  # float32 `(n, *DENSE_SHAPE)` at true scale
    honest: np.ndarray  # `[n]` bool: not poisoned

    def tables(self):
        """Every replica's densified table, duplicate rows added up."""
        out = np.zeros((len(self.rows), ROWS, WIDTH), np.float64)
        for table, idx, rows in zip(out, self.indices, self.rows, strict=True):
            np.add.at(table, idx, rows)
        return out

    def slices(self, scale=1.0):
        return [
            tf.IndexedSlices(
                tf.constant(rows * np.float32(scale)),
                tf.constant(idx, tf.int32),
                tf.constant([ROWS, WIDTH]),
            )
            for idx, rows in zip(self.indices, self.rows, strict=True)
        ]


@st.composite
def sparse_cases(draw, n, f):
    touched = draw(
        st.lists(
            st.integers(0, ROWS - 1), min_size=TOUCHED, max_size=TOUCHED, unique=True
        )
    )
    indices = [draw(st.lists(st.sampled_from(touched), max_size=6)) for _ in range(n)]
    for row in set(touched) - {i for idx in indices for i in idx}:
        indices[draw(st.integers(0, n - 1))].append(row)  # every row touched once
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    rows = [rng.normal(size=(len(idx), WIDTH)).astype(np.float32) for idx in indices]
    dense = rng.normal(size=(n, *DENSE_SHAPE)).astype(np.float32)
    honest = np.ones(n, bool)
    for r in draw(st.permutations(range(n)))[: draw(st.integers(0, f))]:
        honest[r] = False
        if draw(st.booleans()) and len(rows[r]):
            rows[r][0, 0] = np.nan  # a non-finite replica
        else:
            rows[r] *= 1e3  # a far one
            dense[r] *= 1e3
    indices = [np.array(idx, np.int32) for idx in indices]
    return SparseCase(indices, rows, dense, honest)


def _check_and_densify(case, sparse_out):
    """Checks the result's structure; returns it scattered into the table."""
    assert isinstance(sparse_out, tf.IndexedSlices)
    indices = sparse_out.indices.numpy()
    union = np.unique(np.concatenate(case.indices))
    assert sorted(indices.tolist()) == union.tolist()  # each touched row once
    assert sparse_out.values.shape == (TOUCHED, WIDTH)  # not (ROWS, WIDTH)
    assert tf.get_static_value(sparse_out.dense_shape).tolist() == [ROWS, WIDTH]
    table = np.zeros((ROWS, WIDTH), np.float32)
    table[indices] = sparse_out.values.numpy()
    return table


def _assert_matches(rule, case, table, dense_out, **extra):
    inputs = [case.tables(), case.dense]
    scale = max(1e-3, *(float(np.abs(x[case.honest]).max()) for x in inputs))
    assert_matches(rule, inputs, [table, np.asarray(dense_out)], scale=scale, **extra)


def _scaled_dense(case, n):
    return [tf.constant(v / np.float32(n)) for v in case.dense]


@pytest.mark.parametrize("name", ROBUST)
@PROPERTY
@given(data=st.data())
def test_robust_rule_reduces_sparse_rows_like_the_dense_table(name, data):
    rule = _bound(name)
    n = rule.num_replicas
    case = data.draw(sparse_cases(n, rule.f))
    sparse_out, dense_out = rule.reduce(
        SUM, [case.slices(1.0 / n), _scaled_dense(case, n)]
    )
    _assert_matches(rule, case, _check_and_densify(case, sparse_out), dense_out)


@pytest.mark.parametrize("name", STATEFUL)
@PROPERTY
@given(data=st.data())
def test_sparse_blocks_carry_no_state(name, data):
    # A stateful rule (centered clipping) starts a dense variable from the
    # previous step's output but a sparse block always from the median: its
    # rows change from step to step, even when their number does not.
    rule = _bound(name)
    n = rule.num_replicas
    first = data.draw(sparse_cases(n, rule.f))
    second = data.draw(sparse_cases(n, rule.f))
    state = rule.initial_state(SPECS)
    outputs = []
    for case in (first, second):
        columns = [case.slices(1.0 / n), _scaled_dense(case, n)]
        (sparse_out, dense_out), _, state = rule.step(SUM, columns, state=state)
        outputs.append(dense_out)
    assert name == "centered_clipping", f"say how {name!r}'s reference takes its state"
    extra = {"center": [None, np.asarray(outputs[0])]}  # the previous output
    _assert_matches(
        rule, second, _check_and_densify(second, sparse_out), dense_out, **extra
    )


def _in_a_graph(rule):
    """`rule.reduce(SUM, ...)` traced as the strategy runs it: rows unknown."""
    n = rule.num_replicas
    spec = tf.IndexedSlicesSpec(
        shape=[ROWS, WIDTH], indices_dtype=tf.int32, dense_shape_dtype=tf.int32
    )

    @tf.function(input_signature=[[spec] * n, [tf.TensorSpec(DENSE_SHAPE)] * n])
    def reduce(slices, dense):
        return rule.reduce(SUM, [slices, dense])

    return reduce


@pytest.mark.parametrize("name", ROBUST)
def test_sparse_reduce_in_a_graph_and_duplicate_rows_add_up(name):
    rule = _bound(name)
    n = rule.num_replicas
    reduce = _in_a_graph(rule)
    rng = np.random.default_rng(0)
    touched = [3, 17, 400, 999, 5]
    indices = [np.array(touched, np.int32)]
    indices += [rng.choice(touched, size=4).astype(np.int32) for _ in range(n - 1)]
    rows = [rng.normal(size=(len(i), WIDTH)).astype(np.float32) for i in indices]
    dense = rng.normal(size=(n, *DENSE_SHAPE)).astype(np.float32)
    case = SparseCase(indices, rows, dense, np.ones(n, bool))
    sparse_out, dense_out = reduce(case.slices(1.0 / n), _scaled_dense(case, n))
    _assert_matches(rule, case, _check_and_densify(case, sparse_out), dense_out)

    # Every replica sends row 2 twice, parts that differ but add up to 3.5,
    # and rows 7, 11, 12, 13 once: added up, the replicas agree, so every rule
    # must return their common value (clipped, for static clipping); either
    # part alone would be below 3.5.
    indices = [np.array([2, 7, 2, 11, 12, 13], np.int32)] * n
    rows = [
        np.array([[p, 0, 0], [1, 1, 1], [3.5 - p, 0, 0], *[[1, 1, 1]] * 3], np.float32)
        for p in 0.1 * np.arange(1, n + 1)
    ]
    case = SparseCase(indices, rows, np.zeros_like(dense), np.ones(n, bool))
    sparse_out, _ = reduce(case.slices(1.0 / n), _scaled_dense(case, n))
    table = _check_and_densify(case, sparse_out)
    common = [case.tables()[0], case.dense[0]]
    [expected, _] = identical_output(rule, common)
    np.testing.assert_allclose(table, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("reduce_op", [SUM, MEAN], ids=["sum", "mean"])
def test_mean_concatenates_slices(reduce_op):
    n = 3
    indices = [
        np.array([3, 3], np.int32),
        np.array([], np.int32),
        np.array([999, 3], np.int32),
    ]
    rows = [
        np.arange(2 * WIDTH, dtype=np.float32).reshape(2, WIDTH) + r for r in range(n)
    ]
    rows[1] = np.zeros((0, WIDTH), np.float32)
    case = SparseCase(
        indices, rows, np.zeros((n, *DENSE_SHAPE), np.float32), np.ones(n, bool)
    )
    # Keras sends SUM 1/n-scaled values; MEAN true-scale ones.
    scale = 1.0 / n if reduce_op == SUM else 1.0
    out = aggregators.get("mean").bind(n).reduce_sparse(reduce_op, case.slices(scale))

    assert isinstance(out, tf.IndexedSlices)
    np.testing.assert_array_equal(out.indices.numpy(), np.concatenate(indices))
    np.testing.assert_allclose(out.values.numpy(), np.concatenate(rows) / n, rtol=1e-6)
    assert out.values.shape == (4, WIDTH)  # all rows sent, never the table
    table = np.zeros((ROWS, WIDTH))
    np.add.at(table, out.indices.numpy(), out.values.numpy())
    np.testing.assert_allclose(table, case.tables().mean(axis=0), rtol=1e-6)
