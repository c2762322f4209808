"""Partitioned variables: row shards on parameter devices, in one process.

Each strategy test compares a partitioned run with the same run
unpartitioned (same initial weights, same data): splitting a variable must
change where rows live, never the numbers. Multiprocess runs (shards on
several ps tasks) are in `test_cluster_training.py` and
`test_sync_replicas.py`.
"""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_psdist as kpd
from keras_psdist import aggregators, attacks, partitioners
from keras_psdist.variables.partitioned import PartitionedVariable
from keras_psdist.variables.shard_layout import ShardLayout

VOCAB, DIM, SEQ = 300, 8, 5
NUM_REPLICAS = 2


# ------------------------------------------------------------- the layout


@pytest.mark.parametrize("rows", [(3, 2), (1, 1, 1), (5,), (4, 4, 3, 1)])
def test_split_and_join_are_inverse(rows):
    layout = ShardLayout(rows)
    n = sum(rows)
    dense = tf.reshape(tf.range(n * 3, dtype=tf.float32), [n, 3])
    parts = layout.split(dense)
    assert [int(p.shape[0]) for p in parts] == list(rows)
    np.testing.assert_array_equal(layout.join(parts, dense.shape, tf.float32), dense)

    ids = tf.constant([n - 1, 0, n - 1, n // 2], tf.int64)
    values = tf.random.stateless_normal([4, 3], seed=[1, 2])
    sparse = tf.IndexedSlices(values, ids, tf.constant([n, 3], tf.int64))
    pieces = layout.split(sparse)
    for piece, count, offset in zip(pieces, rows, layout.offsets, strict=True):
        # Each shard gets only its rows, with shard-local indices.
        assert np.all((piece.indices.numpy() >= 0) & (piece.indices.numpy() < count))
        assert np.all(np.isin(piece.indices.numpy() + offset, ids.numpy()))
        np.testing.assert_array_equal(piece.dense_shape, [count, 3])
    joined = layout.join(pieces, dense.shape, tf.float32)
    assert isinstance(joined, tf.IndexedSlices)
    np.testing.assert_allclose(
        tf.convert_to_tensor(joined), tf.convert_to_tensor(sparse), atol=1e-6
    )
    assert layout.join([None] * len(rows), dense.shape, tf.float32) is None


def test_shard_of_matches_numpy():
    layout = ShardLayout((4, 3, 3))
    ids = np.arange(10)
    shard, local = layout.shard_of(tf.constant(ids, tf.int64))
    expected_shard = np.searchsorted([4, 7], ids, side="right")
    np.testing.assert_array_equal(shard, expected_shard)
    np.testing.assert_array_equal(local, ids - np.array([0, 4, 7])[expected_shard])


# ----------------------------------------------------------- the strategy


def strategy(cpu_devices, partitioner=None, **kwargs):
    """2 replicas on CPUs 0-1; variables on CPUs 2-4."""
    return kpd.PSStrategy(
        devices=cpu_devices[:NUM_REPLICAS],
        parameter_devices=cpu_devices[2:5],
        partitioner=partitioner,
        **kwargs,
    )


def split_in_three():
    """Splits the table (9.6 KB) and the first kernel (10 KB), not the rest."""
    return kpd.partitioners.Fixed(3, min_variable_bytes=2000)


def build_model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((SEQ,), dtype="int32"),
            keras.layers.Embedding(VOCAB, DIM),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(4),
        ]
    )


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = rng.integers(0, VOCAB, size=(192, SEQ)).astype(np.int32)
    y = (x.sum(axis=1) % 4).astype(np.int32)
    return x, y


def compiled(strategy, make_optimizer, initial=None):
    with strategy.scope():
        model = build_model()
        if initial is not None:
            model.set_weights(initial)
        model.compile(
            optimizer=make_optimizer(),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    return model


def fit(model, data, epochs=2):
    x, y = data
    model.fit(x, y, batch_size=64, epochs=epochs, shuffle=False, verbose=0)
    return [np.asarray(w) for w in model.get_weights()]


def assert_same_weights(actual, expected, atol=1e-6):
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=atol, err_msg=f"weight {i}")


