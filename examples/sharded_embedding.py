"""An embedding table split into row shards, one on each ps task.

    keras-psdist launch --num-ps 2 --num-workers 2 -- python examples/sharded_embedding.py

Parameter servers exist for models too large for one device: embedding
tables of millions of rows. `kpd.PSStrategy(partitioner=...)` splits such a
table into shards of consecutive rows and places each on a parameter device,
here the ps tasks of an in-graph cluster (`keras-psdist launch` runs this
script once, as the chief). Lookups gather each row from the shard that owns
it, so only the touched rows travel; the optimizer updates each shard where
it lives; the model code is unchanged, and `model.save` writes whole tables.

The model classifies scikit-learn's bundled digits from sparse ids: each
pixel, its intensity (0..16) and its right neighbour's intensity make one
row id, 64 * 17 * 17 = 18,496 rows of 32 floats (2.4 MB). The partitioner,
`kpd.partitioners.Fixed(num_shards=<number of ps tasks>)`, splits the table
(and its Adam moments) and keeps variables under 256 KiB whole. The script
prints the placement table and the test accuracy, and exits with status 1
if the table is not split over every ps task or the accuracy is not well
above chance (0.1). Started without `TF_CONFIG`, it says how to start it and
exits with status 2.
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import keras_psdist as kpd  # noqa: E402

LEVELS = 17  # digits' pixel intensities are 0..16
MIN_ACCURACY = 0.5


def parse_args() -> argparse.Namespace:
    """The command-line flags."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5, help="Training epochs.")
    parser.add_argument("--batch-size", type=int, default=64, help="Global batch.")
    parser.add_argument("--dim", type=int, default=32, help="Embedding width.")
    parser.add_argument("--seed", type=int, default=0, help="Random seed.")
    return parser.parse_args()


def digits_as_ids() -> tuple[np.ndarray, np.ndarray]:
    """Each digit as 64 row ids: (pixel, its intensity, right neighbour's)."""
    x, y = load_digits(return_X_y=True)
    levels = x.astype(np.int32).reshape(-1, 8, 8)
    right = np.concatenate([levels[:, :, 1:], np.zeros_like(levels[:, :, :1])], 2)
    pixel = np.arange(64, dtype=np.int32).reshape(8, 8)
    ids = (pixel * LEVELS + levels) * LEVELS + right
    return ids.reshape(-1, 64), y.astype(np.int32)


def main() -> int:
    """Trains the sharded model on the cluster; returns the exit status."""
    args = parse_args()
    if "TF_CONFIG" not in os.environ:
        print(
            "error: no cluster in TF_CONFIG. Start this script with\n"
            "  keras-psdist launch --num-ps 2 --num-workers 2 -- "
            "python examples/sharded_embedding.py",
            file=sys.stderr,
        )
        return 2
    num_ps = len(json.loads(os.environ["TF_CONFIG"])["cluster"]["ps"])
    keras.utils.set_random_seed(args.seed)
    ids, y = digits_as_ids()
    x_train, x_test, y_train, y_test = train_test_split(
        ids, y, test_size=0.2, random_state=0, stratify=y
    )

    strategy = kpd.PSStrategy(partitioner=kpd.partitioners.Fixed(num_shards=num_ps))
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((64,), dtype="int32"),
                keras.layers.Embedding(64 * LEVELS * LEVELS, args.dim),
                keras.layers.Flatten(),
                keras.layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.Adam(3e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    history = model.fit(
        x_train, y_train, batch_size=args.batch_size, epochs=args.epochs, verbose=2
    )
    placement = strategy.extended.placement
    print(placement)
    loss, accuracy = model.evaluate(x_test, y_test, batch_size=256, verbose=0)
    print(
        f"final training loss {history.history['loss'][-1]:.4f}, "
        f"test loss {loss:.4f}, test accuracy {accuracy:.3f}"
    )

    table = model.layers[0].embeddings
    shard_devices = {p.device for p in placement.shards_of(table.path)}
    print(f"{table.path} {tuple(table.shape)}: shards on {sorted(shard_devices)}")
    if len(shard_devices) != num_ps:
        print(
            f"error: the table is on {len(shard_devices)} devices, expected one "
            f"shard on each of the {num_ps} ps tasks",
            file=sys.stderr,
        )
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
