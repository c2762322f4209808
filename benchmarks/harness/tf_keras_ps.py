"""The tf_keras `ParameterServerStrategy` baseline, set up as TensorFlow advises.

What a user of TensorFlow's own parameter-server training runs: tf_keras
(Keras 2) `model.fit` under `tf.distribute.ParameterServerStrategy`, this
process the coordinator (the chief, with its `ClusterCoordinator`), worker and
ps tasks running plain `tf.distribute.Server`s. Configured as TensorFlow's
tutorial "Parameter server training with ParameterServerStrategy"
(tensorflow.org/tutorials/distribute/parameter_server_training) says:

* **`steps_per_execution`** (`compile`; default `STEPS_PER_EXECUTION`, 10,
  the tutorial's own value): its "Performance improvement" section names the
  coordinator's Python `schedule`/`join` and its latency to the workers, and
  its "Known limitations" say "it is usually necessary to pack multiple steps
  into a single function to achieve optimal performance";
* **a legacy optimizer**, `tf_keras.optimizers.legacy.Adam` (the same Adam,
  learning rate 1e-3, as the compared runs): "Performance improvement" advises
  `tf.keras.optimizers.legacy.Optimizer`s, the standard ones "could still lead
  to hotspot variables";
* **input** from a `tf_keras.utils.experimental.DatasetCreator(dataset_fn)`
  (its "Input data": built on each worker), a repeated dataset and
  `steps_per_epoch`, which `fit` requires here;
* with several ps tasks, optionally a size-based `variable_partitioner`
  (`MinSizePartitioner`, its "Variable sharding"): `min_shard_bytes`, off
  by default (one ps task has nothing to shard over).

One epoch is `steps_per_epoch` steps, each one worker's batch of
`per_worker_batch` examples, scheduled by the coordinator in functions of
`steps_per_execution` steps that run on whichever worker is free; the epoch
ends when every scheduled function has finished (the coordinator joins at each
epoch end). So an epoch trains `steps_per_epoch * per_worker_batch` examples,
however many workers there are.

Two halves:

* `run` (the benchmark's side): starts the coordinator,
  ``benchmarks/_tf_keras_ps.py`` (this module's `main`), on a cluster of
  `num_ps` ps and `num_workers` worker tasks: one started on this machine
  by `keras_psdist.cluster.launch` (its servers are `tf.distribute.Server`s,
  as the tutorial's), or servers already running at the `addresses` given;
  returns the coordinator's report.
* `coordinate` (the coordinator's side): builds the model, runs one warm-up
  epoch and `epochs` timed epochs in one `fit`, and returns the report, which
  `python benchmarks/_tf_keras_ps.py --out-dir DIR ...` writes to
  ``DIR/coordinator.json``.

The model and data are `mlp`'s, as in the compared runs. TensorFlow is
imported only by the coordinator.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from .arguments import positive
from .checkout import prepare_tensorflow
from .processes import read_reports, run_dir, run_process

# Before TensorFlow is imported anywhere in this process.
prepare_tensorflow()

# TensorFlow's tutorial packs 10 steps per function (`steps_per_execution=10`).
STEPS_PER_EXECUTION = 10
# A run that takes longer has hung (seconds).
RUN_TIMEOUT_S = 300.0
# How long servers at given `addresses` may take to accept connections.
CONNECT_TIMEOUT_S = 60.0
REPORT = "coordinator.json"
# The coordinator's script: `main`, run in a process of its own.
COORDINATOR = Path(__file__).resolve().parents[1] / "_tf_keras_ps.py"


# -------------------------------------------------------- the benchmark's side


# `keras-psdist serve` gives a ps task one thread per op (see
# `keras_psdist.cluster.server.start_server`); 0 is TensorFlow's default.
_PS_INTRA_OP_THREADS_ENV = "KERAS_PSDIST_PS_INTRA_OP_THREADS"


@contextmanager
def tensorflow_default_servers() -> Iterator[None]:
    """Has the servers `keras_psdist.cluster.launch` starts meanwhile run
    with TensorFlow's default threads, as the tutorial's
    `tf.distribute.Server`s do: the baseline is tf_keras as its users run
    it, not with keras_psdist's ps settings."""
    before = os.environ.get(_PS_INTRA_OP_THREADS_ENV)
    os.environ[_PS_INTRA_OP_THREADS_ENV] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ[_PS_INTRA_OP_THREADS_ENV]
        else:
            os.environ[_PS_INTRA_OP_THREADS_ENV] = before


