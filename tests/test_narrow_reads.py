"""`read_dtype=`: a replica's reads of variables on another task travel
narrowed (cast on the variable's device, back on the replica's), the
gradient and the update stay float32, and every other read is exact.

One host has no second task, so most tests here make the logical CPU of the
variables count as one (`across_tasks`, conftest.py): the same code path a
cluster takes, op for op; `tests/test_compression_cluster.py` runs it across
processes.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_psdist as kpd
from keras_psdist.distribute import packed_transfers
from keras_psdist.variables import narrow_reads

X = np.array([[1.0 + 2**-12, -3.0 + 2**-11, 0.5]], np.float32)
# Kernel values bfloat16 cannot hold (8 bits of mantissa): rounding shows.
KERNEL = np.array([[1.0 + 2**-10], [2.0 - 2**-9], [0.3]], np.float32)


def _bf16(x):
    return tf.cast(tf.cast(x, tf.bfloat16), tf.float32).numpy()


@pytest.fixture
def narrowed(monkeypatch):
    """The dtype of every read `narrow_reads` narrows (appended at trace)."""
    dtypes = []
    read = narrow_reads.narrowed_read

    def counted(variable, dtype):
        dtypes.append(dtype)
        return read(variable, dtype)

    monkeypatch.setattr(narrow_reads, "narrowed_read", counted)
    # Reads a Keras step packs per ps task are narrowed in the pack, one
    # dtype per variable (`keras_psdist.distribute.packed_transfers`).
    packed = packed_transfers._packed

    def packed_counted(members, source, destination, wire_dtype=None):
        if wire_dtype is not None:
            dtypes.extend([wire_dtype] * len(members))
        return packed(members, source, destination, wire_dtype)

    monkeypatch.setattr(packed_transfers, "_packed", packed_counted)
    return dtypes


def _model(strategy):
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((3,)), keras.layers.Dense(1, use_bias=False)]
        )
        model.layers[0].kernel.assign(KERNEL)
        model.compile(optimizer=keras.optimizers.SGD(1.0), loss="mse")
    return model


def _strategy(cpu_devices, **kwargs):
    return kpd.PSStrategy(
        devices=cpu_devices[:2], parameter_devices=cpu_devices[2:3], **kwargs
    )


@pytest.mark.parametrize("value", ["int8", "float32", 16, "bogus", tf.int32])
def test_a_read_dtype_that_is_not_narrower_is_refused(value):
    with pytest.raises(ValueError, match=r"read_dtype must be None .*'bfloat16'"):
        kpd.PSStrategy(read_dtype=value)


@pytest.mark.parametrize("value", ["bfloat16", "float16", tf.bfloat16])
def test_the_strategy_says_its_read_dtype(value):
    strategy = kpd.PSStrategy(read_dtype=value)
    assert strategy.extended.read_dtype == tf.as_dtype(value)
    assert f"read_dtype='{tf.as_dtype(value).name}'" in repr(strategy)


def test_crossing_tasks_is_a_different_job_replica_or_task():
    ps = "/job:ps/replica:0/task:0/device:CPU:0"
    assert narrow_reads.crosses_tasks(ps, "/job:worker/replica:0/task:0/device:CPU:0")
    assert narrow_reads.crosses_tasks(ps, "/job:ps/replica:0/task:1/device:CPU:0")
    assert not narrow_reads.crosses_tasks(ps, "/job:ps/replica:0/task:0/device:CPU:1")
    assert not narrow_reads.crosses_tasks(ps, None)


def _forward(strategy, model):
    @tf.function
    def step(x):
        return strategy.run(model, args=(x,))

    return step


def test_on_one_host_reads_are_exact(cpu_devices):
    strategy = _strategy(cpu_devices, read_dtype="bfloat16")
    model = _model(strategy)
    step = _forward(strategy, model)
    graph = step.get_concrete_function(tf.TensorSpec([1, 3])).graph
    assert not [
        op
        for op in graph.get_operations()
        if op.type == "Cast"
        and tf.bfloat16 in (op.get_attr("SrcT"), op.get_attr("DstT"))
    ]
    out = strategy.experimental_local_results(step(X))[0]
    np.testing.assert_allclose(out.numpy(), X @ KERNEL, rtol=1e-7)


def test_across_tasks_the_read_is_cast_on_the_variables_device(
    cpu_devices, across_tasks
):
    """What saves the bytes: the narrowing cast runs where the variable
    lives, the widening one on each replica, so bfloat16 crosses."""
    strategy = _strategy(cpu_devices, read_dtype="bfloat16")
    model = _model(strategy)
    step = _forward(strategy, model)
    graph = step.get_concrete_function(tf.TensorSpec([1, 3])).graph
    index = lambda name: tf.DeviceSpec.from_string(name).device_index  # noqa: E731
    casts = [op for op in graph.get_operations() if op.type == "Cast"]
    narrowing = sorted(
        index(op.device) for op in casts if op.get_attr("DstT") == tf.bfloat16
    )
    widening = sorted(
        index(op.device) for op in casts if op.get_attr("SrcT") == tf.bfloat16
    )
    assert narrowing == [2, 2]  # one read per replica, on the ps device
    assert widening == [0, 1]  # back to float32 on each replica's device
    # Each replica computes with the kernel rounded to bfloat16.
    for out in strategy.experimental_local_results(step(X)):
        np.testing.assert_allclose(out.numpy(), X @ _bf16(KERNEL), rtol=1e-6)
    assert not np.allclose(X @ _bf16(KERNEL), X @ KERNEL, rtol=1e-6, atol=0)


@pytest.mark.parametrize("read_dtype", ["bfloat16", "float16"])
def test_the_gradient_and_the_update_stay_float32(
    cpu_devices, across_tasks, read_dtype
):
    """One SGD step (learning rate 1) of `sum(x @ w)`: its gradient, `x`,
    is exact float32 (not rounded through the cast), and so is the update
    of the float32 variable."""
    strategy = _strategy(cpu_devices, read_dtype=read_dtype)
    model = _model(strategy)
    optimizer = model.optimizer

    @tf.function
    def step(x):
        def replica_fn(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(x))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)
            return loss

        return strategy.run(replica_fn, args=(x,))

    step(X)
    # Two replicas, each the gradient `x`; summed across replicas (a custom
    # loop's convention: the loss is scaled by the user).
    np.testing.assert_array_equal(
        model.layers[0].kernel.numpy(), KERNEL - 2 * X.T.astype(np.float32)
    )
    assert model.layers[0].kernel.dtype == "float32"


def test_reads_outside_a_replica_step_are_exact(cpu_devices, across_tasks):
    strategy = _strategy(cpu_devices, read_dtype="bfloat16")
    model = _model(strategy)
    np.testing.assert_array_equal(model.get_weights()[0], KERNEL)
    np.testing.assert_array_equal(model.layers[0].kernel.numpy(), KERNEL)
    with strategy.scope():
        np.testing.assert_array_equal(
            tf.convert_to_tensor(model.layers[0].kernel).numpy(), KERNEL
        )


def test_fit_trains_with_narrow_reads(cpu_devices, across_tasks, digits, narrowed):
    """`fit` on the digits, its step's reads narrowed: close to float32
    reads' accuracy."""
    x, y, x_test, y_test = digits
    accuracies, traced = {}, {}
    for read_dtype in (None, "bfloat16"):
        strategy = _strategy(cpu_devices, read_dtype=read_dtype)
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = keras.Sequential(
                [
                    keras.Input((64,)),
                    keras.layers.Dense(32, activation="relu"),
                    keras.layers.Dense(10),
                ]
            )
            model.compile(
                optimizer="adam",
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"],
            )
        del narrowed[:]
        model.fit(x, y, batch_size=32, epochs=8, verbose=0, shuffle=False)
        traced[read_dtype] = list(narrowed)
        accuracies[read_dtype] = model.evaluate(x_test, y_test, verbose=0)[1]
    # Traced once per replica: the 4 kernels and biases of 2 replicas.
    assert traced == {None: [], "bfloat16": [tf.bfloat16] * 8}, traced
    assert accuracies["bfloat16"] >= 0.85, accuracies
    assert abs(accuracies["bfloat16"] - accuracies[None]) <= 0.03, accuracies


def test_an_xla_step_reads_narrowed_too(cpu_devices, across_tasks, narrowed):
    """`jit_compile=True`: the values each replica's compiled pass takes are
    read (narrowed) outside it, as without XLA."""
    strategy = _strategy(cpu_devices, read_dtype="bfloat16")
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    x = np.ones((32, 3), np.float32)
    model.fit(x, np.zeros((32, 2), np.float32), batch_size=8, verbose=0)
    assert model.jit_compile is True
    assert narrowed == [tf.bfloat16] * 4  # kernel and bias, 2 replicas
