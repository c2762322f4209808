"""The MLP several benchmarks train, its synthetic data, and a timed `fit`.

`strategies.py`'s workload, shared with `graph_ops.py`, `profile_step.py`,
`step_ablations.py`, `step_time_rules.py`, `cluster.py`, `scaling.py` and
tf_keras's baseline (`tf_keras_ps`): an MLP 64 -> 512 -> 512 -> 2 (relu,
relu, logits), Adam, sparse categorical cross-entropy from logits, on a
noisy linear rule of NumPy-made inputs (nothing is downloaded);
`make_strategy` builds the strategies `strategies.py` compares; `timed_fit`
times one `fit` epoch, in-loop steps apart from `fit`'s own setup.

Imports TensorFlow (after `prepare_tensorflow`).
"""

from __future__ import annotations

import time

from .checkout import ensure_importable, prepare_tensorflow

# Before TensorFlow is imported anywhere in this process.
prepare_tensorflow()
ensure_importable()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

STRATEGIES = ("default", "mirrored", "central_storage", "ps", "default_xla", "ps_xla")
# The default run leaves the XLA cases out (`--strategies` names them).
DEFAULT_STRATEGIES = ("default", "mirrored", "central_storage", "ps")
LABELS = {
    "default": "default (1 device)",
    "mirrored": "MirroredStrategy",
    "central_storage": "CentralStorageStrategy",
    "ps": "PSStrategy",
    "default_xla": "default (1 device), jit_compile=True",
    "ps_xla": "PSStrategy, jit_compile=True",
}
INPUT_DIM = 64
HIDDEN = 512
NUM_CLASSES = 2
NUM_SAMPLES = 8192


def make_strategy(name: str, devices: list[str]) -> tf.distribute.Strategy:
    """The strategy `name` over `devices` (one replica each)."""
    if name in ("default", "default_xla"):
        return tf.distribute.get_strategy()
    if name == "mirrored":
        return tf.distribute.MirroredStrategy(devices)
    if name == "central_storage":
        return tf.distribute.experimental.CentralStorageStrategy(devices)
    if name in ("ps", "ps_xla"):
        import keras_psdist

        return keras_psdist.PSStrategy(devices=devices)
    raise ValueError(f"Unknown strategy {name!r}. Expected one of {STRATEGIES}.")


def build_model(
    strategy: tf.distribute.Strategy,
    seed: int,
    hidden: int = HIDDEN,
    num_classes: int = NUM_CLASSES,
    library=keras,
    jit_compile: bool = False,
    steps_per_execution: int = 1,
    legacy_optimizer: bool = False,
    depth: int = 2,
) -> keras.Model:
    """The benchmark MLP, built and compiled under `strategy.scope()`.

    The seed is reset first, so every strategy starts from the same weights.
    `library` is `keras`, or `tf_keras` for TensorFlow's own
    ParameterServerStrategy (`cluster.py`'s baseline). `jit_compile` is
    passed to `compile` when set (Keras's own default otherwise), and so is
    `steps_per_execution` when above 1. `legacy_optimizer` takes Adam from
    `library.optimizers.legacy` (tf_keras only: Keras 3's raises), which TensorFlow's
    parameter-server tutorial advises for `ParameterServerStrategy`. `depth`
    is the number of hidden layers (2: 6 variables; each more adds a kernel
    and a bias).
    """
    compile_kwargs = {"jit_compile": True} if jit_compile else {}
    if steps_per_execution > 1:
        compile_kwargs["steps_per_execution"] = steps_per_execution
    optimizers = library.optimizers.legacy if legacy_optimizer else library.optimizers
    library.utils.set_random_seed(seed)
    with strategy.scope():
        model = library.Sequential(
            [
                library.Input(shape=(INPUT_DIM,)),
                *(
                    library.layers.Dense(hidden, activation="relu")
                    for _ in range(depth)
                ),
                library.layers.Dense(num_classes),
            ]
        )
        model.compile(
            optimizer=optimizers.Adam(learning_rate=1e-3),
            loss=library.losses.SparseCategoricalCrossentropy(from_logits=True),
            **compile_kwargs,
        )
    return model


def make_arrays(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`n` examples of synthetic data: a noisy linear rule, NumPy-made."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, INPUT_DIM)).astype(np.float32)
    w = rng.standard_normal(INPUT_DIM).astype(np.float32)
    noise = 0.5 * rng.standard_normal(n).astype(np.float32)
    y = (x @ w + noise > 0).astype(np.int32)
    return x, y


def make_dataset(
    batch: int,
    seed: int,
    autotune: bool = True,
    drop_remainder: bool = True,
    prefetch: bool = True,
) -> tf.data.Dataset:
    """Endless batches of `make_arrays` data. `autotune=False` turns tf.data's
    autotuning off: on this machine it puts whole `fit` calls, on one device
    and under every strategy alike, into a slow mode (6 ms steps became
    12.7 ms in 4 of 15 fits of 100 steps; none with it off), noise that
    swamps the ratios. `drop_remainder=False` leaves the batch size unknown
    when tracing; `prefetch=False` leaves out the prefetch (the profile's
    runs had none)."""
    x, y = make_arrays(NUM_SAMPLES, seed)
    dataset = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .repeat()
        .batch(batch, drop_remainder=drop_remainder)
    )
    if prefetch:
        dataset = dataset.prefetch(tf.data.AUTOTUNE)
    if not autotune:
        options = tf.data.Options()
        options.autotune.enabled = False
        dataset = dataset.with_options(options)
    return dataset


class _StepClock(keras.callbacks.Callback):
    """Timestamps of each step's start and of the epoch's end.

    Only `on_train_batch_begin` / `on_epoch_end` are hooked, so Keras keeps
    its asynchronous batch-end dispatch and logs are not pulled to NumPy.
    """

    def __init__(self):
        super().__init__()
        self.begins: list[float] = []
        self.end: float | None = None

    def on_train_batch_begin(self, batch, logs=None):
        self.begins.append(time.perf_counter())

    def on_epoch_end(self, epoch, logs=None):
        self.end = time.perf_counter()


def timed_fit(model: keras.Model, dataset: tf.data.Dataset, steps: int) -> dict:
    """Runs one timed `fit` epoch of `steps` steps.

    Returns a dict: `fit_ms` (fit wall time / steps), `loop_ms` (training loop
    from the 2nd step to the epoch end / (steps - 1)), `setup_s` (fit start to
    the 1st step), `first_step_ms`, `teardown_s` (epoch end to fit return) and
    the last `loss`.
    """
    clock = _StepClock()
    start = time.perf_counter()
    history = model.fit(
        dataset,
        epochs=1,
        steps_per_epoch=steps,
        verbose=0,
        shuffle=False,
        callbacks=[clock],
    )
    stop = time.perf_counter()
    fit_ms = 1e3 * (stop - start) / steps
    begins, end = clock.begins, clock.end
    out = {
        "fit_ms": fit_ms,
        "loop_ms": fit_ms,
        "setup_s": None,
        "first_step_ms": None,
        "teardown_s": None,
        "loss": float(history.history.get("loss", [float("nan")])[-1]),
    }
    if begins and end is not None:
        out["setup_s"] = begins[0] - start
        out["teardown_s"] = stop - end
        if len(begins) >= 2:
            out["first_step_ms"] = 1e3 * (begins[1] - begins[0])
            out["loop_ms"] = 1e3 * (end - begins[1]) / (len(begins) - 1)
    return out
