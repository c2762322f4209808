"""No replica runs a kernel on an empty batch: every layer type, partial
batches of every size 1 ... n - 1 (contract family; the cluster paths are in
tests/test_cluster_training.py).

TensorFlow 2.21's oneDNN `MaxPoolGrad` aborts the process on an empty batch
(tensorflow/tensorflow#126128): before stand-ins, this file aborted its pytest
worker. The results stay a single device's: weights for the deterministic
layers, metric counts and predictions for all.
"""

import keras
import layer_zoo  # tests/cluster_jobs, see conftest.py
import numpy as np
import pytest
import tensorflow as tf

import keras_psdist as kpd

# Three replicas: a partial batch leaves one replica empty (size 2) or
# several (size 1), and the layer zoo traces in three quarters of 4's time.
NUM_REPLICAS = 3


def _pair(cpu_devices, stochastic, num_replicas=NUM_REPLICAS):
    reference = layer_zoo.build(stochastic=stochastic)
    strategy = kpd.PSStrategy(devices=cpu_devices[:num_replicas])
    with strategy.scope():
        model = layer_zoo.build(stochastic=stochastic)
    model.set_weights(reference.get_weights())
    return reference, model, strategy


@pytest.mark.parametrize("num_replicas", [2, 3, 4])
def test_split_sizes_never_leave_a_replica_empty(cpu_devices, num_replicas):
    strategy = kpd.PSStrategy(devices=cpu_devices[:num_replicas])
    dataset = layer_zoo.partial_batches(num_replicas)
    for batch, (_, global_labels) in zip(
        strategy.experimental_distribute_dataset(dataset), dataset, strict=True
    ):
        labels = strategy.experimental_local_results(batch[1])
        counts = [int(t.shape[0]) for t in labels]
        # Consecutive rows, in replica order: each example exactly once.
        np.testing.assert_array_equal(np.concatenate(labels), global_labels)
        assert max(counts) - min(counts) <= 1, counts
        assert counts == sorted(counts, reverse=True), counts


def test_every_layer_type_trains_on_partial_batches(cpu_devices):
    reference, model, _ = _pair(cpu_devices, stochastic=True)
    dataset = layer_zoo.partial_batches(NUM_REPLICAS)
    history = model.fit(dataset, epochs=2, verbose=0)
    for weight in model.weights:
        assert np.isfinite(weight.numpy()).all(), weight.path
    # Every example counted once per epoch: stand-ins never count.
    total = sum(layer_zoo.batch_sizes(NUM_REPLICAS))
    assert history.history["examples"] == [total, total]

    # Evaluate and predict with the trained weights equal a single device's.
    reference.set_weights(model.get_weights())
    for batches in (dataset, dataset.rebatch(1)):
        np.testing.assert_allclose(
            model.evaluate(batches, verbose=0),
            reference.evaluate(batches, verbose=0),
            rtol=1e-5,
        )
        predicted = model.predict(batches, verbose=0)
        assert predicted.shape == (total, layer_zoo.CLASSES)
        np.testing.assert_allclose(
            predicted, reference.predict(batches, verbose=0), rtol=1e-4, atol=1e-5
        )


def test_partial_batches_and_one_example_give_single_device_weights(cpu_devices):
    # One model pair for both (a 3-replica trace of the layer zoo is most of
    # each fit's time): partial batches of every size, then a global batch
    # of one, where every replica but the first runs on a stand-in.
    reference, model, _ = _pair(cpu_devices, stochastic=False)
    dataset = layer_zoo.partial_batches(NUM_REPLICAS)
    features, labels = layer_zoo.data(1)
    for m in (reference, model):
        m.fit(dataset, epochs=2, verbose=0)
    _assert_same_weights(reference, model)
    for m in (reference, model):
        m.fit(features, labels, batch_size=1, epochs=1, verbose=0)
        assert m.predict(features, verbose=0).shape == (1, layer_zoo.CLASSES)
    _assert_same_weights(reference, model)


def _assert_same_weights(reference, model):
    for expected, actual in zip(
        reference.get_weights(), model.get_weights(), strict=True
    ):
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)


def test_custom_loop_outputs_have_one_row_per_example(cpu_devices):
    strategy = kpd.PSStrategy(devices=cpu_devices[:NUM_REPLICAS])
    dataset = tf.data.Dataset.from_tensor_slices(tf.range(3.0)[:, None]).batch(3)

    @tf.function
    def step(x):
        return strategy.run(lambda x: x * 2.0, args=(x,))

    for x in strategy.experimental_distribute_dataset(dataset):
        out = strategy.gather(step(x), axis=0)
        np.testing.assert_array_equal(out.numpy()[:, 0], [0.0, 2.0, 4.0])


