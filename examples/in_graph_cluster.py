"""PSStrategy on an in-graph cluster: one client, 2 worker and 2 ps tasks.

    keras-psdist launch --num-ps 2 --num-workers 2 -- python examples/in_graph_cluster.py

`keras-psdist launch` starts a TensorFlow server for every ps and worker task
on this machine and runs this script once, as the chief, with the cluster in
`TF_CONFIG`. `kpd.PSStrategy()` takes the cluster from there: the replicas
are the worker tasks' CPUs (or GPUs), the variables and optimizer slots live
on the ps tasks, and every step is synchronous, so the run equals a
one-process run with as many replicas. `model.fit`, `evaluate` and `predict`
are the same calls as on one host. The script prints where every variable
lives and the test loss and accuracy; it exits with status 1 if the
accuracy is not well above chance (0.1), or if a variable is not on a ps
task. Started without `TF_CONFIG`, it says how to start it and exits with
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
    """Trains, evaluates and predicts on the cluster; returns the exit status."""
    args = parse_args()
    if "TF_CONFIG" not in os.environ:
        print(
            "error: no cluster in TF_CONFIG. Start this script with\n"
            "  keras-psdist launch --num-ps 2 --num-workers 2 -- "
            "python examples/in_graph_cluster.py",
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

    strategy = kpd.PSStrategy()  # in-graph: the cluster comes from TF_CONFIG
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
    # Each worker task reads the arrays and keeps its replicas' share of
    # every batch; no batch passes through this client.
    model.fit(
        x_train, y_train, batch_size=args.batch_size, epochs=args.epochs, verbose=2
    )
    placement = strategy.extended.placement
    print(placement)

    loss, accuracy = model.evaluate(x_test, y_test, batch_size=256, verbose=0)
    logits = model.predict(x_test, batch_size=256, verbose=0)
    predicted = float(np.mean(np.argmax(logits, axis=1) == y_test))
    print(f"test loss {loss:.4f}, test accuracy {accuracy:.3f}")
    print(f"accuracy of predict's {len(logits)} rows: {predicted:.3f}")

    not_on_ps = [p.name for p in placement.variables if "/job:ps/" not in p.device]
    if not_on_ps:
        print(f"error: variables not on a ps task: {not_on_ps}", file=sys.stderr)
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
