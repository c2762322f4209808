"""Every compressor with every rule and pre-aggregation, one small run each.

The combination matrix of `tests/test_combinations.py` and
`benchmarks/combinations.py` (which writes the table in docs/compression.md
and its JSON): a cell is a compressor (or none), an aggregator id (a rule,
or a pre-aggregation around its default rule) and an attack (none, or one
replica sending -10 times its gradient), trained on scikit-learn's digits
across `NUM_REPLICAS` logical CPU replicas with `num_byzantine=1`. A cell
either trains, its held-out accuracy compared with the same rule
uncompressed, or is refused when the strategy is built, with the error's
message. The axes come from the registries (`keras_psdist.families`), so a
new rule or compressor joins the matrix by being registered.

Not imported by the library.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import keras_psdist as kpd
from keras_psdist import families

NUM_REPLICAS = 7  # the fewest replicas every rule runs on with f = 1 (Bulyan: 4f + 3)
NUM_BYZANTINE = 1
ATTACKED = (NUM_REPLICAS - 1,)
TOLERANCE = 0.03  # a cell trains if it loses at most 3 points to its rule uncompressed
CHANCE = 0.1  # ten classes

COMPRESSORS = families.COMPRESSORS.names()
# The sparsifiers send 10 % of the coordinates in the matrix, not their
# default 1 %: at 1 %, 88 steps send each coordinate less than once and
# every rule, the mean too, is still near its start (random-k: 45 % against
# 91 %); the matrix looks for pairs that do not work, not for how fast a
# compressor is.
SETTINGS = {"top_k": "top_k(ratio=0.1)", "random_k": "random_k(ratio=0.1)"}
CONFIGURATIONS = families.AGGREGATORS.names()
ATTACKS = ("none", "scale_-10")
# A rule of each kind: the mean, coordinate-wise, selection, whole-vector
# averages (one with state), a pre-aggregation.
KINDS_OF_RULES = (
    "mean",
    "median",
    "krum",
    "geometric_median",
    "centered_clipping",
    "nnm",
)

# The axes that multiply, each a `run_cell` set-up: label -> its arguments.
EXTRA_AXES: dict[str, dict[str, Any]] = {
    "partitioned": {
        "strategy_kwargs": {
            "parameter_devices": ["/device:CPU:0", "/device:CPU:7"],
            "partitioner": {"class_name": "fixed", "config": {"num_shards": 2}},
        }
    },
    "dense='all_reduce'": {"strategy_kwargs": {"dense": "all_reduce"}},
    "jit_compile=True": {"jit_compile": True},
    "mixed_float16": {"dtype_policy": "mixed_float16"},
}

# Small enough to run every cell in a few seconds: digits, an MLP, SGD.
EPOCHS = 8
BATCH = 16 * NUM_REPLICAS
LEARNING_RATE = 0.3


@dataclasses.dataclass
class Cell:
    """One run: its axes, and its held-out accuracy or the refusal."""

    compressor: str
    configuration: str
    attack: str
    extra: str = ""
    accuracy: float | None = None
    refused: str | None = None
    seconds: float = 0.0
    losses: list[float] = dataclasses.field(default_factory=list)  # per epoch
    # Across workers: the sends this worker compressed (`WireCompression.steps`).
    compression_steps: int | None = None

    @property
    def key(self) -> str:
        parts = [self.compressor, self.configuration, self.attack]
        return " / ".join([*parts, self.extra] if self.extra else parts)


def digits(seed: int = 0):
    """`(x_train, y_train, x_test, y_test)`: digits in [0, 1], 80/20."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(x))
    x = (x[order] / 16.0).astype(np.float32)
    y = y[order].astype(np.int32)
    split = int(0.8 * len(x))
    return x[:split], y[:split], x[split:], y[split:]


def strategy_arguments(
    compressor: str, configuration: str, attack: str, devices: list[str]
) -> dict[str, Any]:
    """The `PSStrategy` arguments of a cell."""
    return {
        "devices": devices[:NUM_REPLICAS],
        "aggregator": configuration,
        "num_byzantine": 0 if configuration == "mean" else NUM_BYZANTINE,
        "compression": (
            None if compressor == "none" else SETTINGS.get(compressor, compressor)
        ),
        "attack": (
            None
            if attack == "none"
            else kpd.attacks.Scale(replicas=list(ATTACKED), factor=-10.0)
        ),
    }


def run_cell(
    compressor: str,
    configuration: str,
    attack: str,
    *,
    data=None,
    extra: str = "",
    strategy_kwargs: dict[str, Any] | None = None,
    jit_compile: bool = False,
    dtype_policy: str | None = None,
) -> Cell:
    """Trains one cell (see the module doc); a refusal at construction is
    recorded, any other error raised.

    Args:
        compressor, configuration, attack: The cell's axes.
        data: `digits()`, to share across cells.
        extra: A label for another axis (partitioned, hybrid, XLA, mixed
            precision), with `strategy_kwargs`, `jit_compile` and
            `dtype_policy` to set it up.
    """
    cell = Cell(compressor, configuration, attack, extra)
    x_train, y_train, x_test, y_test = data if data is not None else digits()
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    arguments = {
        **strategy_arguments(compressor, configuration, attack, devices),
        **(strategy_kwargs or {}),
    }
    start = time.perf_counter()
    try:
        strategy = kpd.PSStrategy(**arguments)
    except ValueError as e:
        cell.refused = str(e)
        cell.seconds = time.perf_counter() - start
        return cell
    previous_policy = keras.config.dtype_policy()
    if dtype_policy is not None:
        keras.config.set_dtype_policy(dtype_policy)
    try:
        model = build_model(strategy, jit_compile=jit_compile)
        train_and_score(cell, model, (x_train, y_train, x_test, y_test))
    finally:
        keras.config.set_dtype_policy(previous_policy)
    cell.seconds = time.perf_counter() - start
    return cell