def test_datasets_from_function_fill_replicas_left_without_data(cpu_devices):
    # 5 per-replica batches of 2 on 3 replicas: the second step has data for
    # two replicas only, and TensorFlow's iterator hands the third an empty one.
    strategy = kpd.PSStrategy(devices=cpu_devices[:NUM_REPLICAS])
    features, labels = layer_zoo.data(10)
    with strategy.scope():
        model = layer_zoo.build(stochastic=True)

    def dataset_fn(context):
        return tf.data.Dataset.from_tensor_slices((features, labels)).batch(2)

    history = model.fit(
        strategy.distribute_datasets_from_function(dataset_fn), epochs=1, verbose=0
    )
    assert history.history["examples"] == [10]
    for weight in model.weights:
        assert np.isfinite(weight.numpy()).all(), weight.path


@pytest.mark.parametrize("kind", ["ragged", "sparse"])
def test_replicas_without_data_get_a_stand_in_of_ragged_and_sparse_batches(
    cpu_devices, kind
):
    # A global batch of 1 on 3 replicas: replicas 1 and 2 have no rows. Each
    # runs on a stand-in (the first example), and the outputs of its row are
    # cut, so the gathered result is the one example's, once; its other
    # outputs (a row count here) are what an empty batch gives: 0.
    strategy = kpd.PSStrategy(devices=cpu_devices[:NUM_REPLICAS])
    rows = tf.ragged.constant([[1.0, 2.0], [3.0]])
    element = rows if kind == "ragged" else rows.to_sparse()
    dataset = tf.data.Dataset.from_tensor_slices(element).batch(1)

    def per_replica(x):
        dense = x.to_tensor() if kind == "ragged" else tf.sparse.to_dense(x)
        return tf.reduce_sum(dense, axis=1), tf.shape(dense)[0]

    @tf.function
    def step(x):
        return strategy.run(per_replica, args=(x,))

    for x, expected in zip(
        strategy.experimental_distribute_dataset(dataset), [3.0, 3.0], strict=True
    ):
        sums, sizes = step(x)
        assert strategy.gather(sums, axis=0).numpy().tolist() == [expected]
        assert [int(s) for s in strategy.experimental_local_results(sizes)] == [1, 0, 0]


def test_equal_sizes_known_when_tracing_build_no_shares():
    """Batches whose sizes every replica's static shape gives, all equal
    (`drop_remainder=True` with a batch the replicas divide), have equal
    shares: the step builds no masking of replicas without data and no
    weighing. Unequal or unknown sizes keep theirs."""
    from keras_psdist._tf import values
    from keras_psdist.distribute.replica_batches import ReplicaBatches

    def shares(*shapes):
        specs = [tf.TensorSpec(shape, tf.float32) for shape in shapes]

        @tf.function(autograph=False)
        def read(*pieces):
            batches = ReplicaBatches((values.PerReplica(pieces),), {}, len(pieces))
            found.append((batches.shares, batches.without_data))

        found = []
        read.get_concrete_function(*specs)
        return found[0]

    assert shares([4, 2], [4, 2], [4, 2]) == (None, None)
    for shapes in ([[4, 2], [3, 2], [3, 2]], [[None, 2], [None, 2]], [[0], [0]]):
        found, without_data = shares(*shapes)
        assert len(found) == len(shapes) and len(without_data) == len(shapes)


@pytest.mark.parametrize("rule", ["mean", "median"])
def test_static_and_unknown_batch_sizes_train_the_same_weights(cpu_devices, rule):
    """The same batches, once with their size known when tracing and once
    not: the weights agree exactly (the shares-free step is the one the
    runtime conditions took)."""
    x = np.random.default_rng(0).normal(size=(96, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    results = []
    for drop_remainder in (True, False):
        strategy = kpd.PSStrategy(
            devices=cpu_devices[:4],
            aggregator=rule,
            num_byzantine=0 if rule == "mean" else 1,
        )
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
            model.compile(
                optimizer="sgd",
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(
            16, drop_remainder=drop_remainder
        )
        assert (dataset.element_spec[0].shape[0] is None) is not drop_remainder
        model.fit(dataset, epochs=2, verbose=0)
        results.append(model.get_weights())
    for static, unknown in zip(*results, strict=True):
        np.testing.assert_array_equal(static, unknown)
