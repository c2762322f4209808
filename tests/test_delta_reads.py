"""`read_compression=`: a replica on another task reads a large variable by
its largest changes since its last read, keeping a copy equal to the one
the variable's device keeps for it; every 100th read (and the first) whole.

As in test_narrow_reads.py, the logical CPU of the variables counts as
another task (`across_tasks`); tests/test_compression_cluster.py and the
test bed (`benchmarks/scaling.py`) run it across processes and hosts.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_psdist as kpd
from keras_psdist.variables import delta_reads

D = 2048  # coordinates of the kernel: above delta_reads.MIN_SIZE
RATIO = 0.01  # 21 of them a read


def _strategy(cpu_devices, **kwargs):
    return kpd.PSStrategy(
        devices=cpu_devices[:2], parameter_devices=cpu_devices[2:3], **kwargs
    )


def _model(strategy, kernel):
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((D,)), keras.layers.Dense(1, use_bias=False)]
        )
        model.layers[0].kernel.assign(kernel)
    return model


def _reader(strategy, model):
    """A step that returns what each replica reads of the kernel."""
    kernel = model.layers[0].kernel.value

    @tf.function
    def step():
        return strategy.run(lambda: tf.convert_to_tensor(kernel))

    return lambda: [v.numpy() for v in strategy.experimental_local_results(step())]


@pytest.mark.parametrize(
    "value", ["sign", "random_k", "fp16", {"class_name": "power_sgd", "config": {}}]
)
def test_read_compression_other_than_top_k_is_refused(value):
    with pytest.raises(ValueError, match=r"read_compression must be None .* top_k"):
        kpd.PSStrategy(read_compression=value)


def test_a_bad_ratio_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"`ratio` of top_k .* Received: ratio=0"):
        kpd.PSStrategy(read_compression="top_k(ratio=0)")


@pytest.mark.parametrize("value", ["top_k(ratio=0.05)", kpd.compression.TopK(0.05)])
def test_the_strategy_says_its_read_compression(value):
    strategy = kpd.PSStrategy(read_compression=value)
    assert strategy.extended.read_compression.ratio == 0.05
    assert "read_compression=TopK(ratio=0.05)" in repr(strategy)
    assert kpd.PSStrategy().extended.read_compression is None


def test_on_one_host_nothing_is_copied(cpu_devices):
    strategy = _strategy(cpu_devices, read_compression="top_k(ratio=0.01)")
    kernel = np.arange(D, dtype=np.float32).reshape(D, 1)
    model = _model(strategy, kernel)
    assert strategy.extended.delta_reads.copies() == []
    for read in _reader(strategy, model)():
        np.testing.assert_array_equal(read, kernel)


def test_a_replica_reads_the_largest_changes_and_the_rest_later(
    cpu_devices, across_tasks
):
    strategy = _strategy(cpu_devices, read_compression=f"top_k(ratio={RATIO})")
    rng = np.random.default_rng(0)
    start = rng.normal(size=(D, 1)).astype(np.float32)
    model = _model(strategy, start)
    variable = model.layers[0].kernel
    read = _reader(strategy, model)
    copies = strategy.extended.delta_reads.copies(variable.value._v)
    assert len(copies) == 2  # one per replica, each on its own device
    assert sorted(c.local.device for c in copies) == list(
        strategy.extended.worker_devices
    )
    for copy in copies:
        assert copy.seen.device == variable.value.device
    # The first read is whole.
    for value in read():
        np.testing.assert_array_equal(value, start)
    # A change of every coordinate, one of each magnitude; written in the
    # replicas' update (not a cross-replica write, which reads whole next).
    change = np.zeros((D, 1), np.float32)
    order = rng.permutation(D)
    change[order, 0] = np.arange(1, D + 1, dtype=np.float32)
    with strategy.scope():
        strategy.extended.update(
            variable.value, lambda v, d: v.assign_add(d), args=(change,)
        )
    k = int(np.ceil(RATIO * D))  # 21
    current = start + change
    for reads in range(1, 4):
        largest = order[-k * reads :]
        for value in read():
            np.testing.assert_array_equal(value[largest], current[largest])
            others = np.setdiff1d(np.arange(D), largest)
            np.testing.assert_array_equal(value[others], start[others])
    # Each side holds the same copy.
    for copy in copies:
        np.testing.assert_array_equal(copy.seen.numpy(), copy.local.numpy())


def test_every_hundredth_read_and_the_first_after_set_weights_are_whole(
    cpu_devices, across_tasks
):
    strategy = _strategy(cpu_devices, read_compression="top_k(ratio=0.005)")
    start = np.zeros((D, 1), np.float32)
    model = _model(strategy, start)
    variable = model.layers[0].kernel
    read = _reader(strategy, model)
    read()
    ones = np.ones((D, 1), np.float32)
    with strategy.scope():
        strategy.extended.update(
            variable.value, lambda v, d: v.assign_add(d), args=(ones,)
        )
    for _ in range(delta_reads.FULL_READ_EVERY - 1):
        values = read()
    # 99 reads of 11 changed coordinates (of 2048 equal changes): not all.
    assert 0 < (values[0] == 1).sum() < D
    for value in read():  # the 101st
        np.testing.assert_array_equal(value, ones)
    model.set_weights([np.full((D, 1), 3.0, np.float32)])
    for value in read():
        np.testing.assert_array_equal(value, np.full((D, 1), 3.0))


def test_the_gradient_reaches_the_variable_unchanged(cpu_devices, across_tasks):
    """One SGD step (learning rate 1) of `sum(x @ w)` read by change: the
    update is the exact gradient `x` of each of the 2 replicas (summed, a
    custom loop's convention), as with whole reads."""
    strategy = _strategy(cpu_devices, read_compression="top_k(ratio=0.01)")
    model = _model(strategy, np.zeros((D, 1), np.float32))
    with strategy.scope():
        optimizer = keras.optimizers.SGD(1.0)
        optimizer.build(model.trainable_variables)
    x = np.linspace(-1, 1, D, dtype=np.float32)[None, :]

    @tf.function
    def step():
        def replica_fn():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(x))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)

        strategy.run(replica_fn)

    step()
    np.testing.assert_array_equal(model.layers[0].kernel.numpy(), -2 * x.T)


