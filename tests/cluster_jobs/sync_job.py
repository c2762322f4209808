"""A Keras training job on digits under `SyncReplicaStrategy`, one worker process.

Run by `tests/test_sync_replicas.py` under `keras-psdist launch --mode
between-graph`:

    python sync_job.py OUT_DIR CONFIG_JSON

CONFIG_JSON holds the strategy's arguments (`replicas_to_aggregate`,
`aggregator`, `num_byzantine`, `attack`, `worker_momentum`; or `max_staleness`, which trains
with `PSStrategy(mode="between-graph", max_staleness=...)` instead) and the job's:
`epochs`, `model` (`"embedding"`: a model with sparse gradients),
`partitioned` (split its table over the ps tasks, as `digits_job` does),
`sgd_learning_rate` (a momentum-free SGD in place of Adam), `jit_compile`
(`compile`'s; the report's `xla_traced_replicas` counts the replica passes traced for XLA),
`slow_worker` / `sleep_s` (that worker sleeps after every step: the test's
straggler), and `fits` (how many `fit`s, each followed by `evaluate`, the
model trains in a row; 1 by default). `then`: a second config, run after
the first by a second strategy in the same script (a run of its own); its
report is the first's `then`. Each worker writes `OUT_DIR/worker_<i>.json`
(`fits`: per fit, the steps it ran, the steps it would have run, the
epochs in its History, and the steps that sent nothing because the chief
had finished the fit; the other keys are the last fit's); the chief also
writes `OUT_DIR/weights.npz` (the first run's model).
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import digits_job  # noqa: E402

STRATEGY_ARGS = (
    "replicas_to_aggregate",
    "aggregator",
    "num_byzantine",
    "attack",
    "worker_momentum",
    "compression",
    "read_dtype",
)


class Straggler(keras.callbacks.Callback):
    """Makes this worker slow: it sleeps after every training step."""

    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.seconds)


class CountsAtLastStep(keras.callbacks.Callback):
    """Reads the counts when this worker's last step is done (before `fit`
    waits, on the chief, for the other workers to finish), and counts the
    steps each `fit` ran."""

    def __init__(self, strategy):
        super().__init__()
        self.strategy = strategy
        self.counts = None
        self.steps_run = []  # per fit
        self.link_bytes = []  # per fit: through this host's links, both ways

    def on_train_begin(self, logs=None):
        self.steps_run.append(0)
        self.link_bytes.append(-_link_bytes())

    def on_train_batch_end(self, batch, logs=None):
        self.steps_run[-1] += 1

    def on_train_end(self, logs=None):
        self.link_bytes[-1] += _link_bytes()
        training = self.strategy.extended.sync_training
        self.counts = training.counts()
        if hasattr(training, "clocks"):
            self.counts["clocks"] = training.clocks.numpy()


def _link_bytes():
    """Bytes received and sent through this network namespace's interfaces
    but loopback (on a test bed host: its own link; else the machine's)."""
    total = 0
    with open("/proc/net/dev") as f:
        for line in f.readlines()[2:]:
            name, fields = line.split(":", 1)
            if name.strip() != "lo":
                values = fields.split()
                total += int(values[0]) + int(values[8])
    return total


def _listed(counts):
    return {k: np.asarray(v).tolist() for k, v in counts.items()}


def main(out_dir, config):
    report, strategy, model = _train(out_dir, config)
    if "then" in config:
        # A second strategy in the same script: a run of its own.
        then_dir = os.path.join(out_dir, "then")
        os.makedirs(then_dir, exist_ok=True)
        report["then"], _, _ = _train(then_dir, config["then"])
        if config["then"].get("compression") is not None:
            # The same run uncompressed, what the compressed one is held to.
            plain_dir = os.path.join(out_dir, "then_uncompressed")
            os.makedirs(plain_dir, exist_ok=True)
            report["then_uncompressed"], _, _ = _train(
                plain_dir, {**config["then"], "compression": None}
            )
        report["first_counts_after_then"] = _listed(
            strategy.extended.sync_training.counts()
        )
    worker = report["worker"]
    if report["is_chief"]:
        np.savez(
            os.path.join(out_dir, "weights.npz"), *[w.numpy() for w in model.weights]
        )
    with open(os.path.join(out_dir, f"worker_{worker}.json"), "w") as f:
        json.dump(report, f)
    print(
        f"worker {worker}: accuracy {report['accuracy']:.3f}, "
        f"counts {report['counts_when_finished']}"
    )


def _train(out_dir, config):
    """One run of `config`: its report, strategy and model."""
    import keras_psdist as kpd

    bounded = "max_staleness" in config
    if bounded:
        strategy = kpd.PSStrategy(
            mode="between-graph",
            max_staleness=config["max_staleness"],
            step_timeout=120,
        )
    else:
        partitioner = None
        if config.get("partitioned"):
            partitioner = kpd.partitioners.Fixed(**digits_job.EMBEDDING_PARTITIONER)
        strategy = kpd.SyncReplicaStrategy(
            **{k: config[k] for k in STRATEGY_ARGS if k in config},
            step_timeout=120,
            partitioner=partitioner,
        )
    worker = strategy.extended.topology.worker_index
    sparse = config.get("model") == "embedding"
    if sparse:
        model = digits_job.build_embedding(strategy)
    else:
        model = digits_job.build(
            strategy,
            sgd_learning_rate=config.get("sgd_learning_rate"),
            jit_compile=config.get("jit_compile", "auto"),
        )
    xla_traces = digits_job.count_xla_traces()
    digits_job.EPOCHS = config.get("epochs", digits_job.EPOCHS)
    last_step = CountsAtLastStep(strategy)
    callbacks = [
        last_step,
        *(
            []
            if bounded
            else [
                kpd.callbacks.SyncReplicaReport(
                    log_dir=os.path.join(out_dir, f"tensorboard_{worker}")
                )
            ]
        ),
        keras.callbacks.ModelCheckpoint(
            os.path.join(out_dir, f"checkpoint_{worker}.weights.h5"),
            save_weights_only=True,
        ),
    ]
    if worker == config.get("slow_worker"):
        callbacks.append(Straggler(config["sleep_s"]))
    fits = []
    for _ in range(config.get("fits", 1)):
        if sparse:
            history = digits_job.train_embedding(model, callbacks)
        else:
            history, _ = digits_job.train(model, 0, callbacks)
        fits.append(
            {
                "steps_run": last_step.steps_run[-1],
                "steps_planned": history.params["epochs"] * history.params["steps"],
                "steps_per_epoch": history.params["steps"],
                # Steps that sent nothing: the chief had finished the fit.
                "steps_skipped": (
                    0
                    if bounded
                    else strategy.extended.sync_training.sync.steps_skipped()
                ),
                "epochs_in_history": len(history.history["loss"]),
                "link_bytes": last_step.link_bytes[-1],
            }
        )
    finished = strategy.extended.sync_training.counts()
    x, y = digits_job.embedding_digits() if sparse else digits_job.digits()
    logits = model(x[1500:], training=False)
    accuracy = float(np.mean(np.argmax(logits, axis=1) == y[1500:]))
    report = {
        "worker": worker,
        "is_chief": strategy.extended.should_checkpoint,
        "steps": len(history.history["loss"]) * history.params["steps"],
        "fits": fits,
        "accuracy": accuracy,
        "counts_at_last_step": _listed(last_step.counts),
        "counts_when_finished": _listed(finished),
        "history_keys": sorted(history.history),
        "history": {k: v for k, v in history.history.items() if k.startswith("sync/")},
        "iterations": int(model.optimizer.iterations.numpy()),
        "variable_bytes": sum(
            int(np.prod(w.shape)) * np.dtype(w.dtype).itemsize
            for w in model.trainable_weights
        ),
        "xla_traced_replicas": len(xla_traces),
    }
    if not bounded:
        sync_training = strategy.extended.sync_training
        report["namespace"] = sync_training.sync.namespace
        service = sync_training._service
        # On the chief: updates popped, made and released in one call.
        report["updates_in_one_call"] = (
            None if service is None else service.updates_in_one_call
        )
        report["layout"] = list(sync_training.sync.layout.kinds)
        wire = strategy.extended.wire
        report["compression"] = None if wire is None else repr(wire.compressor)
        # Where each compressed gradient's residual lives (this worker).
        report["residual_devices"] = (
            [] if wire is None else [v.device for v in wire.state.kept]
        )
        report["momentum_norms"] = [
            float(np.linalg.norm(v.numpy())) for v in sync_training.momentum.kept
        ]
    if sparse:
        table = model.layers[0].embeddings.path
        report["table_shard_devices"] = [
            p.device for p in strategy.extended.placement.shards_of(table)
        ]
    return report, strategy, model


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
