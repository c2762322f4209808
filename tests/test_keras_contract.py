"""The Keras contract: the same checks on `PSStrategy` and `MirroredStrategy`.

Every test takes the `strategy_factory` fixture, parametrized as `"ps"`
(`keras_psdist.PSStrategy`), `"ps_partitioned"` (a `PSStrategy` whose
partitioner splits every variable of 1 KiB or more into 3 row shards on 3
parameter devices), `"ps_all_reduce"` (a `PSStrategy(dense="all_reduce")`:
dense trainable variables replicated on the replicas, embedding tables on the
parameter device) and `"mirrored"` (`tf.distribute.MirroredStrategy`), all
with 2 logical CPU replicas, so any difference in behaviour between them
shows up as a test that passes for one and fails for another. Two replicas
are enough for every check here (a split batch, an aggregate, a replica
left without data by a batch of one) and trace in about half the time of
four (the default run's contract: 135 s -> 103 s under `-n 2`).

Where MirroredStrategy itself is broken on TF 2.21 the `mirrored` case is
marked `xfail(strict=False)`; the `ps` cases are never marked.

The `mirrored` case checks TensorFlow's strategy, not ours: it shows that
each check states Keras's own behaviour. It is marked `slow` (run it with
`pytest -m slow tests/test_keras_contract.py`), which keeps the default run
to our three strategies; it took 170 s of the default suite's workers.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_psdist as kpd
from tests.shared_mirrored import mirrored_strategy

NUM_REPLICAS = 2


# ---------------------------------------------------------------- fixtures


class StrategyFactory:
    """Builds the strategy of one kind with replicas on the first 2 logical
    CPUs.

    `ps` and `ps_partitioned` get a fresh `PSStrategy` per call (the latter
    with its variables on CPUs 2 to 4); `mirrored` the process-wide one (see
    `tests/shared_mirrored.py`).
    """

    def __init__(self, kind: str, devices: list[str], parameter_devices: list[str]):
        self.kind = kind
        self.devices = devices
        self.parameter_devices = parameter_devices
        self.created: list[tf.distribute.Strategy] = []

    def __call__(self) -> tf.distribute.Strategy:
        if self.kind == "ps":
            return kpd.PSStrategy(devices=self.devices)
        if self.kind == "ps_partitioned":
            strategy = kpd.PSStrategy(
                devices=self.devices,
                parameter_devices=self.parameter_devices,
                partitioner=kpd.partitioners.Fixed(3, min_variable_bytes=1024),
            )
            self.created.append(strategy)
            return strategy
        if self.kind == "ps_all_reduce":
            strategy = kpd.PSStrategy(devices=self.devices, dense="all_reduce")
            self.created.append(strategy)
            return strategy
        return mirrored_strategy(tuple(self.devices))

    def split_any_variable(self) -> bool:
        """Whether some strategy this factory made partitioned a variable."""
        return any(
            row.shard is not None
            for strategy in self.created
            for row in strategy.extended.placement.variables
        )

    def replicated_any_variable(self) -> bool:
        """Whether some strategy this factory made replicated a variable."""
        return any(
            strategy.extended.placement.replicated() for strategy in self.created
        )

    def __repr__(self) -> str:
        return f"StrategyFactory({self.kind!r})"


@pytest.fixture(
    params=[
        "ps",
        "ps_partitioned",
        "ps_all_reduce",
        pytest.param("mirrored", marks=pytest.mark.slow),
    ]
)
def strategy_factory(request, cpu_devices):
    factory = StrategyFactory(
        request.param,
        cpu_devices[:NUM_REPLICAS],
        cpu_devices[NUM_REPLICAS : NUM_REPLICAS + 3],
    )
    yield factory
    if factory.kind == "ps_partitioned":
        # Else the test would pass without testing partitioned variables.
        assert factory.split_any_variable(), "no variable was partitioned"
    if factory.kind == "ps_all_reduce" and factory.created:
        # Else the test would pass without testing replicated variables.
        assert factory.replicated_any_variable(), "no variable was replicated"


def xfail_if_mirrored(request, factory: StrategyFactory, bug: str) -> None:
    """Marks the running test xfail (non-strict) for MirroredStrategy only."""
    if factory.kind == "mirrored":
        request.applymarker(
            pytest.mark.xfail(
                strict=False, reason=f"MirroredStrategy bug on TF 2.21: {bug}"
            )
        )


@pytest.fixture(scope="module")
def digits_small(digits):
    """The first 512 digits training samples: exactly 8 global batches of 64."""
    x_train, y_train, _, _ = digits
    return x_train[:512], y_train[:512]


# ------------------------------------------------------------------ helpers


def mlp(hidden=(64, 64), seed=0, **dense_kwargs) -> keras.Model:
    """A digits MLP (64 -> hidden... -> 10 logits) with seeded initial weights."""
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((64,))]
    layers += [keras.layers.Dense(h, activation="relu", **dense_kwargs) for h in hidden]
    layers.append(keras.layers.Dense(10, **dense_kwargs))
    return keras.Sequential(layers)


def sparse_ce() -> keras.losses.Loss:
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def get_weights(model: keras.Model) -> list[np.ndarray]:
    return [np.asarray(w) for w in model.get_weights()]


def assert_weights_close(actual, expected, rtol, atol):
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        np.testing.assert_allclose(
            a, e, rtol=rtol, atol=atol, err_msg=f"weight #{i} differs"
        )


def assert_weights_differ(before, after):
    assert any(not np.allclose(b, a) for b, a in zip(before, after, strict=True)), (
        "training did not change any weight"
    )


def assert_finite(weights):
    for i, w in enumerate(weights):
        assert np.all(np.isfinite(w)), f"weight #{i} has non-finite values"


def model_under_strategy(strategy_factory, build, make_optimizer):
    """Returns `(model, optimizer, initial_weights)`: a model built and compiled
    under a fresh strategy, starting from the weights of a model built outside
    it. The optimizer is made inside the scope: Keras optimizers capture the
    strategy they are created under."""
    initial = get_weights(build())
    with strategy_factory().scope():
        model = build()
        model.set_weights(initial)
        optimizer = make_optimizer()
        model.compile(optimizer=optimizer, loss=sparse_ce())
    return model, optimizer, initial


def single_device_reference(
    build, initial_weights, optimizer, x, y, batch_size, loss=None, epochs=1
):
    """Trains `build()` with no strategy from `initial_weights`; returns weights."""
    assert not tf.distribute.has_strategy()
    model = build()
    model.set_weights(initial_weights)
    model.compile(optimizer=optimizer, loss=loss or sparse_ce())
    model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0)
    return get_weights(model), model


class BatchCounter(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.train_batches = 0
        self.epochs = 0

    def on_train_batch_end(self, batch, logs=None):
        self.train_batches += 1

    def on_epoch_end(self, epoch, logs=None):
        self.epochs += 1


# -------------------------------------------------------------------- tests


def test_fit_evaluate_predict_numpy(strategy_factory, digits):
    """1. fit/evaluate/predict on numpy, validation_split, metrics, callbacks."""
    x_train, y_train, x_test, y_test = digits
    strategy = strategy_factory()
    assert strategy.num_replicas_in_sync == NUM_REPLICAS
    with strategy.scope():
        model = mlp()
        model.compile(
            optimizer=keras.optimizers.Adam(3e-3),
            loss=sparse_ce(),
            metrics=["accuracy"],
        )
    counter = BatchCounter()
    history_cb = keras.callbacks.History()
    # 5 epochs reach ~0.93-0.96 test accuracy on one device for seeds 0-3.
    epochs, batch_size = 5, 64
    history = model.fit(
        x_train,
        y_train,
        batch_size=batch_size,
        epochs=epochs,
        validation_split=0.2,
        callbacks=[counter, history_cb],
        verbose=0,
    )
    num_fit = int(len(x_train) * (1 - 0.2))
    steps_per_epoch = -(-num_fit // batch_size)
    assert counter.train_batches == epochs * steps_per_epoch
    assert counter.epochs == epochs
    assert history_cb.history["loss"] == history.history["loss"]
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        assert key in history.history, sorted(history.history)
        assert len(history.history[key]) == epochs
        assert np.all(np.isfinite(history.history[key]))
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert history.history["val_accuracy"][-1] > 0.85

    loss, accuracy = model.evaluate(x_test, y_test, batch_size=batch_size, verbose=0)
    assert np.isfinite(loss)
    assert accuracy > 0.85, f"test accuracy {accuracy:.3f}"

    logits = model.predict(x_test, batch_size=batch_size, verbose=0)
    assert logits.shape == (len(x_test), 10)
    # predict must keep the input order (per-replica shards re-concatenated).
    predicted_accuracy = np.mean(np.argmax(logits, axis=-1) == y_test)
    np.testing.assert_allclose(predicted_accuracy, accuracy, atol=1e-6)
    # And agree with a plain call on the same weights.
    np.testing.assert_allclose(
        logits, model(x_test, training=False).numpy(), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("input_kind", ["dataset", "distributed_dataset"])
def test_fit_tf_data(strategy_factory, digits, input_kind):
    """2. tf.data input, also pre-distributed with experimental_distribute_dataset."""
    x_train, y_train, _, _ = digits
    strategy = strategy_factory()
    with strategy.scope():
        model = mlp(hidden=(32,))
        model.compile(optimizer=keras.optimizers.Adam(3e-3), loss=sparse_ce())
    ds = tf.data.Dataset.from_tensor_slices((x_train, y_train)).repeat().batch(64)
    if input_kind == "distributed_dataset":
        ds = strategy.experimental_distribute_dataset(ds)
        assert isinstance(ds, tf.distribute.DistributedDataset)
    steps = len(x_train) // 64
    before = get_weights(model)
    history = model.fit(ds, steps_per_epoch=steps, epochs=3, verbose=0)
    losses = history.history["loss"]
    assert len(losses) == 3
    assert np.all(np.isfinite(losses))
    assert losses[-1] < 0.75 * losses[0], losses
    assert_weights_differ(before, get_weights(model))
    assert int(model.optimizer.iterations.numpy()) == 3 * steps


def test_batch_normalization_moving_statistics(strategy_factory, request, digits):
    """3. BatchNormalization: inference (moving statistics) ~ training accuracy."""
    xfail_if_mirrored(
        request,
        strategy_factory,
        "BatchNormalization trains but evaluate accuracy is near chance "
        "(moving statistics are wrong)",
    )
    x_train, y_train, x_test, y_test = digits
    strategy = strategy_factory()
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(64),
                keras.layers.BatchNormalization(momentum=0.9),
                keras.layers.Activation("relu"),
                keras.layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.Adam(3e-3),
            loss=sparse_ce(),
            metrics=["accuracy"],
        )
    bn = model.layers[1]
    history = model.fit(x_train, y_train, batch_size=64, epochs=4, verbose=0)
    train_accuracy = history.history["accuracy"][-1]
    assert train_accuracy > 0.85, history.history
    # The statistics were updated at all.
    assert not np.allclose(bn.moving_mean.numpy(), 0.0)
    assert not np.allclose(bn.moving_variance.numpy(), 1.0)
    # Inference uses the moving statistics: wrong ones show as a drop here.
    _, eval_accuracy = model.evaluate(x_test, y_test, batch_size=64, verbose=0)
    assert eval_accuracy > 0.8, (eval_accuracy, train_accuracy)
    assert abs(eval_accuracy - train_accuracy) < 0.1, (eval_accuracy, train_accuracy)


def test_kernel_regularizer_in_loss(strategy_factory, digits, digits_small):
    """4. Regularization losses: counted once in the loss and in the gradients."""
    _, _, x_test, y_test = digits
    x, y = digits_small
    l2 = 1e-2

    def build():
        return mlp(hidden=(32,), kernel_regularizer=keras.regularizers.L2(l2))

    reference_model = build()
    initial = get_weights(reference_model)

    strategy = strategy_factory()
    with strategy.scope():
        model = build()
        model.set_weights(initial)
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=sparse_ce())
    assert len(model.losses) == 2
    model.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)

    # The penalty is counted once in the gradients: same weights as one device.
    expected, _ = single_device_reference(
        build, initial, keras.optimizers.SGD(0.1), x, y, batch_size=64
    )
    assert_weights_close(get_weights(model), expected, rtol=1e-5, atol=1e-6)

    # ... and once in the reported loss.
    penalty = sum(
        l2 * float(np.sum(np.square(layer.kernel.numpy()))) for layer in model.layers
    )
    assert penalty > 1e-3
    eval_loss = model.evaluate(x_test, y_test, batch_size=64, verbose=0)
    logits = model.predict(x_test, batch_size=64, verbose=0)
    pure_ce = float(sparse_ce()(y_test, logits))
    assert eval_loss > pure_ce
    np.testing.assert_allclose(eval_loss, pure_ce + penalty, rtol=1e-4)


def test_loss_scale_optimizer(strategy_factory, digits):
    """5. LossScaleOptimizer(Adam) trains: loss decreases, finite weights."""
    x_train, y_train, _, _ = digits
    strategy = strategy_factory()
    with strategy.scope():
        model = mlp(hidden=(32,))
        optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(3e-3))
        model.compile(optimizer=optimizer, loss=sparse_ce())
    before = get_weights(model)
    history = model.fit(x_train, y_train, batch_size=64, epochs=3, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses))
    assert losses[-1] < 0.75 * losses[0], losses
    after = get_weights(model)
    assert_finite(after)
    assert_weights_differ(before, after)
    assert np.isfinite(float(optimizer.dynamic_scale.numpy()))


def test_ema(strategy_factory, request, digits_small):
    """6. use_ema with ema_overwrite_frequency, and finalize_variable_values."""
    xfail_if_mirrored(
        request, strategy_factory, "use_ema=True with ema_overwrite_frequency fails"
    )
    x, y = digits_small
    strategy = strategy_factory()

    # (a) Overwrite every 2 iterations: after an even number of steps the
    # weights are the moving averages, after an odd number they are not.
    with strategy.scope():
        model = mlp(hidden=(32,))
        # A short EMA (momentum 0.9) so that training visibly progresses
        # although the weights are pulled back to the averages every 2 steps.
        optimizer = keras.optimizers.Adam(
            2e-2, use_ema=True, ema_momentum=0.9, ema_overwrite_frequency=2
        )
        model.compile(optimizer=optimizer, loss=sparse_ce())

    observed = []

    class WatchOverwrite(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            step = int(optimizer.iterations.numpy())
            same = all(
                np.allclose(v.numpy(), a.numpy(), rtol=0, atol=1e-7)
                for v, a in zip(
                    model.trainable_variables,
                    optimizer._model_variables_moving_average,
                    strict=True,
                )
            )
            observed.append((step, same))

    history = model.fit(
        x, y, batch_size=64, epochs=4, verbose=0, callbacks=[WatchOverwrite()]
    )
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses))
    assert losses[-1] < 0.75 * losses[0], losses
    assert [step for step, _ in observed] == list(range(1, 33))
    # The first step initializes the averages to the weights; from then on
    # they differ except right after an overwrite (every 2nd iteration).
    assert [same for _, same in observed] == [
        step == 1 or step % 2 == 0 for step in range(1, 33)
    ]

    # (b) No overwrite: weights are the raw ones until finalize_variable_values.
    with strategy.scope():
        model = mlp(hidden=(32,))
        optimizer = keras.optimizers.Adam(3e-3, use_ema=True)
        model.compile(optimizer=optimizer, loss=sparse_ce())
    for i in range(4):
        model.train_on_batch(x[64 * i : 64 * (i + 1)], y[64 * i : 64 * (i + 1)])
    assert int(optimizer.iterations.numpy()) == 4
    averages = [a.numpy() for a in optimizer._model_variables_moving_average]
    raw = [v.numpy() for v in model.trainable_variables]
    assert_weights_differ(raw, averages)
    optimizer.finalize_variable_values(model.trainable_variables)
    assert_weights_close(
        [v.numpy() for v in model.trainable_variables], averages, rtol=0, atol=1e-7
    )


def test_gradient_accumulation_matches_large_batch(
    strategy_factory, request, digits_small
):
    """7. SGD(gradient_accumulation_steps=2) == plain SGD on a 2x batch."""
    xfail_if_mirrored(request, strategy_factory, "gradient_accumulation_steps fails")
    x, y = digits_small
    x, y = x[:128], y[:128]

    def build():
        return mlp(hidden=(32,))

    model, optimizer, initial = model_under_strategy(
        strategy_factory,
        build,
        lambda: keras.optimizers.SGD(0.1, gradient_accumulation_steps=2),
    )
    # 4 micro-batches of global batch 32 (8 per replica).
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    assert int(optimizer.iterations.numpy()) == 2

    # Averaging 2 micro-batches of 32 is one SGD step on their 64 samples.
    expected, _ = single_device_reference(
        build, initial, keras.optimizers.SGD(0.1), x, y, batch_size=64
    )
    assert_weights_close(get_weights(model), expected, rtol=1e-4, atol=1e-5)


@keras.saving.register_keras_serializable(package="contract_tests")
class GaussianNoiseWithSeedGenerator(keras.layers.Layer):
    """Adds seeded noise in training, drawing from its own SeedGenerator."""

    def __init__(self, stddev=0.1, seed=1337, **kwargs):
        super().__init__(**kwargs)
        self.stddev = stddev
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def call(self, inputs, training=False):
        if not training:
            return inputs
        noise = keras.random.normal(
            keras.ops.shape(inputs), stddev=self.stddev, seed=self.seed_generator
        )
        return inputs + noise

    def get_config(self):
        return {**super().get_config(), "stddev": self.stddev, "seed": self.seed}


def test_dropout_and_seed_generator(strategy_factory, request, digits):
    """8. Dropout + a SeedGenerator layer train and the RNG state advances."""
    xfail_if_mirrored(
        request,
        strategy_factory,
        "Dropout/SeedGenerator in replicas fails with CollectiveReduceV2 errors",
    )
    x_train, y_train, _, _ = digits
    strategy = strategy_factory()
    with strategy.scope():
        keras.utils.set_random_seed(0)
        noise = GaussianNoiseWithSeedGenerator(0.1, seed=1337)
        dropout = keras.layers.Dropout(0.5, seed=7)
        model = keras.Sequential(
            [
                keras.Input((64,)),
                noise,
                keras.layers.Dense(64, activation="relu"),
                dropout,
                keras.layers.Dense(10),
            ]
        )
        model.compile(optimizer=keras.optimizers.Adam(3e-3), loss=sparse_ce())
    noise_state = noise.seed_generator.state.numpy().copy()
    dropout_state = dropout.seed_generator.state.numpy().copy()
    history = model.fit(x_train, y_train, batch_size=64, epochs=3, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses))
    assert losses[-1] < 0.75 * losses[0], losses
    assert not np.array_equal(noise.seed_generator.state.numpy(), noise_state)
    assert not np.array_equal(dropout.seed_generator.state.numpy(), dropout_state)
    # Dropout really is active in training and off in inference.
    sample = x_train[:64]
    np.testing.assert_allclose(
        model(sample, training=False).numpy(),
        model(sample, training=False).numpy(),
    )
    assert not np.allclose(
        model(sample, training=True).numpy(), model(sample, training=False).numpy()
    )


# A process that has never imported keras_psdist: it loads `.keras` files
# and predicts, one request (a JSON line: model, inputs, output path) at a
# time, and answers whether keras_psdist is loaded after each (or the error).
_LOAD_IN_FRESH_PROCESS = textwrap.dedent(
    """
    import json, sys, traceback
    import numpy as np
    import keras
    for line in sys.stdin:
        request = json.loads(line)
        try:
            model = keras.models.load_model(request["model"])
            x = np.load(request["x"])
            np.save(request["out"], model.predict(x, verbose=0))
        except Exception:
            answer = {"error": traceback.format_exc()}
        else:
            answer = {"keras_psdist_loaded": "keras_psdist" in sys.modules}
        print(json.dumps(answer))
        sys.stdout.flush()
    """
)
FRESH_PROCESS_TIMEOUT_S = 180


class FreshProcess:
    """One Python process without keras_psdist, shared by a module's tests
    (a TensorFlow process takes seconds of CPU to start)."""

    def __init__(self):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
        env.pop("PYTHONPATH", None)
        self.stderr = tempfile.TemporaryFile()
        # An empty working directory: nothing importable from where it runs.
        self.cwd = tempfile.TemporaryDirectory()
        self.process = subprocess.Popen(
            [sys.executable, "-c", _LOAD_IN_FRESH_PROCESS],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            cwd=self.cwd.name,
            env=env,
        )

    def load_and_predict(self, model_path, x_path, out_path) -> dict:
        """Sends one request and returns the answer; fails the test with the
        process's stderr if it ended or did not answer in time."""
        request = {"model": str(model_path), "x": str(x_path), "out": str(out_path)}
        line = ""
        if self.process.poll() is None:
            try:
                self.process.stdin.write(json.dumps(request) + "\n")
                self.process.stdin.flush()
            except BrokenPipeError:
                pass
            else:
                ready, _, _ = select.select(
                    [self.process.stdout], [], [], FRESH_PROCESS_TIMEOUT_S
                )
                line = self.process.stdout.readline() if ready else ""
        if not line:
            self.close()
            self.stderr.seek(0)
            error = self.stderr.read().decode(errors="replace")[-3000:]
            pytest.fail(
                "the fresh process ended, or gave no answer in "
                f"{FRESH_PROCESS_TIMEOUT_S} s; its stderr:\n{error}"
            )
        return json.loads(line)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.process.stdin.close()
        self.process.stdout.close()


