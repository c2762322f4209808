"""One worker process of `benchmarks/sync_byzantine.py` (see its docstring).

Run on every worker task by `keras_psdist.cluster.launch(mode="between-graph")`::

    python benchmarks/_sync_byzantine_job.py OUT_DIR CONFIG_JSON

CONFIG_JSON: `aggregator`, `num_byzantine`, `worker_momentum`, `attack` (a
config dict or null), `epochs`, `batch`, `lr`, `momentum`, `seed`. The worker
trains the digits MLP under `SyncReplicaStrategy` and writes
`OUT_DIR/worker_<i>.json`; the chief's holds the held-out accuracy.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

TRAIN_EXAMPLES = 1500  # of digits' 1,797; the rest is held out


def main(out_dir: str, config: dict) -> int:
    import keras
    import numpy as np
    from sklearn.datasets import load_digits

    import keras_psdist as kpd

    strategy = kpd.SyncReplicaStrategy(
        aggregator=config["aggregator"],
        num_byzantine=config["num_byzantine"],
        attack=config["attack"],
        worker_momentum=config["worker_momentum"],
        step_timeout=120,
    )
    worker = strategy.extended.topology.worker_index
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int32)
    order = np.random.default_rng(config["seed"]).permutation(len(x))
    x, y = x[order], y[order]
    lr, momentum = config["lr"], config["momentum"]
    if config["worker_momentum"]:
        # The steps of SGD(lr, momentum) with the momentum in the workers.
        lr, momentum = lr / (1 - config["worker_momentum"]), 0.0
    keras.utils.set_random_seed(config["seed"])
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(lr, momentum=momentum),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    # Each worker draws its own shuffle of the same training examples.
    mine = np.random.default_rng(config["seed"] + 1 + worker).permutation(
        TRAIN_EXAMPLES
    )
    model.fit(
        x[mine],
        y[mine],
        batch_size=config["batch"],
        epochs=config["epochs"],
        shuffle=False,
        verbose=0,
    )
    logits = model(x[TRAIN_EXAMPLES:], training=False).numpy()
    accuracy = float(np.mean(np.argmax(logits, axis=-1) == y[TRAIN_EXAMPLES:]))
    report = {
        "worker": worker,
        "is_chief": bool(strategy.extended.should_checkpoint),
        "accuracy": accuracy,
        "finite": bool(all(np.isfinite(w).all() for w in model.get_weights())),
    }
    with open(os.path.join(out_dir, f"worker_{worker}.json"), "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], json.loads(sys.argv[2])))
