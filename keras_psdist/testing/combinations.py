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
        dataset = (
            tf.data.Dataset.from_tensor_slices((x_train, y_train))
            .shuffle(len(x_train), seed=0)
            .batch(BATCH, drop_remainder=True)
        )
        model.fit(dataset, epochs=EPOCHS, verbose=0)
        logits = model(x_test, training=False)
        cell.accuracy = float(np.mean(np.argmax(np.asarray(logits), axis=1) == y_test))
    finally:
        keras.config.set_dtype_policy(previous_policy)
    cell.seconds = time.perf_counter() - start
    return cell


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
