"""The hybrid (`PSStrategy(dense="all_reduce")`) as the chief of an in-graph
cluster: a wide-and-deep model whose dense layers are replicated on the
worker tasks and whose embedding table lives on the ps task.

Run by `tests/test_hybrid.py` under `keras-psdist launch --mode in-graph`;
imported there for the one-process reference run.

    python hybrid_job.py OUT_DIR

writes `OUT_DIR/hybrid.json` (each variable's synchronizer and devices, and
whether every replicated copy is equal) and `OUT_DIR/weights.npz`.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402


def data():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 300, size=(600, 6)).astype(np.int32)
    return x, (x[:, 0] % 3).astype(np.int32)


def build(strategy):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        ids = keras.Input((6,), dtype="int32")
        pooled = keras.layers.GlobalAveragePooling1D()(
            keras.layers.Embedding(300, 8)(ids)
        )
        hidden = keras.layers.Dense(32, activation="relu")(pooled)
        model = keras.Model(ids, keras.layers.Dense(3)(hidden))
        model.compile(
            optimizer=keras.optimizers.Adam(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    return model


def train(model):
    x, y = data()
    # 600 examples in batches of 64: the last batch (24) is partial.
    return model.fit(x, y, batch_size=64, epochs=3, shuffle=False, verbose=2)


def main(out_dir):
    import keras_psdist as kpd
    from keras_psdist.variables.values import ReplicatedVariable

    strategy = kpd.PSStrategy(mode="in-graph", dense="all_reduce")
    model = build(strategy)
    history = train(model)
    copies_equal = all(
        all(
            np.array_equal(c.numpy(), w.value.values[0].numpy()) for c in w.value.values
        )
        for w in model.weights
        if isinstance(w.value, ReplicatedVariable)
    )
    report = {
        "variables": [
            [row.name, row.synchronizer, list(row.devices)]
            for row in strategy.extended.placement.variables
        ],
        "copies_equal": copies_equal,
        "all_reduce": type(strategy.extended.all_reduce_ops).__name__,
        "losses": history.history["loss"],
    }
    with open(os.path.join(out_dir, "hybrid.json"), "w") as f:
        json.dump(report, f)
    np.savez(os.path.join(out_dir, "weights.npz"), *[w.numpy() for w in model.weights])


if __name__ == "__main__":
    main(sys.argv[1])