# Across worker processes (`keras-psdist launch --mode between-graph`):
# `"sync"`, `SyncReplicaStrategy` (each worker one replica, the rule on the
# chief, the attack on the last worker); `"elastic sync"`, the same with
# `max_workers` (the counts follow the workers); `"async"`,
# `PSStrategy(mode="between-graph")` (each worker applies its own
# compressed gradient: no rule across workers, no attack).
WORKER_MODES = ("sync", "elastic sync", "async")
# The matrix across 5 workers (`benchmarks/combinations.py
# --across-workers`, `nox -s slow`): every compressor with a rule of each
# kind under sync, the last worker attacked; every compressor async.
ACROSS_WORKERS_CELLS = [
    ("sync", compressor, configuration, "scale_-10")
    for configuration in KINDS_OF_RULES
    for compressor in COMPRESSORS
] + [("async", compressor, "mean", "none") for compressor in COMPRESSORS]


def run_cell_on_this_worker(
    mode: str, compressor: str, configuration: str, attack: str, data=None
) -> Cell:
    """Trains one cell as this worker process of a between-graph cluster
    (TF_CONFIG): every worker calls it with the same cell, each fitting
    `data`'s training part in its own order, in batches of `BATCH` divided
    among the workers. A refusal when the strategy is built is recorded, as
    `run_cell`'s; the cell's `extra` is `mode`."""
    from keras_psdist.cluster import runtime

    cell = Cell(compressor, configuration, attack, extra=mode)
    data = data if data is not None else digits()
    num_workers = runtime.num_training_tasks(runtime.resolve_config(None))
    arguments = strategy_arguments(compressor, configuration, attack, [])
    del arguments["devices"]
    if attack != "none":
        arguments["attack"] = kpd.attacks.Scale(
            replicas=[num_workers - 1], factor=-10.0
        )
    start = time.perf_counter()
    try:
        if mode in ("sync", "elastic sync"):
            if mode == "elastic sync":
                arguments["max_workers"] = num_workers
            strategy = kpd.SyncReplicaStrategy(**arguments, step_timeout=120)
        elif mode == "async":
            if configuration != "mean" or attack != "none":
                raise ValueError(
                    f"async cells take the mean and no attack, got {configuration!r} "
                    f"and {attack!r}"
                )
            strategy = kpd.PSStrategy(
                mode="between-graph", compression=arguments["compression"]
            )
        else:
            raise ValueError(f"mode={mode!r}: one of {WORKER_MODES}")
    except ValueError as e:
        cell.refused = str(e)
        cell.seconds = time.perf_counter() - start
        return cell
    # Each worker draws its batches from the whole training set in an order
    # of its own (no worker keeps a piece the others never see), as many
    # per epoch as the in-process matrix takes.
    worker = strategy.extended.topology.worker_index
    model = build_model(strategy)
    train_and_score(cell, model, data, batch=max(1, BATCH // num_workers), seed=worker)
    wire = strategy.extended.wire
    cell.compression_steps = None if wire is None else wire.steps
    cell.seconds = time.perf_counter() - start
    return cell


def build_model(strategy, jit_compile: bool = False) -> keras.Model:
    """The matrix's model under `strategy`: a digits MLP with `SGD(0.3)`."""
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(32, activation="relu"),
                keras.layers.Dense(10, dtype="float32"),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(LEARNING_RATE),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=jit_compile,
        )
    return model


def train_and_score(
    cell: Cell, model: keras.Model, data, batch: int = BATCH, seed: int = 0
) -> None:
    """Fits `model` for `EPOCHS` on `data`'s training part, shuffled with
    `seed`, in `len // BATCH` batches of `batch` per epoch, and sets
    `cell.accuracy`, held out."""
    x_train, y_train, x_test, y_test = data
    dataset = (
        tf.data.Dataset.from_tensor_slices((x_train, y_train))
        .shuffle(len(x_train), seed=seed)
        .batch(batch, drop_remainder=True)
        .take(len(x_train) // BATCH)
    )
    history = model.fit(dataset, epochs=EPOCHS, verbose=0)
    cell.losses = [float(x) for x in history.history["loss"]]
    logits = model(x_test, training=False)
    cell.accuracy = float(np.mean(np.argmax(np.asarray(logits), axis=1) == y_test))


def verdict(cell: Cell, reference: Cell) -> str:
    """`cell` against its rule uncompressed (`reference`): `"refused"`;
    `"trains"`, within `TOLERANCE` of it or above; `"slower"`, above halfway
    from chance to it (compression slowed it: error feedback sends every
    coordinate, late); else `"FAILS"` (as `top_k>median` with each replica's
    own coordinates did: 13 % against 91 %)."""
    if cell.refused is not None:
        return "refused"
    if cell.accuracy >= reference.accuracy - TOLERANCE:
        return "trains"
    if cell.accuracy >= (CHANCE + reference.accuracy) / 2:
        return "slower"
    return "FAILS"
