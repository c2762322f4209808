"""One worker process of `benchmarks/robustness_processes.py` (see its docstring).

Run on every worker task by `keras_psdist.cluster.launch(mode="between-graph")`::

    python benchmarks/_robustness_processes_job.py OUT_DIR CONFIG_JSON

CONFIG_JSON: `config` (a robustness.py configuration, e.g.
``arc>geometric_median+wm``), `attack` (a name of `harness.digits.ATTACKS`),
`workers`, `attackers` (worker indices), `num_byzantine`, `epochs`, `batch` (global),
`hidden`, `lr`, `momentum`, `seed`. The worker trains robustness.py's digits
MLP on the same split under `SyncReplicaStrategy`: every worker reads the same
seeded shuffle of global batches and the strategy gives worker i piece i of
each (docs/cluster.md, "Batches"), so a step trains on the one-process
table's global batch and an epoch is one pass over the data in total. It
writes `OUT_DIR/worker_<i>.json`; the chief's holds the held-out accuracy
and the sync counts (`SyncReplicaReport`).
A worker in `attackers` runs the attack itself, on its own gradient or
batch: the strategy is given it, and only that worker applies it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.configs import parse_config  # noqa: E402
from harness.digits import ATTACKS, build_model, load_data  # noqa: E402


def main(out_dir: str, config: dict) -> int:
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_psdist as kpd

    _, aggregator, worker_momentum = parse_config(config["config"])
    attack = ATTACKS[config["attack"]].build(list(config["attackers"]), config["seed"])
    strategy = kpd.SyncReplicaStrategy(
        aggregator=aggregator,
        num_byzantine=config["num_byzantine"],
        attack=attack,
        worker_momentum=worker_momentum,
        step_timeout=300,
    )
    worker = strategy.extended.topology.worker_index
    xt, yt, xv, yv = load_data(config["seed"])
    keras.utils.set_random_seed(config["seed"])
    with strategy.scope():
        model = build_model(
            config["hidden"], config["lr"], config["momentum"], worker_momentum
        )
    # The one-process table's global batch. The dataset's elements are
    # global batches (as under MultiWorkerMirroredStrategy): the strategy cuts
    # each into one piece per worker and this worker keeps its own, so every
    # worker reads the same seeded shuffle and the pieces are disjoint.
    # (Batching by batch // workers here gave each worker 2 rows a step,
    # the 4-5 point clean gap the first process table had.)
    dataset = (
        tf.data.Dataset.from_tensor_slices((xt, yt))
        .shuffle(len(xt), seed=config["seed"], reshuffle_each_iteration=True)
        .repeat()
        .batch(config["batch"], drop_remainder=True)
    )
    counts = kpd.callbacks.SyncReplicaReport()
    history = model.fit(
        dataset,
        epochs=config["epochs"],
        steps_per_epoch=len(xt) // config["batch"],
        shuffle=False,
        verbose=0,
        callbacks=[counts],
    )
    weights = model.get_weights()
    plain = build_model(config["hidden"], config["lr"], config["momentum"])
    plain.set_weights(weights)
    logits = plain(xv, training=False).numpy()
    report = {
        "worker": worker,
        "is_chief": bool(strategy.extended.should_checkpoint),
        "attacker": worker in config["attackers"],
        "accuracy": float(np.mean(np.argmax(logits, axis=-1) == yv)),
        "final_loss": float(history.history["loss"][-1]),
        "finite": bool(all(np.isfinite(w).all() for w in weights)),
        # The chief's counts at this worker's last epoch end: updates applied,
        # and per worker its gradients applied and dropped.
        "sync_counts": {k: np.asarray(v).tolist() for k, v in counts.counts.items()},
        "optimizer_iterations": int(model.optimizer.iterations.numpy()),
    }
    with open(os.path.join(out_dir, f"worker_{worker}.json"), "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], json.loads(sys.argv[2])))
