"""The usual Keras mistakes under a keras_psdist strategy: each gets an error
that names the fix, never a raw TensorFlow error or a silently wrong run."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_psdist as kpd

NUM_REPLICAS = 4


@pytest.fixture
def strategy(cpu_devices):
    return kpd.PSStrategy(devices=cpu_devices[:NUM_REPLICAS])


def _build():
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])


def _data():
    rng = np.random.default_rng(0)
    return rng.random((64, 8), np.float32), rng.integers(0, 3, 64)


def test_optimizer_created_outside_the_scope(strategy):
    """Before: `iterations` advanced once per replica (16 after 4 steps)."""
    optimizer = keras.optimizers.SGD(0.1)
    with strategy.scope():
        model = _build()
        with pytest.raises(ValueError) as e:
            model.compile(optimizer, "sparse_categorical_crossentropy")
    message = str(e.value)
    assert "optimizer SGD was created outside `strategy.scope()`" in message
    assert "once per replica (4 per step)" in message
    assert "keras.optimizers.SGD(...)" in message


def test_a_loss_scale_optimizer_around_an_outside_optimizer(strategy):
    inner = keras.optimizers.Adam()
    with strategy.scope():
        model = _build()
        wrapped = keras.optimizers.LossScaleOptimizer(inner)
        with pytest.raises(ValueError, match="optimizer Adam was created outside"):
            model.compile(wrapped, "sparse_categorical_crossentropy")


def test_compile_outside_the_scope(strategy):
    with strategy.scope():
        model = _build()
    with pytest.raises(ValueError, match=r"model.compile\(\) was called outside"):
        model.compile("sgd", "sparse_categorical_crossentropy", metrics=["accuracy"])


def test_model_created_outside_the_scope(strategy):
    model = _build()
    with strategy.scope():
        with pytest.raises(ValueError, match="created outside `strategy.scope"):
            model.compile("sgd", "sparse_categorical_crossentropy")


def test_the_right_set_up_compiles_and_counts_steps_once(strategy):
    x, y = _data()
    with strategy.scope():
        model = _build()
        optimizer = keras.optimizers.SGD(0.1)
        model.compile(optimizer, "sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert int(optimizer.iterations.numpy()) == 4
    assert model.jit_compile is False


def test_models_of_other_strategies_are_left_alone(cpu_devices):
    # No strategy at all, and an optimizer made anywhere: Keras's business.
    optimizer = keras.optimizers.SGD(0.1)
    model = _build()
    model.compile(optimizer, "mse", jit_compile=True)


def test_unbatched_dataset_names_the_fix(strategy):
    x, y = _data()
    with strategy.scope():
        model = _build()
        model.compile("sgd", "sparse_categorical_crossentropy")
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    with pytest.raises(ValueError, match=r"dataset.batch\(global_batch_size\)"):
        model.fit(dataset, epochs=1, verbose=0)


def test_run_gives_one_value_per_replica_as_mirrored_does(strategy):
    with strategy.scope():
        layer = keras.layers.Dense(2)
        layer.build((None, 3))
    result = strategy.run(lambda: layer.kernel.value)
    assert len(result.values) == NUM_REPLICAS
    local = strategy.experimental_local_results(result)
    assert len(local) == NUM_REPLICAS
    for value in local:
        np.testing.assert_array_equal(np.asarray(value), layer.kernel.numpy())
    ids = strategy.experimental_local_results(
        strategy.run(
            lambda: tf.distribute.get_replica_context().replica_id_in_sync_group
        )
    )
    assert [int(i) for i in ids] == list(range(NUM_REPLICAS))


def test_run_inside_a_function_gives_one_value_per_replica(strategy):
    with strategy.scope():
        variable = tf.Variable(3.0)

    @tf.function
    def step():
        return strategy.experimental_local_results(
            strategy.run(lambda: variable.read_value())
        )

    assert [float(v) for v in step()] == [3.0] * NUM_REPLICAS


def test_splitting_the_cpu_after_tensorflow_initialised_names_both_counts():
    from keras_psdist.devices import split_host_cpu

    count = len(tf.config.list_logical_devices("CPU"))
    assert len(split_host_cpu(count)) == count  # The same split: names only.
    with pytest.raises(RuntimeError, match=rf"into {count + 1} .* with {count}\."):
        split_host_cpu(count + 1)
    with pytest.raises(ValueError, match="count=0"):
        split_host_cpu(0)


@pytest.mark.parametrize(
    "said, expected",
    [
        (
            "/job:localhost/replica:0/task:0/device:CPU:0 unknown device.",
            "built before the strategy connected to the cluster",
        ),
        ("Cannot serialize py_function", "built on Python code"),
    ],
)
def test_in_graph_dataset_that_cannot_reach_the_workers_says_why(
    monkeypatch, said, expected
):
    """A dataset made before `PSStrategy(mode="in-graph")` connected lives on
    `/job:localhost`, which the cluster does not know: the error says to build
    the strategy first, not that the pipeline is Python code."""
    from types import SimpleNamespace

    import tensorflow as tf

    from keras_psdist.distribute.input import pipelines

    def replicate(dataset, hosts):
        raise tf.errors.NotFoundError(None, None, said)

    monkeypatch.setattr(pipelines.data_distribute, "replicate", replicate)
    inputs = pipelines.InputPipelines.__new__(pipelines.InputPipelines)
    inputs._topology = SimpleNamespace(
        input_workers=[("/job:worker/task:0", ()), ("/job:worker/task:1", ())]
    )
    with pytest.raises(ValueError, match=expected):
        inputs._clone_to_workers(tf.data.Dataset.range(4))