@pytest.mark.parametrize("partitioned", [False, True], ids=["whole", "partitioned"])
def test_every_row_lookup_matches_numpy(cpu_devices, partitioned):
    s = strategy(cpu_devices, split_in_three() if partitioned else None)
    with s.scope():
        layer = keras.layers.Embedding(VOCAB, DIM)
        layer.build((None,))
    table = layer.embeddings
    expected = table.numpy()
    ids = np.array([[VOCAB - 1, 0, 0], [150, 99, 100]], np.int32)
    lookups = {
        "layer": lambda i: layer(i),
        "ops.take": lambda i: keras.ops.take(table, i, axis=0),
        "tf.gather": lambda i: tf.gather(table.value, i),
        "embedding_lookup": lambda i: tf.nn.embedding_lookup(table.value, i),
    }
    # d(sum of looked-up rows)/d(table): how often each row was looked up.
    counts = np.zeros((VOCAB, DIM), np.float32)
    np.add.at(counts, ids.ravel(), 1.0)
    for name, lookup in lookups.items():
        np.testing.assert_array_equal(lookup(ids), expected[ids], err_msg=name)
        graph_lookup = tf.function(lookup)
        np.testing.assert_array_equal(graph_lookup(ids), expected[ids], err_msg=name)
        with tf.GradientTape() as tape:
            total = tf.reduce_sum(lookup(ids))
        gradient = tape.gradient(total, table)
        assert isinstance(gradient, tf.IndexedSlices), name
        np.testing.assert_array_equal(tf.convert_to_tensor(gradient), counts)
    positions = np.array([[r, c] for r in range(ids.shape[0]) for c in range(3)])
    sparse_ids = tf.SparseTensor(positions, ids.ravel().astype(np.int64), ids.shape)
    np.testing.assert_allclose(
        tf.nn.safe_embedding_lookup_sparse(table.value, sparse_ids),
        expected[ids].mean(axis=1),
        rtol=1e-6,
    )
    # Negative ids count from the end, as in Keras's own `take`.
    negative = -ids - 1
    np.testing.assert_array_equal(
        keras.ops.take(table, negative, axis=0), expected[negative % VOCAB]
    )
    ragged = tf.ragged.constant([[1, 2, 299], [], [7]])
    out = layer(ragged)
    assert isinstance(out, tf.RaggedTensor)
    np.testing.assert_array_equal(out.flat_values, expected[[1, 2, 299, 7]])
    empty = layer(np.zeros((0, SEQ), np.int32))
    assert tuple(empty.shape) == (0, SEQ, DIM)


def test_large_variables_are_split_and_placed_by_bytes(cpu_devices, data):
    s = strategy(
        cpu_devices,
        kpd.partitioners.MinSize(min_shard_bytes=3000, max_shards=3),
    )
    model = compiled(s, lambda: keras.optimizers.Adam(0.01))
    fit(model, data, epochs=1)
    placement = s.extended.placement
    table = model.layers[0].embeddings
    assert isinstance(table.value, PartitionedVariable)
    shards = placement.shards_of(table.path)
    # 9600 bytes over min_shard_bytes=3000 -> ceil = 4, capped at 3 shards.
    assert [r.shape for r in shards] == [(100, DIM), (100, DIM), (100, DIM)]
    assert len({r.device for r in shards}) == 3
    assert [r.shard.first_row for r in shards] == [0, 100, 200]
    # The 40x64 kernel (10 KB) is split too; the 64x4 one (1 KB) and biases
    # are not.
    assert isinstance(model.layers[2].kernel.value, PartitionedVariable)
    assert not isinstance(model.layers[3].kernel.value, PartitionedVariable)
    assert not isinstance(model.layers[2].bias.value, PartitionedVariable)
    with pytest.raises(KeyError, match="partitioned into 3 shards.*shards_of"):
        placement.device_of(table.path)
    report = str(placement)
    assert f"{table.path}/part_2" in report and "shard 3/3, rows 200..299" in report
    # Greedy by bytes: the three devices hold about the same.
    loads = placement.bytes_per_device().values()
    assert max(loads) - min(loads) <= max(r.bytes for r in placement.variables)
    # Adam's slots are split like their variable, each shard beside its own.
    optimizer = model.optimizer
    index = optimizer._get_variable_index(table)
    for slots in (optimizer._momentums, optimizer._velocities):
        slot = slots[index].value
        assert isinstance(slot, PartitionedVariable)
        assert slot.layout is table.value.layout
        for slot_shard, shard in zip(slot.shards, table.value.shards, strict=True):
            assert slot_shard.device == shard.device


OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.5),
    "sgd_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.01),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1),
    "ftrl": lambda: keras.optimizers.Ftrl(0.1),
    # Not row-separable: updated whole, on the first shard's device.
    "lamb": lambda: keras.optimizers.Lamb(0.01),
    "adafactor": lambda: keras.optimizers.Adafactor(0.05),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_training_equals_the_unpartitioned_run(cpu_devices, data, name):
    initial = [w.numpy() for w in build_model().weights]
    expected = fit(compiled(strategy(cpu_devices), OPTIMIZERS[name], initial), data)
    model = compiled(strategy(cpu_devices, split_in_three()), OPTIMIZERS[name], initial)
    assert isinstance(model.layers[0].embeddings.value, PartitionedVariable)
    actual = fit(model, data)
    assert_same_weights(actual, expected)
    assert any(not np.allclose(a, b) for a, b in zip(actual, initial, strict=True))


def test_an_update_that_is_not_row_separable_runs_whole_and_says_so(
    cpu_devices, data, caplog
):
    class NormalizedSGD(keras.optimizers.SGD):
        """Scales each variable's step by its gradient's whole norm: per
        shard, the norms would differ."""

        def update_step(self, gradient, variable, learning_rate):
            gradient = tf.convert_to_tensor(gradient)
            norm = tf.norm(gradient) + 1e-6
            variable.assign_sub(learning_rate * gradient / norm)

    initial = [w.numpy() for w in build_model().weights]
    make = lambda: NormalizedSGD(0.1)  # noqa: E731
    expected = fit(compiled(strategy(cpu_devices), make, initial), data)
    with caplog.at_level(logging.WARNING):
        actual = fit(
            compiled(strategy(cpu_devices, split_in_three()), make, initial), data
        )
    assert_same_weights(actual, expected)
    assert "NormalizedSGD's update is not row-separable" in caplog.text
    assert not partitioners.is_row_separable(NormalizedSGD())
    assert partitioners.is_row_separable(
        type("Scheduled", (keras.optimizers.Adam,), {})()
    )


def test_a_class_registered_before_any_question_keeps_keras_optimizers_in(
    monkeypatch,
):
    # As in a fresh process whose first call is the user's registration.
    monkeypatch.setattr(partitioners, "_row_separable_updates", set())
    monkeypatch.setattr(partitioners, "_builtins_registered", False)

    @partitioners.register_row_separable
    class SignSGD(keras.optimizers.Optimizer):
        def update_step(self, gradient, variable, learning_rate):
            variable.assign_sub(learning_rate * keras.ops.sign(gradient))

    assert partitioners.is_row_separable(SignSGD(learning_rate=0.1))
    assert partitioners.is_row_separable(keras.optimizers.Adam())


def test_register_row_separable_refuses_what_is_not_an_optimizer_class():
    with pytest.raises(ValueError, match="Optimizer subclass. Received: 3"):
        partitioners.register_row_separable(3)
    with pytest.raises(ValueError, match="Received: <keras.src.optimizers"):
        partitioners.register_row_separable(keras.optimizers.SGD())


