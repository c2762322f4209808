"""`compile(jit_compile=True)`: each replica's forward and backward pass is
compiled with XLA on its device (`keras_psdist/integration/xla.py`), and the
run trains to the weights of `jit_compile=False`."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_psdist as kpd
from keras_psdist.integration import xla

pytestmark = pytest.mark.heavy

EPOCHS = 3
# 130 examples in global batches of 64: the last batch of 2 leaves one of
# three replicas without data (it runs on a stand-in, weighed 0).
NUM_EXAMPLES = 130
BATCH_SIZE = 64


@pytest.fixture
def data(digits):
    x, y, _, _ = digits
    return x[:NUM_EXAMPLES], y[:NUM_EXAMPLES]


def _build(jit_compile, batch_norm, optimizer):
    layers = [
        keras.Input((64,)),
        keras.layers.Dense(32, activation="relu", kernel_regularizer="l2"),
    ]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization())
    layers += [
        keras.layers.Dense(10),
        keras.layers.Activation("linear", dtype="float32"),
    ]
    model = keras.Sequential(layers)
    model.compile(
        optimizer(),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=jit_compile,
    )
    return model


def _train(make_strategy, jit_compile, data, batch_norm=True, optimizer=None):
    """Trains under a fresh strategy; returns the weights, the history, the
    evaluation and the model."""
    x, y = data
    strategy = make_strategy()
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = _build(
            jit_compile, batch_norm, optimizer or (lambda: keras.optimizers.SGD(0.3))
        )
    history = model.fit(
        x, y, batch_size=BATCH_SIZE, epochs=EPOCHS, shuffle=False, verbose=0
    )
    evaluation = model.evaluate(x, y, batch_size=BATCH_SIZE, verbose=0)
    return [w.numpy() for w in model.weights], history.history, evaluation, model


def _compiled_calls(graphs, function="forward_backward"):
    """`(device, must compile, resource inputs)` of every call of the
    compiled `function` (the forward and backward pass) in the step graphs
    that made them."""
    calls = []
    for graph in graphs:
        for op in graph.get_operations():
            if op.type not in ("PartitionedCall", "StatefulPartitionedCall"):
                continue
            name = op.get_attr("f").name
            if not re.search(rf"_{function}_\d+$", name):
                continue
            definition = graph._get_function(name).cached_definition
            calls.append(
                (
                    op.device,
                    definition.attr["_XlaMustCompile"].b,
                    sum(t.dtype == tf.resource for t in op.inputs),
                )
            )
    return calls


def _assert_one_compiled_call_per_replica(calls, model):
    """The compiled calls (`_compiled_calls`) run on the replicas' devices,
    every one of them, XLA forced, with no variable inside."""
    devices = {
        tf.DeviceSpec.from_string(d).to_string()
        for d in model.distribute_strategy.extended.worker_devices
    }
    assert {tf.DeviceSpec.from_string(d).to_string() for d, _, _ in calls} == devices
    assert all(must for _, must, _ in calls)
    assert not any(resources for _, _, resources in calls)


# The plain and the partitioned PSStrategy on 3 replicas, from the devices.
PLAIN_AND_PARTITIONED = [
    lambda d: kpd.PSStrategy(devices=d[:3]),
    lambda d: kpd.PSStrategy(
        devices=d[:3],
        parameter_devices=d[3:5],
        partitioner=kpd.partitioners.Fixed(2, min_variable_bytes=0),
    ),
]


@pytest.mark.parametrize(
    "make_strategy",
    [
        *PLAIN_AND_PARTITIONED,
        lambda d: kpd.PSStrategy(devices=d[:3], aggregator="median", num_byzantine=1),
        # A whole-vector rule: distances over every gradient of the step.
        lambda d: kpd.PSStrategy(devices=d[:3], aggregator="geometric_median"),
    ],
    ids=["ps", "partitioned", "median", "geometric_median"],
)
def test_weights_equal_those_without_xla(cpu_devices, data, make_strategy, monkeypatch):
    # The compiled function's outer graphs: where each replica calls it.
    graphs = set()
    forward = xla._forward

    def spy(*args, **kwargs):
        graphs.add(tf.compat.v1.get_default_graph().outer_graph)
        return forward(*args, **kwargs)

    monkeypatch.setattr(xla, "_forward", spy)
    expected = _train(lambda: make_strategy(cpu_devices), False, data)
    assert not graphs
    weights, history, evaluation, model = _train(
        lambda: make_strategy(cpu_devices), True, data
    )
    assert model.jit_compile is True
    for a, b in zip(expected[0], weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(expected[1]["loss"], history["loss"], rtol=1e-5)
    np.testing.assert_allclose(expected[2], evaluation, rtol=1e-5)
    assert model.predict(data[0][:5], verbose=0).shape == (5, 10)

    # One compiled call per replica, on the replica's device, with no
    # variable inside (values come in as tensors).
    _assert_one_compiled_call_per_replica(_compiled_calls(graphs), model)


@pytest.mark.parametrize(
    "policy, atol",
    # bfloat16 keeps 8 bits of mantissa, float16 11: XLA and the kernels
    # without it round differently, as on one device (bfloat16, measured:
    # 8e-4 here, 1.3e-3 between Keras's own XLA and none on one device;
    # float16 1.5e-3 on one 2-core machine, under 1e-3 on another: the CPU's
    # kernels round differently).
    [("mixed_bfloat16", 5e-3), ("mixed_float16", 2.5e-3)],
)
def test_mixed_precision_is_close_to_without_xla(cpu_devices, data, policy, atol):
    # mixed_float16 with dynamic loss scaling: the compiled backward pass
    # takes the scaled loss.
    keras.mixed_precision.set_global_policy(policy)
    try:
        # Without BatchNormalization: in low precision its statistics amplify
        # rounding (Keras's own XLA on one device then moves these weights
        # by 0.04 against no XLA).
        expected, (weights, history, _, model) = (
            _train(
                lambda: kpd.PSStrategy(devices=cpu_devices[:3]),
                jit,
                data,
                batch_norm=False,
                optimizer=lambda: keras.optimizers.LossScaleOptimizer(
                    keras.optimizers.SGD(0.3)
                ),
            )
            for jit in (False, True)
        )
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert model.layers[0].compute_dtype == policy.split("_")[1]
    for a, b in zip(expected[0], weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=atol)
    np.testing.assert_allclose(expected[1]["loss"], history["loss"], rtol=1e-2)


def test_a_custom_train_step_is_refused_with_the_fix(cpu_devices):
    class Custom(keras.Sequential):
        def train_step(self, data):
            return super().train_step(data)

    with kpd.PSStrategy(devices=cpu_devices[:2]).scope():
        model = Custom([keras.Input((8,)), keras.layers.Dense(3)])
        with pytest.raises(ValueError, match="overrides `train_step`") as e:
            model.compile("sgd", "mse", jit_compile=True)
    assert "stateless_call" in str(e.value)


@pytest.mark.parametrize(
    "make_strategy", PLAIN_AND_PARTITIONED, ids=["ps", "partitioned"]
)
def test_predict_compiles_the_forward_pass_per_replica(
    cpu_devices, data, make_strategy, monkeypatch
):
    """`predict` under `jit_compile=True`: the forward pass compiled on each
    replica's device, the predictions those of `jit_compile=False` (the
    same weights; 130 examples leave a replica without data at the end)."""
    graphs = []
    predict_step = xla._predict_step

    def spy(model):
        graphs.append(tf.compat.v1.get_default_graph())
        return predict_step(model)

    monkeypatch.setattr(xla, "_predict_step", spy)
    x, _ = data
    predictions = {}
    for jit_compile in (False, True):
        strategy = make_strategy(cpu_devices)
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = _build(jit_compile, True, lambda: keras.optimizers.SGD(0.3))
        predictions[jit_compile] = model.predict(x, batch_size=BATCH_SIZE, verbose=0)
        assert bool(graphs) is jit_compile
    np.testing.assert_allclose(predictions[True], predictions[False], atol=1e-5)

    _assert_one_compiled_call_per_replica(_compiled_calls(graphs, "forward"), model)


def test_predict_step_eagerly_and_without_xla_is_keras_own(cpu_devices):
    """The patched `predict_step` compiles only while Keras traces a model
    that asked for XLA: called eagerly it is Keras's own."""
    with kpd.PSStrategy(devices=cpu_devices[:2]).scope():
        model = _build(True, False, lambda: keras.optimizers.SGD(0.3))
    x = np.ones((4, 64), np.float32)
    np.testing.assert_allclose(model.predict_step(x), model(x), atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("rule", kpd.aggregators.names())
def test_every_aggregator_trains_as_without_xla(cpu_devices, data, rule):
    """XLA produces each replica's gradients; any rule then combines them
    outside XLA, so every rule ends where it ends without XLA (5 replicas,
    f = 1 where the rule takes it and accepts 5 replicas)."""

    def make_strategy():
        try:
            return kpd.PSStrategy(
                devices=cpu_devices[:5], aggregator=rule, num_byzantine=1
            )
        except ValueError:
            return kpd.PSStrategy(devices=cpu_devices[:5], aggregator=rule)

    expected = _train(make_strategy, False, data, batch_norm=False)[0]
    weights = _train(make_strategy, True, data, batch_norm=False)[0]
    for a, b in zip(expected, weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