def run(
    work: Path,
    *,
    num_workers: int,
    num_ps: int,
    steps_per_epoch: int,
    per_worker_batch: int,
    epochs: int,
    steps_per_execution: int = STEPS_PER_EXECUTION,
    seed: int = 0,
    addresses: Mapping[str, Sequence[str]] | None = None,
    min_shard_bytes: int | None = None,
    timeout_s: float = RUN_TIMEOUT_S,
) -> dict:
    """One tf_keras `ParameterServerStrategy` run in fresh processes.

    Args:
        work: A folder for the run's report and log (a fresh subfolder each).
        num_workers: Worker tasks, >= 1.
        num_ps: Parameter-server tasks, >= 1.
        steps_per_epoch: Steps per epoch, over all workers.
        per_worker_batch: Examples per step (one worker's batch).
        epochs: Timed epochs, after one untimed warm-up epoch.
        steps_per_execution: Steps per scheduled function. Defaults to 10.
        seed: Seed of the weights and the data. Defaults to 0.
        addresses: Servers already running: ``{"worker": [...], "ps": [...]}``
            (``"host:port"``, `num_workers` and `num_ps` of them), optionally
            ``"chief": ["host:port"]``, an address of this machine for the
            coordinator (else a free port on 127.0.0.1). Defaults to `None`:
            start them here with `keras_psdist.cluster.launch`, which also
            stops them.
        min_shard_bytes: Shard variables over the ps tasks with
            `MinSizePartitioner(min_shard_bytes, max_shards=num_ps)`. Defaults
            to `None` (no partitioner: each variable whole on one ps task).
        timeout_s: Stop the run and fail after this many seconds. Defaults
            to 300.

    Returns:
        The coordinator's report (`coordinate`), plus ``launch_wall_s``.

    Raises:
        ValueError: If an argument is invalid, naming it and the fix.
        ConnectionError: If a server at `addresses` does not answer.
        RunFailed: If the run failed; with the last lines of its log.
    """
    check_args(num_workers, num_ps, steps_per_epoch, steps_per_execution)
    spec = None if addresses is None else cluster_spec(addresses, num_workers, num_ps)
    out_dir, log = run_dir(work, f"tf_keras_{num_workers}w_")
    command = [
        sys.executable,
        str(COORDINATOR),
        "--out-dir",
        str(out_dir),
        "--steps-per-epoch",
        str(steps_per_epoch),
        "--per-worker-batch",
        str(per_worker_batch),
        "--epochs",
        str(epochs),
        "--steps-per-execution",
        str(steps_per_execution),
        "--seed",
        str(seed),
        *(["--min-shard-bytes", str(min_shard_bytes)] if min_shard_bytes else []),
    ]
    start = time.perf_counter()
    if spec is None:
        from keras_psdist.cluster import launch

        with open(log, "w") as f, tensorflow_default_servers():
            code = launch(
                command,
                num_ps=num_ps,
                num_workers=num_workers,
                mode="in-graph",
                timeout_s=timeout_s,
                out=f,
            )
    else:
        from keras_psdist.cluster import wait_reachable

        wait_reachable(
            {
                f"{job}:{i}": address
                for job in ("worker", "ps")
                for i, address in enumerate(spec[job])
            },
            CONNECT_TIMEOUT_S,
        )
        tf_config = {"cluster": spec, "task": {"type": "chief", "index": 0}}
        env = {**os.environ, "TF_CONFIG": json.dumps(tf_config)}
        code = run_process(command, log, timeout_s, env=env)
    (report,) = read_reports(out_dir, 1, log, code, pattern=REPORT)
    report["launch_wall_s"] = time.perf_counter() - start
    return report


def check_args(
    num_workers: int, num_ps: int, steps_per_epoch: int, steps_per_execution: int
) -> None:
    """Raises ValueError for a count below 1, naming it."""
    for name, value in (
        ("num_workers", num_workers),
        ("num_ps", num_ps),
        ("steps_per_epoch", steps_per_epoch),
        ("steps_per_execution", steps_per_execution),
    ):
        if value < 1:
            raise ValueError(f"`{name}` must be >= 1. Received: {name}={value}")


def cluster_spec(
    addresses: Mapping[str, Sequence[str]], num_workers: int, num_ps: int
) -> dict[str, list[str]]:
    """The cluster of servers at `addresses`, with a chief for the coordinator.

    >>> cluster_spec({"worker": ["w0:2222"], "ps": ["p0:2222"],
    ...               "chief": ["127.0.0.1:2000"]}, 1, 1)
    {'chief': ['127.0.0.1:2000'], 'worker': ['w0:2222'], 'ps': ['p0:2222']}
    >>> cluster_spec({"worker": ["w0:2222"], "ps": ["p0:2222"]}, 2, 1)
    Traceback (most recent call last):
    ...
    ValueError: `addresses` names 1 worker task(s) but num_workers=2. \
Received: addresses={'worker': ['w0:2222'], 'ps': ['p0:2222']}. Give one \
address per task, or change num_workers.
    """
    unknown = sorted(set(addresses) - {"chief", "worker", "ps"})
    if unknown:
        raise ValueError(
            f"`addresses` has unknown job(s) {unknown}. Expected: chief (optional), "
            f"worker, ps. Received: addresses={dict(addresses)}"
        )
    for job, count in (("worker", num_workers), ("ps", num_ps)):
        given = len(addresses.get(job, ()))
        if given != count:
            raise ValueError(
                f"`addresses` names {given} {job} task(s) but num_{job}s={count}. "
                f"Received: addresses={dict(addresses)}. Give one address per "
                f"task, or change num_{job}s."
            )
    chief = list(addresses.get("chief", ()))
    if len(chief) > 1:
        raise ValueError(
            f"`addresses` may name one chief (the coordinator). Received: chief={chief}"
        )
    if not chief:
        from keras_psdist.cluster import pick_free_ports

        chief = [f"127.0.0.1:{pick_free_ports(1)[0]}"]
    return {
        "chief": chief,
        "worker": list(addresses["worker"]),
        "ps": list(addresses["ps"]),
    }


