"""Cutting global batches into the replicas' pieces (`keras_psdist.distribute.input.pieces`)
and the distributed dataset built on it."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import keras_psdist as kpd
from keras_psdist.distribute.input.pieces import Pieces, piece_bounds


def _sizes_reference(batch, n):
    """numpy: sizes differing by at most one, the larger ones first."""
    return [len(part) for part in np.array_split(np.arange(batch), n)]


@settings(max_examples=200, deadline=None)
@given(batch=st.integers(0, 300), n=st.integers(1, 16))
def test_pieces_are_consecutive_balanced_and_cover_the_batch(batch, n):
    bounds = [piece_bounds(tf.constant(batch, tf.int64), n, k) for k in range(n)]
    bounds = [(int(a), int(b)) for a, b in bounds]
    assert bounds[0][0] == 0 and bounds[-1][1] == batch
    assert all(bounds[k][1] == bounds[k + 1][0] for k in range(n - 1))
    assert [b - a for a, b in bounds] == _sizes_reference(batch, n)


def test_a_pipeline_keeps_its_pieces_of_dense_ragged_and_sparse_components():
    element = {
        "dense": tf.reshape(tf.range(10), [5, 2]),
        "ragged": tf.ragged.constant([[1], [2, 2], [], [4], [5, 5, 5]]),
        "sparse": tf.sparse.from_dense(tf.reshape(tf.range(5), [5, 1])),
    }
    kept = Pieces(num_pieces=4, low=1, high=3).cut(element)
    assert len(kept) == 2
    # 5 rows in 4 pieces: 2, 1, 1, 1; pieces 1 and 2 are rows 2 and 3.
    for piece, row in zip(kept, (2, 3), strict=True):
        np.testing.assert_array_equal(piece["dense"], [[2 * row, 2 * row + 1]])
        assert piece["ragged"].to_list() == element["ragged"][row : row + 1].to_list()
        np.testing.assert_array_equal(tf.sparse.to_dense(piece["sparse"]), [[row]])


def test_an_unbatched_dataset_is_refused_with_the_fix(cpu_devices):
    strategy = kpd.PSStrategy(devices=cpu_devices[:2])
    dataset = tf.data.Dataset.from_tensor_slices((np.zeros((4, 3)), np.zeros(4)))
    with pytest.raises(
        ValueError, match=r"shape \(\).*dataset.batch\(global_batch_size\)"
    ):
        strategy.experimental_distribute_dataset(dataset)


def test_distributed_iterator_in_a_function_does_not_retrace(cpu_devices):
    strategy = kpd.PSStrategy(devices=cpu_devices[:4])
    dataset = tf.data.Dataset.range(12).batch(4)
    distributed = strategy.experimental_distribute_dataset(dataset)
    traces = []

    @tf.function
    def first(iterator):
        traces.append(1)
        return strategy.experimental_local_results(iterator.get_next())

    for _ in range(3):  # a new iterator per epoch, as Keras makes
        firsts = first(iter(distributed))
        assert [int(t[0]) for t in firsts] == [0, 1, 2, 3]
    assert len(traces) == 1


def test_a_batch_size_known_when_tracing_gives_pieces_of_known_sizes():
    """`batch(..., drop_remainder=True)` (or Keras's batches of numpy data
    that divide evenly): the pieces' sizes are static, so the step builds no
    stand-in machinery for them (`replica_batches._static_rows`)."""
    pieces = Pieces(num_pieces=4, low=0, high=4)
    spec = (tf.TensorSpec([10, 3], tf.float32), tf.TensorSpec([10], tf.int32))
    traced = tf.function(pieces.cut, autograph=False).get_concrete_function(spec)
    shapes = [[t.shape.as_list() for t in piece] for piece in traced.structured_outputs]
    assert shapes == [[[3, 3], [3]], [[3, 3], [3]], [[2, 3], [2]], [[2, 3], [2]]]
    unknown = (tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None], tf.int32))
    traced = tf.function(pieces.cut, autograph=False).get_concrete_function(unknown)
    assert all(p[0].shape[0] is None for p in traced.structured_outputs)


def test_a_steps_optional_keeps_each_pipelines_batches_on_its_host(cpu_devices):
    # Two pipelines (as in-graph, one per worker task) reading the same
    # global batches, each keeping two of the four pieces. A step's
    # `Optional` is one per pipeline: each pipeline's batches stay on its
    # host, and it is empty when the data ends.
    from keras_psdist.distribute.input.iterators import SplitDataset, SplitOptional

    dataset = tf.data.Dataset.range(10).batch(4)  # batches of 4, 4 and 2
    hosts = cpu_devices[:2]
    distributed = SplitDataset(
        [
            (hosts[0], dataset, Pieces(4, 0, 2)),
            (hosts[1], dataset, Pieces(4, 2, 4)),
        ]
    )
    iterator = iter(distributed)
    optional = iterator.get_next_as_optional()
    assert isinstance(optional, SplitOptional)
    assert isinstance(optional, tf.experimental.Optional)
    assert bool(optional.has_value())
    replicas = optional.get_value().values
    assert [r.numpy().tolist() for r in replicas] == [[0], [1], [2], [3]]
    expected = [hosts[0]] * 2 + [hosts[1]] * 2
    assert all(r.device.endswith(h) for r, h in zip(replicas, expected, strict=True))

    @tf.function
    def total(iterator):
        # Keras's loop over steps: the optional is a loop variable, and the
        # next one comes from a `tf.cond`.
        def cond(steps, optional, total):
            return optional.has_value()

        def body(steps, optional, total):
            batch = optional.get_value()
            total += tf.add_n([tf.reduce_sum(v) for v in batch.values])
            following = tf.cond(
                steps < 100,
                iterator.get_next_as_optional,
                lambda: optional,
            )
            return steps + 1, following, total

        first = iterator.get_next_as_optional()
        zero = tf.constant(0, tf.int64)
        steps, _, total = tf.while_loop(cond, body, [0, first, zero])
        return steps, total

    steps, summed = total(iter(distributed))
    assert int(steps) == 3
    assert int(summed) == sum(range(10))
    # The second iterator above has ended; the first one has two steps left.
    iterator.get_next_as_optional()
    iterator.get_next_as_optional()
    assert not bool(iterator.get_next_as_optional().has_value())


def test_a_steps_optional_passes_into_and_out_of_a_function(cpu_devices):
    # As TensorFlow's own: an argument of a `tf.function` (without a
    # retrace for the next step's) and a result of one.
    strategy = kpd.PSStrategy(devices=cpu_devices[:2])
    dataset = tf.data.Dataset.range(8).batch(4)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    traces = []

    @tf.function
    def read(optional):
        traces.append(1)
        return strategy.experimental_local_results(optional.get_value())

    firsts = [
        [int(t[0]) for t in read(iterator.get_next_as_optional())] for _ in range(2)
    ]
    assert firsts == [[0, 2], [4, 6]]
    assert len(traces) == 1

    @tf.function
    def draw(iterator):
        return iterator.get_next_as_optional()

    assert not bool(draw(iterator).has_value())
