"""Synchronous training across 3 worker processes, one of them a backup.

    keras-psdist launch --mode between-graph --num-ps 1 --num-workers 3 -- python examples/sync_replicas_backup.py

TF1's `SyncReplicasOptimizer` with backup workers, for Keras 3 `model.fit`.
Every worker runs this script; the variables live on the ps task. Each step,
every worker sends its gradient, tagged with the global step it was computed
at; the chief (worker 0) applies an update as soon as
`replicas_to_aggregate=2` fresh gradients have arrived, so the slowest of
the 3 workers is never waited for: its late gradients are dropped as stale,
and counted. To make that visible, the last worker sleeps after each step
(`--straggler-delay`). When the chief's `fit` ends, no update comes after
it: a worker still training stops its `fit` at its next step and says how
many of its steps it did not run.

Each worker prints, per worker, how many gradients were applied and dropped
(`kpd.callbacks.SyncReplicaReport` adds them to every epoch's log line; the
chief's count after `fit` is the run's), its final training loss and the
shared model's accuracy on the whole test set, and exits with status 1 if
no update was applied or the accuracy is not well above chance (0.1).
Started without `TF_CONFIG`, it says how to start it and exits with status 2.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import keras_psdist as kpd  # noqa: E402

MIN_ACCURACY = 0.5


class Straggler(keras.callbacks.Callback):
    """Makes this worker slow: it sleeps after every training step."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.seconds)


def parse_args() -> argparse.Namespace:
    """The command-line flags."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5, help="Training epochs.")
    parser.add_argument("--batch-size", type=int, default=96, help="Global batch.")
    parser.add_argument(
        "--replicas-to-aggregate",
        type=int,
        default=2,
        help="Fresh worker gradients per update; the other workers are backups.",
    )
    parser.add_argument(
        "--straggler-delay",
        type=float,
        default=0.05,
        help="Seconds the last worker sleeps after each step (0: none).",
    )
    parser.add_argument("--seed", type=int, default=0, help="Random seed.")
    return parser.parse_args()


def main() -> int:
    """Trains as one of the workers; returns the exit status."""
    args = parse_args()
    if "TF_CONFIG" not in os.environ:
        print(
            "error: no cluster in TF_CONFIG. Start this script with\n"
            "  keras-psdist launch --mode between-graph --num-ps 1 "
            "--num-workers 3 -- python examples/sync_replicas_backup.py",
            file=sys.stderr,
        )
        return 2
    tf_config = json.loads(os.environ["TF_CONFIG"])
    worker = tf_config["task"]["index"]
    num_workers = len(tf_config["cluster"]["worker"])
    keras.utils.set_random_seed(args.seed)
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        (x / 16.0).astype(np.float32),
        y.astype(np.int32),
        test_size=0.2,
        random_state=0,
        stratify=y,
    )

    strategy = kpd.SyncReplicaStrategy(replicas_to_aggregate=args.replicas_to_aggregate)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(128, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.Adam(3e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    # Adds each epoch's counts (applied, dropped per worker) to its logs.
    callbacks = [kpd.callbacks.SyncReplicaReport()]
    if worker == num_workers - 1 and args.straggler_delay > 0:
        callbacks.append(Straggler(args.straggler_delay))
    # `batch_size` is the global batch: this worker trains on its piece.
    history = model.fit(
        x_train,
        y_train,
        batch_size=args.batch_size,
        epochs=args.epochs,
        verbose=2,
        callbacks=callbacks,
    )

    # The chief's `fit` returns once every worker has left: its counts are
    # the run's; another worker's are those of when its `fit` ended.
    counts = strategy.extended.sync_training.counts()
    so_far = "in all" if strategy.extended.should_checkpoint else "so far"
    print(
        f"worker {worker}: {int(counts['global_step'])} updates of "
        f"{args.replicas_to_aggregate} gradients {so_far}; per worker: "
        f"applied {np.asarray(counts['applied']).tolist()}, "
        f"dropped as stale {np.asarray(counts['dropped_stale']).tolist()}"
    )
    # The shared weights, read from the ps, scored on the whole test set
    # (`model.evaluate` would see only this worker's share of it).
    logits = model(x_test, training=False)
    accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
    print(
        f"worker {worker}: final training loss {history.history['loss'][-1]:.4f}, "
        f"test accuracy {accuracy:.3f}"
    )
    if counts["global_step"] < 1:
        print("error: no update was applied", file=sys.stderr)
        return 1
    if accuracy < MIN_ACCURACY:
        print(
            f"error: test accuracy {accuracy:.3f} < {MIN_ACCURACY} (chance is 0.1)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