def test_sparse_updates_reach_only_the_shards_that_own_the_rows(cpu_devices):
    s = strategy(cpu_devices, split_in_three())
    model = compiled(s, lambda: keras.optimizers.SGD(0.5))
    shards = model.layers[0].embeddings.value.shards
    before = [shard.numpy() for shard in shards]
    # Every id falls in shard 1's rows (100..199).
    x = np.random.default_rng(1).integers(100, 200, size=(64, SEQ)).astype(np.int32)
    model.fit(x, np.zeros(64, np.int32), batch_size=64, epochs=1, verbose=0)
    after = [shard.numpy() for shard in shards]
    np.testing.assert_array_equal(after[0], before[0])
    np.testing.assert_array_equal(after[2], before[2])
    assert not np.allclose(after[1], before[1])
    touched = np.unique(x) - 100
    untouched = np.setdiff1d(np.arange(100), touched)
    np.testing.assert_array_equal(after[1][untouched], before[1][untouched])


def _readers_of(graph, variables):
    """Op types in `graph` that take one of `variables`' handles as input."""
    handles = {id(v.handle) for v in variables}
    placeholders = {
        internal.ref()
        for external, internal in graph.captures
        if id(external) in handles
    }
    return {
        op.type
        for op in graph.get_operations()
        if any(t.ref() in placeholders for t in op.inputs)
    }


@pytest.mark.parametrize("partitioned", [False, True], ids=["whole", "partitioned"])
def test_a_training_step_reads_only_the_touched_rows(cpu_devices, partitioned):
    """With plain SGD, the step touches the table only through row gathers
    and row scatters: the whole table is never read, wherever it lives."""
    s = strategy(cpu_devices, split_in_three() if partitioned else None)
    model = compiled(s, lambda: keras.optimizers.SGD(0.1))
    model.optimizer.build(model.trainable_variables)
    table = model.layers[0].embeddings.value
    stored = table.shards if partitioned else [table.get()]
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x, y):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            model.optimizer.apply(grads, model.trainable_variables)

        s.run(replica_step, args=(x, y))

    graph = step.get_concrete_function(
        tf.TensorSpec([64, SEQ], tf.int32), tf.TensorSpec([64], tf.int32)
    ).graph
    assert _readers_of(graph, stored) == {"ResourceGather", "ResourceScatterSub"}


@pytest.mark.parametrize(
    "aggregator, num_byzantine",
    [("median", 1), (aggregators.Krum(), 1), ("centered_clipping", 1)],
    ids=["median", "krum", "centered_clipping"],
)
def test_robust_rules_see_the_whole_gradient(
    cpu_devices, data, aggregator, num_byzantine
):
    """A rule aggregates the logical gradient, so splitting changes nothing:
    coordinate-wise rules are coordinate-wise either way, and whole-vector
    rules measure distances over every shard of every variable."""

    def make(partitioner):
        return kpd.PSStrategy(
            devices=cpu_devices[:5],
            parameter_devices=cpu_devices[5:8],
            partitioner=partitioner,
            aggregator=aggregator,
            num_byzantine=num_byzantine,
            attack=attacks.SignFlip(replicas=[4], scale=5.0),
        )

    initial = [w.numpy() for w in build_model().weights]
    sgd = lambda: keras.optimizers.SGD(0.2)  # noqa: E731
    expected = fit(compiled(make(None), sgd, initial), data, epochs=1)
    actual = fit(compiled(make(split_in_three()), sgd, initial), data, epochs=1)
    assert_same_weights(actual, expected, atol=2e-6)


# ------------------------------------------------------------ checkpoints


