"""PSStrategy on one host: 4 replicas, variables on the host CPU.

    python examples/one_host.py

Trains a small MLP on scikit-learn's bundled digits with `model.fit`, then
runs `model.evaluate` and `model.predict`, all under `kpd.PSStrategy()`. On a
machine without a GPU the CPU is split into 4 logical devices first, so 4
replicas train in one process; on a GPU machine the replicas are the GPUs.
Each variable lives once, on a parameter device, with its optimizer slots
beside it: the script prints the placement table. It exits with status 1 if
the test accuracy is not well above chance (0.1 for 10 classes).
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import tensorflow as tf  # noqa: E402

REPLICAS = 4

# Before anything initialises TensorFlow's runtime: the split is fixed then.
if not tf.config.list_physical_devices("GPU"):
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration()] * REPLICAS,
    )

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
    """Trains, evaluates and predicts on 4 replicas; returns the exit status."""
    args = parse_args()
    keras.utils.set_random_seed(args.seed)
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        (x / 16.0).astype(np.float32),
        y.astype(np.int32),
        test_size=0.2,
        random_state=0,
        stratify=y,
    )

    strategy = kpd.PSStrategy()  # every GPU, else every logical CPU device
    replicas = strategy.extended.worker_devices
    print(f"{len(replicas)} replicas: {', '.join(replicas)}")
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
    model.fit(
        x_train,
        y_train,
        batch_size=args.batch_size,
        epochs=args.epochs,
        validation_split=0.1,
        verbose=2,
    )
    print(strategy.extended.placement)

    loss, accuracy = model.evaluate(x_test, y_test, batch_size=256, verbose=0)
    logits = model.predict(x_test, batch_size=256, verbose=0)
    predicted = float(np.mean(np.argmax(logits, axis=1) == y_test))
    print(f"test loss {loss:.4f}, test accuracy {accuracy:.3f}")
    print(f"accuracy of predict's {len(logits)} rows: {predicted:.3f}")
    if len(logits) != len(x_test) or abs(predicted - accuracy) > 1e-6:
        print("error: predict and evaluate disagree", file=sys.stderr)
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
