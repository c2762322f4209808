"""The usual Keras mistakes under a keras_psdist strategy: each gets an error
that names the fix, never a raw TensorFlow error or a silently wrong run."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_psdist as kpd
from tests.shared_mirrored import mirrored_strategy

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


def test_model_made_outside_and_fit_inside_the_scope_names_the_fix(strategy):
    """Before: TensorFlow's "Mixing different tf.distribute.Strategy
    objects", or an error from the first update, after tracing."""
    x, y = _data()
    model = _build()
    model.compile("sgd", "sparse_categorical_crossentropy")
    with strategy.scope():
        with pytest.raises(ValueError) as e:
            model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    message = str(e.value)
    assert "created and compiled outside `strategy.scope()` of PSStrategy" in message
    assert "`fit` is called inside it" in message
    assert "with strategy.scope():\n        model = build_model()" in message
    assert "model.compile(...)" in message
    # Evaluating it there is correct (no update): Keras's business.
    with strategy.scope():
        inside = model.evaluate(x, y, batch_size=16, verbose=0)
    assert inside == pytest.approx(model.evaluate(x, y, batch_size=16, verbose=0))


@pytest.mark.parametrize("method", ["fit", "evaluate", "predict"])
def test_model_of_one_strategy_run_in_another_ones_scope_names_both(
    strategy, cpu_devices, method
):
    """Before: "Mixing different tf.distribute.Strategy objects: PSStrategy(
    devices=[...]) is not PSStrategy(devices=[...])", alike to the letter."""
    x, y = _data()
    with strategy.scope():
        model = _build()
        model.compile("sgd", "sparse_categorical_crossentropy")
    other = kpd.PSStrategy(devices=cpu_devices[:NUM_REPLICAS])
    call = getattr(model, method)
    args = (x,) if method == "predict" else (x, y)
    with other.scope():
        with pytest.raises(ValueError) as e:
            call(*args, batch_size=16, verbose=0)
    message = str(e.value)
    assert (
        f"created under the scope of one PSStrategy, and `{method}` is called "
        "inside the scope of another PSStrategy (a different object)"
    ) in message
    assert f"Call {method} outside the `with strategy.scope():` block" in message
    assert "create and compile the model inside that scope" in message
    # Outside any scope it runs under its own strategy.
    call(*args, batch_size=16, verbose=0)


def test_mirrored_strategy_models_are_left_alone_and_not_mixed_in(
    strategy, cpu_devices
):
    x, y = _data()
    mirrored = mirrored_strategy(tuple(cpu_devices[:2]))
    with mirrored.scope():
        model = _build()
        model.compile("sgd", "sparse_categorical_crossentropy")
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    with strategy.scope():
        with pytest.raises(ValueError, match="scope of MirroredStrategy, and `fit`"):
            model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    with strategy.scope():
        ours = _build()
        ours.compile("sgd", "sparse_categorical_crossentropy")
    with mirrored.scope():
        with pytest.raises(
            ValueError, match="scope of PSStrategy, and `fit` .* of MirroredStrategy:"
        ):
            ours.fit(x, y, batch_size=16, epochs=1, verbose=0)


def test_a_model_of_no_strategy_fits_outside_any_scope(strategy):
    x, y = _data()
    model = _build()
    model.compile("sgd", "sparse_categorical_crossentropy")
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2
    assert model.distribute_strategy is tf.distribute.get_strategy()


def test_placement_of_a_strategy_whose_scope_was_never_entered_says_so(strategy):
    """Before: an empty table (a header and 0 bytes per device)."""
    x, y = _data()
    model = _build()
    model.compile("sgd", "sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    placement = strategy.extended.placement
    for shown in (str(placement), repr(placement)):
        assert shown.startswith(
            "No variable has been created under this strategy's scope"
        )
        assert "/device:CPU:0" in shown  # The parameter devices.
        assert "with strategy.scope():" in shown
        assert "model.compile(...)" in shown
    with strategy.scope():
        _build()
    assert str(placement).startswith("variable ")
    assert repr(placement) == str(placement)


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


def test_one_in_graph_worker_runs_the_pipeline_it_can_be_sent_else_the_callers():
    """In-graph with one worker task, the pipeline runs on the worker (each
    step's batch is read there), as with several; one built on Python code
    cannot be sent, and stays with the caller (the chief) as before, rather
    than being refused: one worker never needed it sent."""
    from types import SimpleNamespace

    import tensorflow as tf

    from keras_psdist.distribute.input import pipelines

    worker = "/job:worker/replica:0/task:0/device:CPU:0"
    topology = SimpleNamespace(
        between_graph=False,
        num_training_processes=1,
        input_workers=((worker, (worker,)),),
        client_device="/job:chief/replica:0/task:0/device:CPU:0",
    )
    inputs = pipelines.InputPipelines.__new__(pipelines.InputPipelines)
    inputs._topology = topology
    inputs._num_replicas = 1
    dataset = tf.data.Dataset.range(8).batch(4)
    clone = tf.data.Dataset.range(8).batch(4)
    sent = []

    def replicate(dataset, hosts):
        sent.append(hosts)
        return {worker: clone}

    def cannot_send(dataset, hosts):
        raise tf.errors.InvalidArgumentError(None, None, "Cannot serialize py_function")

    original = pipelines.data_distribute.replicate
    try:
        pipelines.data_distribute.replicate = replicate
        ((host, used, _),) = inputs.distribute_dataset(dataset, None)._pipelines
        assert (host, used, sent) == (worker, clone, [[worker]])
        pipelines.data_distribute.replicate = cannot_send
        ((host, used, _),) = inputs.distribute_dataset(dataset, None)._pipelines
        assert (host, used) == (worker, dataset)
    finally:
        pipelines.data_distribute.replicate = original