def test_only_the_changes_cross_from_the_variables_device(cpu_devices, across_tasks):
    """What saves the bytes: the top-k of the change runs where the variable
    lives; what the replica's device receives is the k values."""
    strategy = _strategy(
        cpu_devices, read_compression="top_k(ratio=0.01)", read_dtype="bfloat16"
    )
    model = _model(strategy, np.zeros((D, 1), np.float32))
    kernel = model.layers[0].kernel.value

    @tf.function
    def step():
        return strategy.run(lambda: tf.convert_to_tensor(kernel))

    graph = step.get_concrete_function().graph
    ops = [op for fn in [graph] for op in fn.get_operations()]
    # The top-k and its gather are in the cond's branch functions.
    for fn in graph._functions.values():
        ops.extend(fn.graph.get_operations())
    index = lambda op: tf.DeviceSpec.from_string(op.device).device_index  # noqa: E731
    top_k = [index(op) for op in ops if op.type == "TopKV2"]
    assert top_k == [2, 2], top_k  # one per replica, on the ps device
    narrowing = [
        index(op)
        for op in ops
        if op.type == "Cast" and op.get_attr("DstT") == tf.bfloat16
    ]
    assert set(narrowing) == {2}, narrowing


def test_fit_trains_with_reads_by_change(cpu_devices, across_tasks, digits):
    """`fit` on the digits, each replica reading the 5% largest changes of
    the first kernel (64 x 32): close to whole reads' accuracy."""
    x, y, x_test, y_test = digits
    accuracies = {}
    for read_compression in (None, "top_k(ratio=0.05)"):
        strategy = _strategy(cpu_devices, read_compression=read_compression)
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
        model.fit(x, y, batch_size=32, epochs=8, verbose=0, shuffle=False)
        accuracies[read_compression] = model.evaluate(x_test, y_test, verbose=0)[1]
        if read_compression:
            # The first kernel (2048 coordinates) only, a copy per replica;
            # the rest are small.
            assert len(strategy.extended.delta_reads.copies()) == 2
    assert accuracies["top_k(ratio=0.05)"] >= 0.85, accuracies
    assert abs(accuracies["top_k(ratio=0.05)"] - accuracies[None]) <= 0.03, accuracies


def test_an_xla_step_reads_by_change_too(cpu_devices, across_tasks):
    """`jit_compile=True`: the values each replica's compiled pass takes are
    read (by their change) outside it, as without XLA; it trains."""
    strategy = _strategy(cpu_devices, read_compression="top_k(ratio=0.05)")
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=True)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 64)).astype(np.float32)
    y = x[:, :32] * 0.5
    history = model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    assert model.jit_compile is True
    copies = strategy.extended.delta_reads.copies()
    assert len(copies) == 2
    # 8 steps an epoch, each replica read the kernel once a step.
    assert [int(c.reads.numpy()) for c in copies] == [24, 24]
    losses = history.history["loss"]
    assert losses[2] < losses[1] < losses[0], losses
