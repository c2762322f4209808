"""An in-graph chief that changes its workers between fits.

Run by `tests/test_elastic.py` under `keras-psdist launch --num-ps 1
--num-workers 3` (in-graph: a server per ps and worker task):

    python ingraph_resize_job.py OUT_DIR

The chief trains a small model with `PSStrategy` over worker:0 and
worker:1, then builds a second `PSStrategy` over all three workers (the
same process: its connection changes in place, the ps variables stay),
carries the weights over and trains on, then a third over worker:0 and
worker:1 (worker:2 dropped). It checks that a strategy over another ps task,
or one that moves worker:1 to worker:2's address, is refused, and writes `OUT_DIR/report.json`: each phase's replicas, its
loss before and after training, and the first model's loss read after the
last change (its variables on the ps are still there).
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_psdist as kpd  # noqa: E402
from keras_psdist import cluster  # noqa: E402


def main(out_dir):
    jobs = {
        k: list(v) for k, v in json.loads(os.environ["TF_CONFIG"])["cluster"].items()
    }
    x = np.random.default_rng(0).random((192, 4)).astype("float32")
    y = x.sum(1, keepdims=True)
    report, models, weights = {"phases": []}, [], None
    for workers in ([0, 1], [0, 1, 2], [0, 1]):
        phase = dict(jobs, worker=[jobs["worker"][k] for k in workers])
        strategy = kpd.PSStrategy(
            cluster_resolver=cluster.ClusterConfig(phase, "chief", 0)
        )
        with strategy.scope():
            model = keras.Sequential(
                [keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)]
            )
            model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        if weights is not None:
            model.set_weights(weights)
        before = model.evaluate(x, y, verbose=0)
        model.fit(x, y, batch_size=48, epochs=2, verbose=0)
        weights = model.get_weights()
        models.append(model)
        report["phases"].append(
            {
                "workers": workers,
                "replicas": strategy.num_replicas_in_sync,
                "before": before,
                "after": model.evaluate(x, y, verbose=0),
            }
        )
    report["first_model_after"] = models[0].evaluate(x, y, verbose=0)
    refused = {
        "other_ps": dict(jobs, ps=[jobs["worker"][2]]),
        "moved_worker": dict(jobs, worker=[jobs["worker"][0], jobs["worker"][2]]),
    }
    for name, bad in refused.items():
        try:
            kpd.PSStrategy(cluster_resolver=cluster.ClusterConfig(bad, "chief", 0))
            report[name] = "accepted"
        except ValueError as e:
            report[name] = str(e)
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1])
