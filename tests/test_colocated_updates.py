"""`assign_add` and `assign_sub` of a Keras variable on a ps device are
computed there (`integration/colocated_updates.py`), and the thread
settings a ps task and its clients get (`cluster/server.py`, `_tf.py`)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_psdist as kpd
from keras_psdist import _tf
from keras_psdist.cluster import server

pytestmark = pytest.mark.timeout(300)


def _ops_on(graph, device_suffix):
    return {
        op.type
        for op in graph.get_operations()
        if op.device.endswith(device_suffix) and op.type != "Const"
    }


def _first_cross_device_inputs(graph, variable_device):
    """The ops off `variable_device` that take a tensor made on it."""
    crossing = []
    for op in graph.get_operations():
        if op.device == variable_device:
            continue
        for tensor in op.inputs:
            if tensor.op.device == variable_device and tensor.dtype != tf.resource:
                crossing.append((tensor.op.type, op.type))
    return crossing


@pytest.mark.parametrize("method", ["assign_add", "assign_sub"])
def test_the_arithmetic_runs_where_the_variable_lives(cpu_devices, method):
    """Traced on the replica's device, the read, the arithmetic and the
    write of a ps variable stay on its device: nothing of it crosses to the
    replica (before, its value went to the replica and the sum came back)."""
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:1], parameter_devices=cpu_devices[1:2]
    )
    with strategy.scope():
        counter = keras.Variable(10, dtype="int64", trainable=False)
    ps_device = counter.value.device

    @tf.function
    def step():
        with tf.device(cpu_devices[0]):
            getattr(counter, method)(3)  # Its new value unused: not sent.

    graph = step.get_concrete_function().graph
    assert "AddV2" in _ops_on(graph, ps_device[-5:]) or "Sub" in _ops_on(
        graph, ps_device[-5:]
    )
    assert _first_cross_device_inputs(graph, ps_device) == []
    step()
    assert int(counter.numpy()) == (13 if method == "assign_add" else 7)


def test_iterations_count_each_step_once(cpu_devices):
    """The optimizer's `iterations` (its `assign_add(1)` runs on the ps now)
    counts every step of every replica once, as on one device."""
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:2], parameter_devices=cpu_devices[2:3]
    )
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile(optimizer="adam", loss="mse", steps_per_execution=3)
    x = np.ones((64, 4), np.float32)
    y = np.zeros((64, 2), np.float32)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 2 * 64 // 8


def test_a_variable_of_no_strategy_runs_keras_method():
    """Outside a keras_psdist strategy the wrapper passes through: the same
    ops, on the caller's device."""
    counter = keras.Variable(1.5)
    counter.assign_add(2.0)
    counter.assign_sub(0.5)
    assert float(counter.numpy()) == 3.0


def test_ps_intra_op_threads_default_and_override():
    assert server.ps_intra_op_threads({}) == 1
    assert server.ps_intra_op_threads({server.PS_INTRA_OP_THREADS_ENV: "3"}) == 3
    assert server.ps_intra_op_threads({server.PS_INTRA_OP_THREADS_ENV: "0"}) == 0


@pytest.mark.parametrize("text", ["-2", "two", "", "1.5"])
def test_ps_intra_op_threads_refuses_what_is_no_count(text):
    with pytest.raises(ValueError, match=r"one per core\); received") as raised:
        server.ps_intra_op_threads({server.PS_INTRA_OP_THREADS_ENV: text})
    assert repr(text) in str(raised.value)


def test_without_thread_spinning_reaches_the_config_remote_tasks_get():
    """The flag is in the context's config, which
    `experimental_connect_to_cluster` copies into the `ServerDef` it sends;
    the rest of the config is kept."""
    ctx = _tf.context.context()
    saved = ctx._config
    try:
        tf.config.threading.get_intra_op_parallelism_threads()  # initialized
        before = ctx.config
        _tf.without_thread_spinning()
        after = ctx.config
        assert after.experimental.disable_thread_spinning
        after.experimental.disable_thread_spinning = (
            before.experimental.disable_thread_spinning
        )
        assert after == before
    finally:
        ctx._config = saved
