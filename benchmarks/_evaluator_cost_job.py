"""One task of `benchmarks/evaluator_cost.py` (see its docstring).

Run on every worker task, and on the evaluator with `--evaluator`, by
`keras_psdist.cluster.launch(mode="between-graph")`::

    python benchmarks/_evaluator_cost_job.py OUT_DIR CONFIG_JSON

CONFIG_JSON: `epochs`, `batch`, `hidden`, `seed`. A worker trains the digits
MLP under async `PSStrategy` (the chief writes a checkpoint per epoch) and
writes `OUT_DIR/worker_<i>.json` with its examples and `fit` time; the
evaluator follows the checkpoints and writes `OUT_DIR/evaluator.json`.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

TRAIN_EXAMPLES = 1500  # of digits' 1,797; the rest is held out


def _model(config):
    import keras

    keras.utils.set_random_seed(config["seed"])
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(config["hidden"], activation="relu"),
            keras.layers.Dense(config["hidden"], activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def _digits():
    import numpy as np
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype(np.float32), y.astype(np.int32)


def _process_cpu_s() -> float:
    """CPU seconds of this process, every thread, user and system."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(out_dir: str, config: dict) -> int:
    import keras

    import keras_psdist as kpd

    checkpoints = os.path.join(out_dir, "checkpoints")
    x, y = _digits()
    if kpd.cluster.is_evaluator() and config.get("idle_evaluator"):
        # A diagnostic: an evaluator process that evaluates nothing (its
        # imports only), until the launcher says training has ended.
        stop = os.environ["KERAS_PSDIST_EVALUATOR_STOP_FILE"]
        while not os.path.exists(stop):
            time.sleep(1.0)
        report = {"evaluations": 0, "cpu_s": _process_cpu_s()}
        with open(os.path.join(out_dir, "evaluator.json"), "w") as f:
            json.dump(report, f)
        return 0
    if kpd.cluster.is_evaluator():
        start = time.perf_counter()
        evaluations = kpd.SidecarEvaluator(
            _model(config),
            (x[TRAIN_EXAMPLES:], y[TRAIN_EXAMPLES:]),
            checkpoint_dir=checkpoints,
            poll_s=0.5,
            min_interval_s=config["min_interval_s"],
        ).start()
        report = {
            "evaluations": len(evaluations),
            "last_accuracy": evaluations[-1].results["accuracy"]
            if evaluations
            else None,
            "wall_s": time.perf_counter() - start,
            # The whole process's CPU time: TensorFlow's import included.
            "cpu_s": _process_cpu_s(),
        }
        with open(os.path.join(out_dir, "evaluator.json"), "w") as f:
            json.dump(report, f)
        return 0
    strategy = kpd.PSStrategy(mode="between-graph")
    worker = strategy.extended.topology.worker_index
    with strategy.scope():
        model = _model(config)
    start, cpu_start = time.perf_counter(), _process_cpu_s()
    history = model.fit(
        x[:TRAIN_EXAMPLES],
        y[:TRAIN_EXAMPLES],
        batch_size=config["batch"],
        epochs=config["epochs"],
        verbose=0,
        callbacks=[
            keras.callbacks.ModelCheckpoint(
                os.path.join(checkpoints, "epoch{epoch:02d}.weights.h5"),
                save_weights_only=True,
            )
        ],
    )
    fit_s = time.perf_counter() - start
    fit_cpu_s = _process_cpu_s() - cpu_start
    steps = history.params["steps"] * config["epochs"]
    report = {
        "worker": worker,
        "examples": steps * config["batch"],
        "fit_s": fit_s,
        "fit_cpu_s": fit_cpu_s,
    }
    with open(os.path.join(out_dir, f"worker_{worker}.json"), "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], json.loads(sys.argv[2])))
