"""Asynchronous parameter-server training: every worker runs this script.

    keras-psdist launch --mode between-graph --num-ps 1 --num-workers 2 -- python examples/between_graph_async.py

`keras-psdist launch --mode between-graph` starts a TensorFlow server for the
ps task and runs this script once per worker task, each with its own
`TF_CONFIG`. Under `kpd.PSStrategy(mode="between-graph")` every variable and
optimizer slot is one resource on the ps task, shared by all workers: worker
0 (the chief) creates and initialises them, the others open them by name.
Each worker trains on its piece of every global batch and applies its update
as soon as it has it, without waiting for the others (asynchronous SGD,
with stale reads, as TF1's between-graph training). `optimizer.iterations`
is shared, so it counts every worker's steps.

Each worker prints its final training loss and the shared model's accuracy
on the whole test set (`model.evaluate` would see only this worker's share
of it), and exits with status 1 if that accuracy is not well above chance
(0.1). Started without `TF_CONFIG`, it says how to start it and exits with
status 2.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import keras_psdist as kpd  # noqa: E402

MIN_ACCURACY = 0.5


def parse_args() -> argparse.Namespace:
    """The command-line flags."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5, help="Training epochs.")
    parser.add_argument("--batch-size", type=int, default=64, help="Global batch.")
    parser.add_argument("--seed", type=int, default=0, help="Random seed.")
    return parser.parse_args()


def main() -> int:
    """Trains as one of the workers; returns the exit status."""
    args = parse_args()
    if "TF_CONFIG" not in os.environ:
        print(
            "error: no cluster in TF_CONFIG. Start this script with\n"
            "  keras-psdist launch --mode between-graph --num-ps 1 "
            "--num-workers 2 -- python examples/between_graph_async.py",
            file=sys.stderr,
        )
        return 2
    keras.utils.set_random_seed(args.seed)
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        (x / 16.0).astype(np.float32),
        y.astype(np.int32),
        test_size=0.2,
        random_state=0,
        stratify=y,
    )

    strategy = kpd.PSStrategy(mode="between-graph")
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
    # `batch_size` is the global batch: this worker trains on its piece.
    history = model.fit(
        x_train, y_train, batch_size=args.batch_size, epochs=args.epochs, verbose=2
    )
    role = "chief" if strategy.extended.should_checkpoint else "worker"
    print(f"{role}: variables on {sorted(strategy.extended.parameter_devices)}")

    # The shared weights, read from the ps, scored on the whole test set.
    logits = model(x_test, training=False)
    accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
    steps = int(model.optimizer.iterations.numpy())
    print(
        f"{role}: final training loss {history.history['loss'][-1]:.4f}, "
        f"test accuracy {accuracy:.3f}, {steps} steps of all workers so far"
    )
    if accuracy < MIN_ACCURACY:
        print(
            f"error: test accuracy {accuracy:.3f} < {MIN_ACCURACY} (chance is 0.1)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
