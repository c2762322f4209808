"""Byzantine-tolerant training on one host: a robust rule against the mean.

    python examples/byzantine.py

Splits the CPU into 8 logical devices, one replica each (also on a GPU
machine: the simulation needs 8 replicas, not 8 GPUs), and makes 2 of the
replicas attackers: every training step they send their gradient flipped
and scaled by 10 (`kpd.attacks.SignFlip`). The same model is trained twice
on scikit-learn's bundled digits:

- with a robust aggregator (`--aggregator`, default `centered_clipping`)
  and `num_byzantine=2`: training goes on as without the attack;
- with `aggregator="mean"`, the plain average of the replicas' gradients:
  the two attackers outweigh the six honest replicas and the model
  collapses (keras_psdist warns that this run has more attackers than
  `num_byzantine=0`: here that is the point).

It prints both test accuracies and exits with status 1 if the robust run is
not well above chance (0.1) or the undefended run is not clearly worse.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import tensorflow as tf  # noqa: E402

REPLICAS = 8

# Before anything initialises TensorFlow's runtime: the split is fixed then.
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * REPLICAS,
)

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import keras_psdist as kpd  # noqa: E402

ATTACKERS = [6, 7]
MIN_ACCURACY = 0.5
# Accuracy points by which the undefended run must fall below the robust one.
MIN_GAP = 0.2


def parse_args() -> argparse.Namespace:
    """The command-line flags."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5, help="Training epochs.")
    parser.add_argument("--batch-size", type=int, default=64, help="Global batch.")
    parser.add_argument(
        "--aggregator",
        default="centered_clipping",
        choices=[n for n in kpd.aggregators.names() if n != "mean"],
        help="The robust rule, a keras_psdist.aggregators id (its condition on "
        "8 replicas and num_byzantine=2 is checked: bulyan needs 11 replicas).",
    )
    parser.add_argument("--seed", type=int, default=0, help="Random seed.")
    return parser.parse_args()


def train(
    aggregator: str, num_byzantine: int, data: tuple, args: argparse.Namespace
) -> float | None:
    """Trains under attack with `aggregator`.

    Returns:
        The test accuracy, or `None` if the weights are no longer finite.
    """
    x_train, y_train, x_test, y_test = data
    strategy = kpd.PSStrategy(
        devices=[d.name for d in tf.config.list_logical_devices("CPU")],
        aggregator=aggregator,
        num_byzantine=num_byzantine,
        attack=kpd.attacks.SignFlip(replicas=ATTACKERS, scale=10.0),
    )
    with strategy.scope():
        keras.utils.set_random_seed(args.seed)
        model = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    print(f"--- {strategy.extended.aggregator!r} against {strategy.extended.attack!r}")
    history = model.fit(
        x_train, y_train, batch_size=args.batch_size, epochs=args.epochs, verbose=2
    )
    if not all(np.isfinite(w).all() for w in model.get_weights()):
        print(f"{aggregator}: diverged, the weights are no longer finite")
        return None
    loss, accuracy = model.evaluate(x_test, y_test, batch_size=256, verbose=0)
    print(
        f"{aggregator}: final training loss {history.history['loss'][-1]:.4f}, "
        f"test loss {loss:.4f}, test accuracy {accuracy:.3f}"
    )
    return float(accuracy)


def _shown(accuracy: float | None) -> str:
    return "diverged" if accuracy is None else f"{accuracy:.3f}"


def main() -> int:
    """Trains with the robust rule, then the mean; returns the exit status."""
    args = parse_args()
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        (x / 16.0).astype(np.float32),
        y.astype(np.int32),
        test_size=0.2,
        random_state=0,
        stratify=y,
    )
    data = (x_train, y_train, x_test, y_test)
    try:
        robust = train(args.aggregator, len(ATTACKERS), data, args)
    except ValueError as e:  # a rule that cannot tolerate 2 of 8 replicas
        print(f"error: {e}", file=sys.stderr)
        return 2
    mean = train("mean", 0, data, args)
    print(
        f"replicas {ATTACKERS} send -10 x their gradient; test accuracy: "
        f"{args.aggregator} {_shown(robust)}, mean {_shown(mean)}"
    )
    if robust is None or robust < MIN_ACCURACY:
        print(
            f"error: {args.aggregator} reached {_shown(robust)}, expected at "
            f"least {MIN_ACCURACY} (chance is 0.1)",
            file=sys.stderr,
        )
        return 1
    if mean is not None and mean > robust - MIN_GAP:
        print(
            f"error: the undefended mean ({mean:.3f}) is not clearly worse than "
            f"{args.aggregator} ({robust:.3f}): the attack did not bite",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