@pytest.fixture(scope="module")
def fresh_process():
    process = FreshProcess()
    try:
        yield process
    finally:
        process.close()
        process.stderr.close()
        process.cwd.cleanup()


@pytest.mark.xdist_group("fresh_process")
def test_save_and_load_in_fresh_process(
    strategy_factory, digits_small, tmp_path, fresh_process
):
    """9. A `.keras` file saved under the strategy loads without keras_psdist."""
    x, y = digits_small
    strategy = strategy_factory()
    with strategy.scope():
        model = mlp(hidden=(32,))
        model.compile(
            optimizer=keras.optimizers.Adam(3e-3),
            loss=sparse_ce(),
            metrics=["accuracy"],
        )
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    inputs = x[:50]
    expected = model.predict(inputs, verbose=0)
    model_path = tmp_path / "m.keras"
    model.save(model_path)
    np.save(tmp_path / "x.npy", inputs)

    report = fresh_process.load_and_predict(
        model_path, tmp_path / "x.npy", tmp_path / "pred.npy"
    )
    assert report == {"keras_psdist_loaded": False}, report.get("error", report)
    np.testing.assert_allclose(np.load(tmp_path / "pred.npy"), expected, atol=1e-6)


class Interrupted(Exception):
    pass


class InterruptAtEpoch(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch
        self.weights_at_interrupt = None

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            self.weights_at_interrupt = get_weights(self.model)
            raise Interrupted(f"simulated interruption at epoch {epoch}")


class RecordFirstEpoch(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.first_epoch = None
        self.weights_at_first_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        if self.first_epoch is None:
            self.first_epoch = epoch
            self.weights_at_first_epoch = get_weights(self.model)


def test_model_checkpoint_and_backup_and_restore(
    strategy_factory, digits_small, tmp_path
):
    """10. ModelCheckpoint(save_weights_only) and BackupAndRestore resume."""
    x, y = digits_small
    strategy = strategy_factory()

    def build_and_compile(seed):
        with strategy.scope():
            model = mlp(hidden=(32,), seed=seed)
            model.compile(optimizer=keras.optimizers.Adam(3e-3), loss=sparse_ce())
        return model

    # ModelCheckpoint: the file holds the final weights and loads under scope.
    weights_path = tmp_path / "w.weights.h5"
    model = build_and_compile(seed=0)
    checkpoint = keras.callbacks.ModelCheckpoint(
        filepath=str(weights_path), save_weights_only=True
    )
    model.fit(x, y, batch_size=64, epochs=2, verbose=0, callbacks=[checkpoint])
    assert weights_path.is_file()
    restored = build_and_compile(seed=1)
    assert_weights_differ(get_weights(restored), get_weights(model))
    restored.load_weights(weights_path)
    assert_weights_close(get_weights(restored), get_weights(model), rtol=0, atol=0)
    np.testing.assert_allclose(
        restored.predict(x[:64], verbose=0), model.predict(x[:64], verbose=0)
    )

    # BackupAndRestore: interrupted at the start of epoch 2, a fresh model
    # resumes from epoch 2 with the weights saved after epoch 1.
    backup_dir = tmp_path / "backup"
    epochs = 4
    model = build_and_compile(seed=0)
    interrupt = InterruptAtEpoch(2)
    with pytest.raises(Interrupted):
        model.fit(
            x,
            y,
            batch_size=64,
            epochs=epochs,
            verbose=0,
            callbacks=[keras.callbacks.BackupAndRestore(str(backup_dir)), interrupt],
        )
    assert backup_dir.is_dir() and any(backup_dir.iterdir())

    resumed = build_and_compile(seed=1)
    recorder = RecordFirstEpoch()
    history = resumed.fit(
        x,
        y,
        batch_size=64,
        epochs=epochs,
        verbose=0,
        callbacks=[keras.callbacks.BackupAndRestore(str(backup_dir)), recorder],
    )
    assert recorder.first_epoch == 2
    assert history.epoch == [2, 3]
    assert len(history.history["loss"]) < epochs
    assert_weights_close(
        recorder.weights_at_first_epoch,
        interrupt.weights_at_interrupt,
        rtol=0,
        atol=0,
    )


def test_sgd_matches_single_device(strategy_factory, digits_small):
    """11. 5 SGD steps with 2 replicas == 5 steps on one device."""
    x, y = digits_small
    x, y = x[:320], y[:320]

    def build():
        return mlp(hidden=(32,))

    model, optimizer, initial = model_under_strategy(
        strategy_factory, build, lambda: keras.optimizers.SGD(0.1)
    )
    model.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)
    assert int(optimizer.iterations.numpy()) == 5

    expected, _ = single_device_reference(
        build, initial, keras.optimizers.SGD(0.1), x, y, batch_size=64
    )
    assert_weights_differ(initial, expected)
    assert_weights_close(get_weights(model), expected, rtol=1e-5, atol=1e-6)


def test_embedding_sparse_gradients(strategy_factory):
    """12. Embedding (IndexedSlices gradients) matches a single-device run."""
    rng = np.random.default_rng(0)
    vocab, used = 1000, 500
    x = rng.integers(0, used, size=(256, 10)).astype(np.int32)
    y = rng.integers(0, 4, size=(256,)).astype(np.int32)

    def build():
        keras.utils.set_random_seed(0)
        return keras.Sequential(
            [
                keras.Input((10,), dtype="int32"),
                keras.layers.Embedding(vocab, 8),
                keras.layers.GlobalAveragePooling1D(),
                keras.layers.Dense(4),
            ]
        )

    model, _, initial = model_under_strategy(
        strategy_factory, build, lambda: keras.optimizers.SGD(0.5)
    )
    history = model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    assert history.history["loss"][-1] < history.history["loss"][0]

    table = model.layers[0].embeddings.numpy()
    # Rows no sample uses get no gradient at all.
    np.testing.assert_array_equal(table[used:], initial[0][used:])
    assert not np.allclose(table[:used], initial[0][:used])

    expected, _ = single_device_reference(
        build, initial, keras.optimizers.SGD(0.5), x, y, batch_size=64, epochs=2
    )
    assert_weights_close(get_weights(model), expected, rtol=1e-5, atol=1e-6)


FIT_ARGUMENTS = {
    "class_weight": lambda x, y: {"class_weight": {c: 1.0 + c / 3 for c in range(10)}},
    "sample_weight": lambda x, y: {
        "sample_weight": np.linspace(0.2, 2.0, len(x)).astype(np.float32)
    },
    "steps_per_execution": lambda x, y: {},
    "run_eagerly": lambda x, y: {},
    "initial_epoch_and_validation_freq": lambda x, y: {
        "epochs": 3,
        "initial_epoch": 1,
        "validation_data": (x[:128], y[:128]),
        "validation_freq": 2,
    },
}
COMPILE_ARGUMENTS = {
    "steps_per_execution": {"steps_per_execution": 3},
    "run_eagerly": {"run_eagerly": True},
}


@pytest.mark.parametrize("argument", sorted(FIT_ARGUMENTS))
def test_fit_arguments_match_single_device(
    strategy_factory, request, digits_small, argument
):
    """13. Keras's compile/fit arguments train as on one device: the weights,
    the step counter, the epochs run and the validation logs."""
    if argument == "steps_per_execution":
        xfail_if_mirrored(
            request,
            strategy_factory,
            "steps_per_execution with a last, shorter execution feeds no value "
            "to a placeholder of the multi-step loop",
        )
    x, y = digits_small
    x, y = x[:256], y[:256]
    fit_kwargs = {"epochs": 1, **FIT_ARGUMENTS[argument](x, y)}
    compile_kwargs = COMPILE_ARGUMENTS.get(argument, {})

    def build():
        return mlp(hidden=(16,))

    initial = get_weights(build())
    with strategy_factory().scope():
        model = build()
        model.set_weights(initial)
        model.compile(keras.optimizers.SGD(0.1), sparse_ce(), **compile_kwargs)
    history = model.fit(x, y, batch_size=64, shuffle=False, verbose=0, **fit_kwargs)

    reference = build()
    reference.set_weights(initial)
    reference.compile(keras.optimizers.SGD(0.1), sparse_ce(), **compile_kwargs)
    expected = reference.fit(
        x, y, batch_size=64, shuffle=False, verbose=0, **fit_kwargs
    )
    assert history.epoch == expected.epoch
    assert sorted(history.history) == sorted(expected.history)
    for key, values in expected.history.items():
        np.testing.assert_allclose(history.history[key], values, rtol=1e-4, err_msg=key)
    assert int(model.optimizer.iterations.numpy()) == int(
        reference.optimizer.iterations.numpy()
    )
    assert_weights_differ(initial, get_weights(reference))
    assert_weights_close(
        get_weights(model), get_weights(reference), rtol=1e-4, atol=1e-5
    )


def test_callbacks_read_the_weights_of_each_step(strategy_factory, digits_small):
    """14. A callback reading the weights (get_weights, a variable's numpy,
    EarlyStopping's restore_best_weights) sees each step's update."""
    x, y = digits_small
    with strategy_factory().scope():
        model = mlp(hidden=(16,))
        model.compile(keras.optimizers.SGD(0.1), sparse_ce())

    class ReadWeights(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.sums = []

        def on_train_batch_end(self, batch, logs=None):
            kernel = self.model.layers[0].kernel.numpy()
            np.testing.assert_array_equal(kernel, self.model.get_weights()[0])
            self.sums.append(float(kernel.sum()))

    reader = ReadWeights()
    stopping = keras.callbacks.EarlyStopping(
        monitor="loss", patience=1, restore_best_weights=True
    )
    model.fit(x, y, batch_size=64, epochs=2, verbose=0, callbacks=[reader, stopping])
    assert len(reader.sums) == 2 * len(x) // 64
    assert len(set(reader.sums)) == len(reader.sums)  # every step moved them


def test_custom_loop_apply_gradients_in_run_matches_single_device(
    strategy_factory, digits_small
):
    """15. A custom loop that calls `optimizer.apply_gradients` inside
    `strategy.run`, with each replica's loss scaled by the global batch size
    (`tf.nn.compute_average_loss`): the replicas' gradients are summed, so
    the update equals one device's on the whole batch."""
    x, y = digits_small
    x, y = x[:128], y[:128].astype(np.int32)
    initial = get_weights(mlp(hidden=(16,)))
    strategy = strategy_factory()
    with strategy.scope():
        model = mlp(hidden=(16,))
        model.set_weights(initial)
        optimizer = keras.optimizers.SGD(0.1)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=None
    )
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(64)
    )

    @tf.function
    def step(batch):
        def replica_step(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(
                    loss_fn(yb, model(xb, training=True)), global_batch_size=64
                )
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(
                zip(grads, model.trainable_variables, strict=True)
            )

        strategy.run(replica_step, args=batch)

    for batch in dataset:
        step(batch)

    reference = mlp(hidden=(16,))
    reference.set_weights(initial)
    reference_optimizer = keras.optimizers.SGD(0.1)
    for start in (0, 64):
        xb, yb = x[start : start + 64], y[start : start + 64]
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(yb, reference(xb, training=True)))
        grads = tape.gradient(loss, reference.trainable_variables)
        reference_optimizer.apply_gradients(
            zip(grads, reference.trainable_variables, strict=True)
        )
    assert int(optimizer.iterations.numpy()) == 2
    assert_weights_differ(initial, get_weights(reference))
    assert_weights_close(
        get_weights(model), get_weights(reference), rtol=1e-4, atol=1e-5
    )
