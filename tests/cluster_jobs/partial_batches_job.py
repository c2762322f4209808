"""The layer zoo (`layer_zoo.py`) on partial batches, between-graph.

Run by tests/test_cluster_training.py under `keras-psdist launch --mode
between-graph` with 2 workers:

    python partial_batches_job.py OUT_DIR async,sync

(one run per kind, in that order, each with its own strategy.)

Every global batch of `layer_zoo.partial_batches(2)` is cut into one piece per
worker; the batch of one example leaves worker 1 nothing, and it skips that
step rather than run the model on an empty batch. Each worker writes
`OUT_DIR/<kind>_worker_<i>.json` per run: the examples it trained on per epoch, its steps per
epoch, and whether its weights are finite.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layer_zoo  # noqa: E402

EPOCHS = 2


def main(out_dir, kinds):
    os.makedirs(out_dir, exist_ok=True)
    for kind in kinds.split(","):
        train(out_dir, kind)


def train(out_dir, kind):
    import keras_psdist as kpd

    if kind == "sync":
        strategy = kpd.SyncReplicaStrategy(step_timeout=120)
    else:
        strategy = kpd.PSStrategy(mode="between-graph")
    topology = strategy.extended.topology
    with strategy.scope():
        model = layer_zoo.build(stochastic=True)
    history = model.fit(
        layer_zoo.partial_batches(topology.num_training_processes),
        epochs=EPOCHS,
        verbose=0,
    )
    report = {
        "worker": topology.worker_index,
        "examples": history.history["examples"],
        "finite": bool(all(np.isfinite(w.numpy()).all() for w in model.weights)),
    }
    path = os.path.join(out_dir, f"{kind}_worker_{topology.worker_index}.json")
    with open(path, "w") as f:
        json.dump(report, f)
    print(f"{kind}, worker {topology.worker_index}: {report}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