@pytest.mark.parametrize(
    "saved, restored",
    [(3, 2), (3, None), (None, 3), (2, 3)],
    ids=["3to2", "3to_whole", "whole_to3", "2to3"],
)
def test_checkpoints_restore_into_another_shard_count(
    cpu_devices, data, tmp_path, saved, restored
):
    def make(shards):
        partitioner = None if shards is None else kpd.partitioners.Fixed(shards, 2000)
        return strategy(cpu_devices, partitioner)

    trained = compiled(make(saved), lambda: keras.optimizers.Adam(0.01))
    fit(trained, data, epochs=1)
    weights = [np.asarray(w) for w in trained.get_weights()]
    slots = [np.asarray(v) for v in trained.optimizer.variables]

    # Keras weights files (ModelCheckpoint, BackupAndRestore write these).
    trained.save_weights(tmp_path / "w.weights.h5")
    s = make(restored)
    model = compiled(s, lambda: keras.optimizers.Adam(0.01))
    model.load_weights(tmp_path / "w.weights.h5")
    assert_same_weights(model.get_weights(), weights, atol=0)

    # TF checkpoints, optimizer slots included.
    path = tf.train.Checkpoint(model=trained, optimizer=trained.optimizer).save(
        str(tmp_path / "ckpt")
    )
    s = make(restored)
    model = compiled(s, lambda: keras.optimizers.Adam(0.01))
    with s.scope():
        model.optimizer.build(model.trainable_variables)
    tf.train.Checkpoint(model=model, optimizer=model.optimizer).restore(
        path
    ).assert_existing_objects_matched()
    assert_same_weights(model.get_weights(), weights, atol=0)
    assert_same_weights(
        [np.asarray(v) for v in model.optimizer.variables], slots, atol=0
    )
    # Training goes on from there.
    fit(model, data, epochs=1)


def test_a_saved_model_holds_whole_variables(cpu_devices, data, tmp_path):
    model = compiled(strategy(cpu_devices, split_in_three()), keras.optimizers.Adam)
    fit(model, data, epochs=1)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    table = loaded.layers[0].embeddings
    assert not isinstance(table.value, PartitionedVariable)
    assert tuple(table.shape) == (VOCAB, DIM)
    assert_same_weights(loaded.get_weights(), model.get_weights(), atol=0)
    x, _ = data
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6
    )


def test_saved_model_export_is_refused_with_the_fix(cpu_devices, tmp_path):
    model = compiled(strategy(cpu_devices, split_in_three()), keras.optimizers.SGD)
    with pytest.raises(NotImplementedError, match=r"model.save\('model.keras'\)"):
        tf.saved_model.save(model, str(tmp_path / "saved"))


# -------------------------------------------------------------- bad input


def test_a_row_out_of_range_names_the_table(cpu_devices):
    model = compiled(strategy(cpu_devices, split_in_three()), keras.optimizers.SGD)
    bad = np.full((2, SEQ), VOCAB, np.int32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="row index out of range"):
        model.predict(bad, verbose=0)


def test_an_invalid_partition_names_the_variable(cpu_devices):
    s = strategy(cpu_devices, lambda shape, dtype: [1] * (len(shape) - 1) + [2])
    with pytest.raises(ValueError, match=r"While partitioning variable '.*embeddings'"):
        compiled(s, keras.optimizers.SGD)


def test_assigning_the_wrong_shape_says_both_shapes(cpu_devices):
    model = compiled(strategy(cpu_devices, split_in_three()), keras.optimizers.SGD)
    table = model.layers[0].embeddings.value
    with pytest.raises(ValueError, match=r"shape \(3, 8\).*shape \(300, 8\)"):
        table.assign(tf.zeros([3, DIM]))


def test_partitioner_is_checked_when_the_strategy_is_built():
    with pytest.raises(ValueError, match="Unknown partitioner 'fixd'.*'fixed'"):
        kpd.PSStrategy(partitioner="fixd")
    # A known id alone is refused too: a partitioner needs its sizes.
    with pytest.raises(ValueError, match="needs its shard count.*Received: 'fixed'"):
        kpd.PSStrategy(partitioner="fixed")
    with pytest.raises(ValueError, match="Fixed accepts: num_shards"):
        kpd.PSStrategy(partitioner={"class_name": "fixed", "config": {"shards": 3}})


def test_partitioner_from_its_config_dict(cpu_devices):
    config = {
        "class_name": "fixed",
        "config": {"num_shards": 3, "min_variable_bytes": 2000},
    }
    model = compiled(strategy(cpu_devices, config), keras.optimizers.SGD)
    assert model.distribute_strategy.extended.partitioner.get_config() == (
        split_in_three().get_config()
    )
    table = model.layers[0].embeddings.path
    shards = model.distribute_strategy.extended.placement.shards_of(table)
    assert [s.shard.num_shards for s in shards] == [3, 3, 3]