# ------------------------------------------------------ the coordinator's side


def coordinate(
    steps_per_epoch: int,
    per_worker_batch: int,
    epochs: int,
    steps_per_execution: int = STEPS_PER_EXECUTION,
    seed: int = 0,
    min_shard_bytes: int | None = None,
    marks: Path | None = None,
    hidden: int | None = None,
    depth: int = 2,
) -> dict:
    """Trains as the coordinator of the cluster in `TF_CONFIG`; the report.

    One `fit` of 1 + `epochs` epochs, the first a warm-up (tracing, the
    workers' first dataset fills); each timed epoch from `on_epoch_begin` to
    `on_epoch_end`. ``examples_per_s`` is the examples of the timed epochs /
    the wall time from the first one's start to the last one's end. With
    `marks`, the timed window's start and end are also files there
    (`timed_begin`, `timed_end`), for a parent reading counters.
    """
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow as tf
    import tf_keras

    from . import mlp  # the same model and data as the compared runs

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    spec = resolver.cluster_spec().as_dict()
    num_workers, num_ps = len(spec["worker"]), len(spec["ps"])
    partitioner = None
    if min_shard_bytes:
        partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=min_shard_bytes, max_shards=num_ps
        )
    strategy = tf.distribute.ParameterServerStrategy(
        resolver, variable_partitioner=partitioner
    )
    model = mlp.build_model(
        strategy,
        seed,
        library=tf_keras,
        steps_per_execution=steps_per_execution,
        legacy_optimizer=True,
        hidden=hidden or mlp.HIDDEN,
        depth=depth,
    )
    x, y = mlp.make_arrays(mlp.NUM_SAMPLES, seed)

    def dataset_fn(context):
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
        return dataset.batch(per_worker_batch, drop_remainder=True).prefetch(2)

    class Clock(tf_keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epochs: list[tuple[float, float]] = []
            self.wall: list[tuple[float, float]] = []
            self.last_loss = None

        def on_epoch_begin(self, epoch, logs=None):
            if marks is not None and epoch == 1:
                (marks / "timed_begin").touch()
            self._begin = (time.perf_counter(), time.time())

        def on_epoch_end(self, epoch, logs=None):
            self.epochs.append((self._begin[0], time.perf_counter()))
            self.wall.append((self._begin[1], time.time()))
            if marks is not None and epoch == epochs:
                (marks / "timed_end").touch()
            if logs and "loss" in logs:
                self.last_loss = float(logs["loss"])

    clock = Clock()
    model.fit(
        tf_keras.utils.experimental.DatasetCreator(dataset_fn),
        epochs=1 + epochs,
        steps_per_epoch=steps_per_epoch,
        verbose=0,
        callbacks=[clock],
    )
    timed, wall = clock.epochs[1:], clock.wall[1:]  # The first is the warm-up.
    examples = steps_per_epoch * per_worker_batch * len(timed)
    span = wall[-1][1] - wall[0][0]
    return {
        "role": "tf_keras",
        "workers": num_workers,
        "ps": num_ps,
        "steps_per_epoch": steps_per_epoch,
        "examples_per_step": per_worker_batch,
        "examples_per_epoch": steps_per_epoch * per_worker_batch,
        "steps_per_execution": steps_per_execution,
        "optimizer": type(model.optimizer).__module__
        + "."
        + type(model.optimizer).__name__,
        "variable_partitioner": None if partitioner is None else repr(partitioner),
        "warmup_s": clock.epochs[0][1] - clock.epochs[0][0],
        "epoch_s": [end - begin for begin, end in timed],
        "timed_start_wall": wall[0][0],
        "timed_end_wall": wall[-1][1],
        "examples": examples,
        "span_s": span,
        "examples_per_s": examples / span,
        "final_loss": clock.last_loss,
    }


def main(argv: list[str] | None = None) -> int:
    """``python benchmarks/_tf_keras_ps.py --out-dir DIR ...``: `coordinate`,
    its report written to ``DIR/coordinator.json``."""
    parser = argparse.ArgumentParser(
        description="The coordinator of a tf_keras ParameterServerStrategy run "
        "(started by `run`, with TF_CONFIG naming this task the chief)."
    )
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--steps-per-epoch", type=positive, required=True)
    parser.add_argument("--per-worker-batch", type=positive, required=True)
    parser.add_argument("--epochs", type=positive, required=True)
    parser.add_argument(
        "--steps-per-execution", type=positive, default=STEPS_PER_EXECUTION
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-shard-bytes", type=positive)
    args = parser.parse_args(argv)
    report = coordinate(
        args.steps_per_epoch,
        args.per_worker_batch,
        args.epochs,
        args.steps_per_execution,
        args.seed,
        args.min_shard_bytes,
    )
    (Path(args.out_dir) / REPORT).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
