"""Partitioners: TF's numbers, the never-split cases, and every error path."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tensorflow as tf

from keras_psdist import partitioners

tf_partitioners = tf.distribute.experimental.partitioners

SHAPES = [
    (1,),
    (2,),
    (3,),
    (7,),
    (1000,),
    (123457,),
    (2, 3),
    (5, 1),
    (6, 1),
    (10, 3),
    (100, 64),
    (1000, 1000),
    (4096, 128),
    (3, 100000),
    (4, 5, 6),
    (2, 1000, 50),
    (1000, 3, 7),
]
DTYPES = [tf.float32, tf.float64, tf.int64, tf.string]
BYTES = [1, 4, 7, 24, 100, 4096, 256 << 10, (64 << 20) - 1]
MAX_SHARDS = [1, 2, 3, 8, 1000]
GRID = list(itertools.product(SHAPES, DTYPES))


def _ours_and_tfs(ours, theirs):
    for shape, dtype in GRID:
        shape = tf.TensorShape(shape)
        yield shape, dtype, ours(shape, dtype), theirs(shape, dtype)


@pytest.mark.parametrize("shards", [1, 2, 3, 4, 16, 10**6])
def test_fixed_matches_tf(shards):
    ours = partitioners.Fixed(shards, min_variable_bytes=0)
    theirs = tf_partitioners.FixedShardsPartitioner(shards)
    for shape, dtype, got, want in _ours_and_tfs(ours, theirs):
        assert got == want, (shape, dtype)


@pytest.mark.parametrize("min_shard_bytes", BYTES)
@pytest.mark.parametrize("max_shards", MAX_SHARDS)
@pytest.mark.parametrize("bytes_per_string", [1, 16])
def test_min_size_matches_tf(min_shard_bytes, max_shards, bytes_per_string):
    kwargs = dict(
        min_shard_bytes=min_shard_bytes,
        max_shards=max_shards,
        bytes_per_string=bytes_per_string,
    )
    ours = partitioners.MinSize(**kwargs)
    theirs = tf_partitioners.MinSizePartitioner(**kwargs)
    for shape, dtype, got, want in _ours_and_tfs(ours, theirs):
        assert got == want, (shape, dtype)


@pytest.mark.parametrize("max_shard_bytes", BYTES)
@pytest.mark.parametrize("max_shards", [None, *MAX_SHARDS])
@pytest.mark.parametrize("bytes_per_string", [1, 16])
def test_max_size_matches_tf(max_shard_bytes, max_shards, bytes_per_string):
    kwargs = dict(
        max_shard_bytes=max_shard_bytes,
        max_shards=max_shards,
        bytes_per_string=bytes_per_string,
    )
    ours = partitioners.MaxSize(**kwargs)
    theirs = tf_partitioners.MaxSizePartitioner(**kwargs)
    for shape, dtype, got, want in _ours_and_tfs(ours, theirs):
        assert got == want, (shape, dtype)


def test_defaults_match_tf():
    pairs = [
        (partitioners.MinSize(), tf_partitioners.MinSizePartitioner()),
        (
            partitioners.MinSize(max_shards=64),
            tf_partitioners.MinSizePartitioner(max_shards=64),
        ),
        (partitioners.MaxSize(1 << 20), tf_partitioners.MaxSizePartitioner(1 << 20)),
    ]
    for ours, theirs in pairs:
        for shape, dtype, got, want in _ours_and_tfs(ours, theirs):
            assert got == want, (ours, shape, dtype)


@pytest.mark.parametrize(
    "partitioner",
    [
        partitioners.Fixed(4, min_variable_bytes=0),
        partitioners.MinSize(min_shard_bytes=1, max_shards=100),
        partitioners.MaxSize(max_shard_bytes=1),
    ],
    ids=lambda p: type(p).__name__,
)
def test_axis_other_than_zero(partitioner):
    shape = tf.TensorShape([3, 10, 5])
    assert partitioner(shape, tf.float32, axis=1)[0::2] == [1, 1]
    assert partitioner(shape, tf.float32, axis=1)[1] > 1
    assert partitioner(shape, tf.float32, axis=-1) == partitioner(
        shape, tf.float32, axis=2
    )
    assert partitioner(shape=shape, dtype=tf.float32) == partitioner(shape, "float32")


def test_never_more_shards_than_rows():
    for shape in [(1,), (2, 8), (3, 1000)]:
        for p in [
            partitioners.Fixed(16, min_variable_bytes=0),
            partitioners.MinSize(min_shard_bytes=1, max_shards=16),
            partitioners.MaxSize(max_shard_bytes=1),
        ]:
            assert p(tf.TensorShape(shape), tf.float32)[0] == shape[0]


def test_min_variable_bytes_threshold():
    p = partitioners.Fixed(4, min_variable_bytes=4000)
    assert p(tf.TensorShape([999]), tf.float32) == [1]  # 3996 bytes
    assert p(tf.TensorShape([1000]), tf.float32) == [4]  # 4000 bytes: not smaller
    assert p(tf.TensorShape([500]), tf.float64) == [4]
    assert p(tf.TensorShape([249]), tf.string) == [1]  # 16 bytes per string
    assert p(tf.TensorShape([250]), tf.string) == [4]
    assert partitioners.Fixed(4)(tf.TensorShape([256, 256]), tf.float32) == [4, 1]
    assert partitioners.Fixed(4)(tf.TensorShape([256, 255]), tf.float32) == [1, 1]
    p = partitioners.MinSize(1, max_shards=4, bytes_per_string=1, min_variable_bytes=10)
    assert p(tf.TensorShape([9]), tf.string) == [1]
    assert p(tf.TensorShape([10]), tf.string) == [4]


@pytest.mark.parametrize(
    "partitioner",
    [
        partitioners.Fixed(4, min_variable_bytes=0),
        partitioners.MinSize(min_shard_bytes=1, max_shards=4),
        partitioners.MaxSize(max_shard_bytes=1),
        partitioners.CallablePartitioner(lambda shape, dtype: 1 / 0),
    ],
    ids=lambda p: type(p).__name__,
)
def test_never_split(partitioner):
    assert partitioner(tf.TensorShape([]), tf.float32) == []
    assert partitioner(tf.TensorShape([None, 8]), tf.float32) == [1, 1]
    assert partitioner(tf.TensorShape([8, None]), tf.float32) == [1, 1]
    assert partitioner(tf.TensorShape([0, 8]), tf.float32) == [1, 1]
    assert partitioner(tf.TensorShape([8, 0]), tf.float32) == [1, 1]
    assert partitioner(tf.TensorShape([1, 8]), tf.float32) == [1, 1]
    for shape in [[], [None, 8], [0, 8], None]:
        assert partitioners.num_shards(partitioner, shape, tf.float32) == 1


def test_zero_sized_elements_do_not_split():
    # TF's MaxSizePartitioner divides by zero for these.
    p = partitioners.MaxSize(max_shard_bytes=1)
    assert p(tf.TensorShape([8]), tf.resource) == [1]
    assert p(tf.TensorShape([8, 0]), tf.float32) == [1, 1]


def test_config_round_trip_and_repr():
    for p in [
        partitioners.Fixed(3),
        partitioners.MinSize(1024, max_shards=4, min_variable_bytes=8),
        partitioners.MaxSize(2048, bytes_per_string=8),
    ]:
        clone = type(p).from_config(p.get_config())
        assert clone.get_config() == p.get_config()
        assert repr(clone) == repr(p)
    assert repr(partitioners.MaxSize(10)) == (
        "MaxSize(max_shard_bytes=10, max_shards=None, bytes_per_string=16, "
        "min_variable_bytes=0)"
    )


def test_get():
    assert partitioners.get(None) is None
    fixed = partitioners.Fixed(2)
    assert partitioners.get(fixed) is fixed

    theirs = tf_partitioners.MaxSizePartitioner(max_shard_bytes=100)
    wrapped = partitioners.get(theirs)
    assert isinstance(wrapped, partitioners.CallablePartitioner)
    assert wrapped.fn is theirs
    shape = tf.TensorShape([100, 4])
    assert wrapped(shape, tf.float32) == theirs(shape, tf.float32) == [17, 1]
    assert partitioners.num_shards(theirs, shape, tf.float32) == 17

    def by_rows(shape, dtype):
        return 3 if shape[0] >= 30 else [1] * shape.rank

    assert partitioners.get(by_rows)(tf.TensorShape([30, 2]), tf.int64) == [3, 1]
    assert partitioners.num_shards(by_rows, [30, 2], tf.int64) == 3
    assert partitioners.num_shards(by_rows, [29, 2], tf.int64) == 1
    assert partitioners.num_shards(lambda s, d: np.int64(2), [4], "float32") == 2


@pytest.mark.parametrize(
    "partitioner",
    [
        partitioners.Fixed(3, min_variable_bytes=0),
        partitioners.MinSize(min_shard_bytes=8, max_shards=10),
        partitioners.MaxSize(max_shard_bytes=4, max_shards=2),
    ],
    ids=repr,
)
def test_config_dicts_round_trip(partitioner):
    config = partitioners.serialize(partitioner)
    assert config["class_name"] == type(partitioner).name
    rebuilt = partitioners.get(config)
    assert type(rebuilt) is type(partitioner)
    assert rebuilt.get_config() == partitioner.get_config()
    shape = tf.TensorShape([6, 1])
    assert rebuilt(shape, tf.float32) == partitioner(shape, tf.float32)
    assert partitioners.deserialize(config).get_config() == partitioner.get_config()


def test_ids_and_their_errors():
    assert partitioners.names() == ["fixed", "min_size", "max_size"]
    with pytest.raises(ValueError, match=r"needs its shard count.*'class_name'"):
        partitioners.get("fixed")
    with pytest.raises(ValueError, match="Unknown partitioner 'min_sise'.*'min_size'"):
        partitioners.get({"class_name": "min_sise", "config": {}})
    with pytest.raises(ValueError, match="num_shards.*Fixed accepts: num_shards"):
        partitioners.get({"class_name": "fixed", "config": {"num_shard": 2}})
    with pytest.raises(ValueError, match="it needs 'num_shards'"):
        partitioners.get({"class_name": "fixed"})
    with pytest.raises(ValueError, match="the class Fixed, not an instance"):
        partitioners.get(partitioners.Fixed)
    with pytest.raises(ValueError, match="CallablePartitioner is not one of"):
        partitioners.serialize(partitioners.CallablePartitioner(lambda s, d: 1))


def test_a_registered_partitioner_builds_from_its_config():
    from keras_psdist.families import PARTITIONERS

    class Halves(partitioners.Partitioner):
        def _num_shards(self, shape, dtype, axis):
            return 2

    partitioners.register("halves", Halves)
    try:
        built = partitioners.get({"class_name": "halves", "config": {}})
        assert built(tf.TensorShape([10, 3]), tf.float32) == [2, 1]
        assert partitioners.serialize(built)["class_name"] == "halves"
    finally:
        PARTITIONERS.unregister("halves")


def _np_rows(num_rows, num_shards):
    return tuple(len(a) for a in np.array_split(np.arange(num_rows), num_shards))


def test_shard_rows_matches_array_split():
    for num_rows in range(0, 40):
        for num_shards in range(1, max(num_rows, 1) + 1):
            got = partitioners.shard_rows(num_rows, num_shards)
            assert got == _np_rows(num_rows, num_shards), (num_rows, num_shards)
            assert sum(got) == num_rows
    big = partitioners.shard_rows(10**9 + 7, 3)  # no arange of 10**9 rows
    assert big == (333333336, 333333336, 333333335)
    assert partitioners.shard_rows(np.int64(10), np.int32(4)) == (3, 3, 2, 2)


@pytest.mark.parametrize(
    "make, received",
    [
        (lambda: partitioners.Fixed(0), "num_shards=0"),
        (lambda: partitioners.Fixed(-2), "num_shards=-2"),
        (lambda: partitioners.Fixed(2.0), "num_shards=2.0"),
        (lambda: partitioners.Fixed(True), "num_shards=True"),
        (lambda: partitioners.Fixed("2"), "num_shards='2'"),
        (lambda: partitioners.Fixed(2, min_variable_bytes=-1), "min_variable_bytes=-1"),
        (
            lambda: partitioners.Fixed(2, min_variable_bytes=1.5),
            "min_variable_bytes=1.5",
        ),
        (lambda: partitioners.MinSize(0), "min_shard_bytes=0"),
        (lambda: partitioners.MinSize(max_shards=0), "max_shards=0"),
        (lambda: partitioners.MinSize(max_shards=None), "max_shards=None"),
        (lambda: partitioners.MinSize(bytes_per_string=0), "bytes_per_string=0"),
        (
            lambda: partitioners.MinSize(min_variable_bytes=False),
            "min_variable_bytes=False",
        ),
        (lambda: partitioners.MaxSize(0), "max_shard_bytes=0"),
        (lambda: partitioners.MaxSize(1e6), "max_shard_bytes=1000000.0"),
        (lambda: partitioners.MaxSize(8, max_shards=0), "max_shards=0"),
        (lambda: partitioners.MaxSize(8, max_shards=-3), "max_shards=-3"),
        (lambda: partitioners.MaxSize(8, bytes_per_string=-1), "bytes_per_string=-1"),
        (lambda: partitioners.CallablePartitioner(3), "fn=3"),
        (lambda: partitioners.get(4), "4"),
        (lambda: partitioners.get("min_size"), "'min_size'"),
        (lambda: partitioners.shard_rows(-1, 1), "num_rows=-1"),
        (lambda: partitioners.shard_rows(4, 0), "num_shards=0"),
        (lambda: partitioners.shard_rows(4, 2.0), "num_shards=2.0"),
        (lambda: partitioners.shard_rows(3, 4), "num_shards=4"),
        (lambda: partitioners.shard_rows(0, 2), "num_shards=2"),
    ],
)
def test_argument_errors(make, received):
    with pytest.raises(ValueError) as info:
        make()
    assert received in str(info.value)


def test_get_error_lists_accepted_forms():
    with pytest.raises(ValueError, match="None.*Partitioner.*callable"):
        partitioners.get(object())


@pytest.mark.parametrize(
    "result, shape, received",
    [
        ("2", [10, 4], "'2'"),
        ({0: 2}, [10, 4], "{0: 2}"),
        ([2], [10, 4], "1 entries for a shape of rank 2"),
        ([2, 1, 1], [10, 4], "3 entries"),
        ([0, 1], [10, 4], "0 is not positive"),
        ([-1, 1], [10, 4], "-1 is not positive"),
        ([2.0, 1], [10, 4], "2.0 is not an int"),
        ([True, 1], [10, 4], "True is not an int"),
        ([1, 2], [10, 4], "splits axis 1"),
        ([2, 2], [10, 4], "splits axis 1"),
        ([11, 1], [10, 4], "11 shards for 10 rows"),
        (0, [10, 4], "[0, 1]"),
        (11, [10, 4], "11 shards for 10 rows"),
    ],
)
def test_num_shards_rejects_bad_results(result, shape, received):
    with pytest.raises(ValueError) as info:
        partitioners.num_shards(lambda s, d: result, shape, tf.float32)
    message = str(info.value)
    assert received in message
    assert f"shape={tf.TensorShape(shape)}" in message
    assert "one positive int per axis" in message  # how to fix it


def test_num_shards_rejects_bad_partitioner_subclass():
    class Broken(partitioners.Partitioner):
        def __call__(self, shape, dtype, axis=0):
            return [1, 3]

    with pytest.raises(ValueError, match=r"returned \[1, 3\].*splits axis 1"):
        partitioners.num_shards(Broken(), [10, 4], tf.float32)


@pytest.mark.parametrize(
    "shards, received", [(0, "Received: 0"), (2.5, "Received: 2.5"), (None, "None")]
)
def test_bad_num_shards_from_subclass(shards, received):
    class Bad(partitioners.Partitioner):
        def _num_shards(self, shape, dtype, axis):
            return shards

    with pytest.raises(ValueError, match="_num_shards must return") as info:
        Bad()(tf.TensorShape([10]), tf.float32)
    assert received in str(info.value)


def test_base_class_is_abstract():
    with pytest.raises(NotImplementedError, match="_num_shards"):
        partitioners.Partitioner()(tf.TensorShape([10]), tf.float32)


def test_call_errors():
    p = partitioners.Fixed(2, min_variable_bytes=0)
    with pytest.raises(ValueError, match=r"axis=2, shape=\(10, 4\)"):
        p(tf.TensorShape([10, 4]), tf.float32, axis=2)
    with pytest.raises(ValueError, match=r"axis=-3"):
        p(tf.TensorShape([10, 4]), tf.float32, axis=-3)
    with pytest.raises(ValueError, match=r"axis=0.0"):
        p(tf.TensorShape([10, 4]), tf.float32, axis=0.0)
    with pytest.raises(ValueError, match=r"unknown rank. Received: shape=<unknown>"):
        p(tf.TensorShape(None), tf.float32)
