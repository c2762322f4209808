"""How the cost grows: workers, ps tasks, table size and link bandwidth, on separate hosts.

What it measures
----------------
Every task of every run is on a host of its own: a Linux network namespace
with its own address on a private bridge (``keras_psdist.testing.hosts``),
started by ``keras_psdist.cluster.launch(hosts=...)``. Three sweeps:

1. **Workers** (``--workers``, default 1 2 4 8): examples/s and ps updates/s
   of async ``PSStrategy(mode="between-graph")``, ``SyncReplicaStrategy``
   (every worker's gradient aggregated, ``replicas_to_aggregate`` = workers),
   in-graph ``PSStrategy()`` (a chief driving the workers) and tf_keras's
   ``ParameterServerStrategy`` with its ``ClusterCoordinator``
   (``--kinds``; tf_keras is in the ``bench`` extra). 1 ps task. Each worker
   step trains ``--batch`` examples (weak scaling: a step of W workers is W
   batches); the model is the MLP of ``benchmarks/strategies.py``
   (64-512-512-2, Adam, 297k parameters, 1.19 MB).
2. **ps tasks** (``--ps``, default 1 2 4) x **table rows** (``--rows``): an
   embedding table of rows x 64 float32 split over the ps tasks
   (``partitioners.Fixed``), async on 2 workers, batches of random ids:
   ps updates/s and each ps task's peak RSS.
3. **Bandwidth** (``--mbit``, default unlimited 1000 100 10): every host's
   link limited to that rate each way (``tc`` token bucket), async on 2
   workers and 1 ps (``--mbit-kinds``: also in-graph, sync): examples/s, and the
   bytes through the ps host's link per update (its interface counters over
   the timed window) against what an async step must move: the variables
   read (1.19 MB) plus the gradient sent (1.19 MB). With ``--compression``
   (default ``none``; e.g. ``none "top_k(ratio=0.01)" fp16``) each rate runs
   each compressor (``PSStrategy(compression=...)``), and the table gives
   each one's examples/s as a ratio to ``none``'s on the same link. A
   compressor ending in ``@bfloat16`` or ``@float16`` also reads the
   variables in that dtype (``PSStrategy(read_dtype=...)``):
   ``"top_k(ratio=0.01)@bfloat16"``, ``none@bfloat16``; a second ``@`` and a
   top-k reads each variable's change since the worker's last read
   (``PSStrategy(read_compression=...)``):
   ``"top_k(ratio=0.01)@bfloat16@top_k(ratio=0.05)"``.
4. **A straggler on a slow link** (``--only straggler``): ``SyncReplicaStrategy``
   on 3 workers with one backup (``replicas_to_aggregate=2``) and a
   digits-sized MLP (64-64-64-2, 34 KB), with every link unlimited and with
   the last worker's limited to ``--slow-mbit`` (2) Mbit/s, alternating per
   round: the chief's updates/s over its timed window, and the whole job,
   from the first ``fit``'s start to the last process's end. Targets: the
   update rate >= 0.9x, the job <= 1.1x of the run without the slow link.

Every side runs ``--steps-per-execution`` (10) steps per call, as TensorFlow's
parameter-server tutorial advises for its strategy and docs/cluster.md for
ours, and tf_keras gets its tutorial's legacy Adam and ``DatasetCreator``
(``benchmarks/harness/tf_keras_ps.py``); its epoch is ``--steps`` x workers
single-worker steps, so every side trains the same examples per epoch.

Method: each run warms up one epoch of ``--steps`` steps (tracing, the first
connections), the workers wait for each other (a file barrier), then
``--epochs`` epochs of ``--steps`` steps are timed. Throughput = examples
trained in the timed epochs, over all workers / the wall time from the first
worker's timed start to the last one's end. ps updates/s: async, every worker
step applies one update; sync and in-graph, the optimizer's ``iterations``
counted over the window; tf_keras, its ``iterations``. Every process reports
its CPU time over the window: ``cpu_fraction`` = CPU s / wall s of that
process (1.0 = one core busy all the time), and the machine's busy fraction
over the window is read from ``/proc/stat``.

What it can and cannot show: this machine has ``os.cpu_count()`` cores (2
where it was written) for every task of a run. Compute cannot scale: more
workers share the same cores, so examples/s flattens at what the cores
compute, and the machine busy fraction says when that is reached. What the
curve does show is the overhead that grows with workers (the time a worker
is *not* on a CPU while the machine has idle CPU: waiting on the ps, the
network, the chief), the bytes each update moves, and where a limited link
becomes the bottleneck. The rounds of a run alternate the kinds (rotated
order) so drift of the machine hits each alike.

How to run (as root: namespaces need it)
----------------------------------------
From the repository root::

    python benchmarks/scaling.py                    # all three sweeps
    python benchmarks/scaling.py --quick            # smoke run, about 3 minutes
    python benchmarks/scaling.py --only workers --workers 1 2 4 8 16

Writes ``benchmarks/results/scaling.json`` (``--json``) and
``docs/images/scaling.png`` (``--plot``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness
from harness import host_runs

harness.prepare_tensorflow()

KINDS = ("async", "sync", "in-graph", "tf_keras")
SWEEPS = ("workers", "ps", "mbit", "straggler")
EMBED_DIM = 64
RUN_TIMEOUT_S = 900.0
BARRIER_TIMEOUT_S = 300.0


# --------------------------------------------------------- child processes


# A `--workers-compression` wire: none, each variable its own tensor.
UNPACKED = "unpacked"


def _compression_and_reads(entry: str) -> dict[str, str | None]:
    """`--compression`'s entry as the strategy's arguments:
    `"top_k(ratio=0.01)@bfloat16@top_k(ratio=0.05)"` -> compression
    `"top_k(ratio=0.01)"`, read_dtype `"bfloat16"`, read_compression
    `"top_k(ratio=0.05)"`; `"none"` -> all `None`."""
    compression, _, reads = entry.partition("@")
    read_dtype, _, read_compression = reads.partition("@")
    return {
        "compression": None if compression == "none" else compression,
        "read_dtype": read_dtype or None,
        "read_compression": read_compression or None,
    }


def _child_main(args: argparse.Namespace) -> int:
    """One training process of a run: build, warm up, wait for the others,
    time, write its JSON."""
    out = Path(args.out_dir)
    if args.kind == "tf_keras":
        return _tf_keras_child(args, out)
    if args.kind == "model-step":
        return _model_step_child(args, out)
    import keras
    import numpy as np
    from harness import mlp  # the MLP and data of strategies.py

    import keras_psdist as kpd

    # `unpacked`: no compression, one tensor per variable each way (see
    # keras_psdist.distribute.packed_transfers), to measure what packing saves.
    unpacked = args.compression[0] == UNPACKED
    wire = _compression_and_reads("none" if unpacked else args.compression[0])
    if args.kind == "async" or args.kind == "embedding":
        partitioner = (
            kpd.partitioners.Fixed(args.num_ps) if args.kind == "embedding" else None
        )
        strategy = kpd.PSStrategy(
            mode="between-graph",
            partitioner=partitioner,
            **wire,
        )
    elif args.kind == "sync":
        strategy = kpd.SyncReplicaStrategy(
            replicas_to_aggregate=args.workers,
            **wire,
        )
    elif args.kind == "sync-backup":
        # One backup worker: an update takes the first workers - 1 gradients.
        strategy = kpd.SyncReplicaStrategy(replicas_to_aggregate=args.workers - 1)
    else:
        strategy = kpd.PSStrategy(**wire)
    strategy.extended.pack_transfers = not unpacked
    topology = strategy.extended.topology
    index = topology.worker_index if args.kind != "in-graph" else 0
    per_step = args.batch * (args.workers if args.kind == "in-graph" else 1)
    steps = args.steps * (args.epochs + 1)
    if args.kind == "embedding":
        model = _embedding_model(
            strategy, args.rows, args.seed, args.steps_per_execution
        )
        rng = np.random.default_rng(args.seed + index)
        x = rng.integers(0, args.rows, size=(steps * per_step, 8)).astype(np.int32)
        y = rng.integers(0, 2, size=steps * per_step).astype(np.int32)
    else:
        model = mlp.build_model(
            strategy,
            args.seed,
            hidden=args.hidden,
            steps_per_execution=args.steps_per_execution,
            depth=args.depth,
        )
        x, y = mlp.make_arrays(steps * per_step, args.seed + index)
    # The barrier lines the workers' timed windows up; not with a backup
    # worker, whose point is that nobody waits for the slowest.
    alone = args.kind in ("in-graph", "sync-backup")
    clock = _make_clock(out, index, 1 if alone else args.workers)
    fit_start_wall = time.time()
    model.fit(
        x,
        y,
        batch_size=per_step,
        epochs=1 + args.epochs,
        steps_per_epoch=args.steps,
        verbose=0,
        shuffle=False,
        callbacks=[clock, keras.callbacks.TerminateOnNaN()],
    )
    iterations = clock.iterations_of(model)
    report = {
        "kind": args.kind,
        "task": topology.config.task_name,
        "worker_index": index,
        "steps": args.steps * args.epochs,
        "examples": args.steps * args.epochs * per_step,
        "start_wall": clock.start_wall,
        "end_wall": clock.end_wall,
        "fit_start_wall": fit_start_wall,
        "exit_wall": time.time(),
        "cpu_s": clock.cpu_s,
        "iterations": [clock.iterations_begin, iterations],
        "barrier_wait_s": clock.barrier_wait_s,
    }
    name = report["task"].replace(":", "_")
    (out / f"{name}.json").write_text(json.dumps(report, indent=1))
    return 0


def _model_step_child(args: argparse.Namespace, out: Path) -> int:
    """The model's own step, for the cost table's "beyond the model": the
    same MLP, batch and steps per call in one process on one device (TF's
    default strategy), CPU and wall ms per step over `--epochs` epochs after
    a warm-up epoch."""
    import keras
    import tensorflow as tf
    from harness import mlp

    model = mlp.build_model(
        tf.distribute.get_strategy(),
        args.seed,
        hidden=args.hidden,
        steps_per_execution=args.steps_per_execution,
        depth=args.depth,
    )
    x, y = mlp.make_arrays(args.steps * (args.epochs + 1) * args.batch, args.seed)
    marks = {}

    class Clock(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            marks[epoch] = (time.perf_counter(), time.process_time())

    model.fit(
        x,
        y,
        batch_size=args.batch,
        epochs=1 + args.epochs,
        steps_per_epoch=args.steps,
        verbose=0,
        shuffle=False,
        callbacks=[Clock()],
    )
    (w0, c0), (w1, c1) = marks[0], marks[args.epochs]
    steps = args.steps * args.epochs
    report = {"wall_ms": (w1 - w0) / steps * 1e3, "cpu_ms": (c1 - c0) / steps * 1e3}
    (out / "model_step.json").write_text(json.dumps(report))
    return 0


def measure_model_step(args, work: Path) -> dict:
    """The model's own step (`_model_step_child`), in a fresh process."""
    out = Path(tempfile.mkdtemp(prefix="model-step-", dir=work))
    command = [
        sys.executable, str(Path(__file__).resolve()), "--role", "model-step",
        "--out-dir", str(out), "--steps", str(max(args.steps, 50)),
        "--epochs", str(args.epochs), "--batch", str(args.batch),
        "--seed", str(args.seed), "--hidden", str(args.hidden),
        "--steps-per-execution", str(args.steps_per_execution),
        "--depth", str(args.depth),
    ]  # fmt: skip
    subprocess.run(command, check=True, timeout=RUN_TIMEOUT_S)
    report = json.loads((out / "model_step.json").read_text())
    harness.log(
        f"the model's own step: {report['cpu_ms']:.2f} CPU ms, "
        f"{report['wall_ms']:.2f} wall ms"
    )
    return report


def _embedding_model(strategy, rows: int, seed: int, steps_per_execution: int):
    import keras

    keras.utils.set_random_seed(seed)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((8,), dtype="int32"),
                keras.layers.Embedding(rows, EMBED_DIM),
                keras.layers.GlobalAveragePooling1D(),
                keras.layers.Dense(2),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=steps_per_execution,
        )
    return model


def _make_clock(out: Path, index: int, count: int):
    """A Keras callback: after the warm-up epoch, a file barrier, then the
    timed window's wall and CPU time; the first worker also marks the window
    with files (`timed_begin`, `timed_end`) for the parent's counters."""
    import keras

    class Clock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.start_wall = self.end_wall = self.cpu_s = None
            self.barrier_wait_s = 0.0
            self.iterations_begin = None
            self._cpu0 = None

        def iterations_of(self, model) -> int:
            return int(model.optimizer.iterations.numpy())

        def on_epoch_end(self, epoch, logs=None):
            if epoch != 0:
                return
            (out / f"ready_{index}").touch()
            waited = time.perf_counter()
            deadline = time.monotonic() + BARRIER_TIMEOUT_S
            while sum((out / f"ready_{i}").exists() for i in range(count)) < count:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"not all {count} workers reached the barrier in "
                        f"{BARRIER_TIMEOUT_S:g} s"
                    )
                time.sleep(0.01)
            self.barrier_wait_s = time.perf_counter() - waited
            self.iterations_begin = self.iterations_of(self.model)
            if index == 0:
                (out / "timed_begin").touch()
            self.start_wall = time.time()
            self._cpu0 = time.process_time()

        def on_train_end(self, logs=None):
            if self._cpu0 is None:  # Stopped in its warm-up epoch.
                return
            self.end_wall = time.time()
            self.cpu_s = time.process_time() - self._cpu0
            if index == 0:
                (out / "timed_end").touch()

    return Clock()


def _tf_keras_child(args: argparse.Namespace, out: Path) -> int:
    """tf_keras ParameterServerStrategy + ClusterCoordinator as the chief,
    set up as its tutorial says (`tf_keras_ps.coordinate`: 10 steps per
    execution, the legacy Adam, a `DatasetCreator`). Each of its steps is one
    worker's batch, so an epoch of `steps x workers` steps trains what an
    async epoch of `steps` steps on each worker does."""
    from harness import tf_keras_ps

    report = tf_keras_ps.coordinate(
        steps_per_epoch=args.steps * args.workers,
        per_worker_batch=args.batch,
        epochs=args.epochs,
        steps_per_execution=args.steps_per_execution,
        seed=args.seed,
        marks=out,
        hidden=args.hidden,
        depth=args.depth,
    )
    steps = report["steps_per_epoch"] * args.epochs
    ours = {
        "kind": "tf_keras",
        "task": "chief:0",
        "worker_index": 0,
        "steps": steps,
        "examples": report["examples"],
        "start_wall": report["timed_start_wall"],
        "end_wall": report["timed_end_wall"],
        "cpu_s": None,  # The coordinator's CPU is not a worker's.
        "iterations": [0, steps],  # One update per step.
        "barrier_wait_s": 0.0,
        "tf_keras": report,
    }
    (out / "chief_0.json").write_text(json.dumps(ours, indent=1))
    return 0


# ------------------------------------------------------------ one run


def run_once(kind: str, workers: int, num_ps: int, args, work: Path, **extra) -> dict:
    """One launch of this script's children on fresh hosts
    (`harness.host_runs.run_once`)."""
    return host_runs.run_once(
        Path(__file__).resolve(), kind, workers, num_ps, args, work, **extra
    )


# ------------------------------------------------------------ the sweeps

# What an async step of the MLP moves through the ps's link: every variable
# read (297k float32) and a gradient of the same size sent.
MLP_PARAMETERS = 64 * 512 + 512 + 512 * 512 + 512 + 512 * 2 + 2
MLP_STEP_BYTES = 2 * 4 * MLP_PARAMETERS


def _rotated(items: list, r: int) -> list:
    return items[r % len(items) :] + items[: r % len(items)]


def sweep_workers(args, work: Path) -> list[dict]:
    # Our kinds again with each `--workers-compression` wire (tf_keras has
    # none): e.g. 16-bit gradients and reads, for the cost table.
    sides = [(kind, "none") for kind in args.kinds] + [
        (kind, wire)
        for wire in args.workers_compression
        if wire != "none"
        for kind in args.kinds
        if kind != "tf_keras"
    ]
    runs = []
    for r in range(args.rounds):
        for workers in args.workers:
            for kind, wire in _rotated(sides, r):
                run = run_once(kind, workers, 1, args, work, compression=wire)
                runs.append({"round": r, **run})
    return runs


def sweep_ps(args, work: Path) -> list[dict]:
    runs = []
    for r in range(args.rounds):
        for rows in args.rows:
            for num_ps in _rotated(list(args.ps), r):
                runs.append(
                    {
                        "round": r,
                        **run_once("embedding", 2, num_ps, args, work, rows=rows),
                    }
                )
    return runs


def sweep_mbit(args, work: Path) -> list[dict]:
    runs = []
    for r in range(args.rounds):
        for mbit in _rotated(list(args.mbit), r):
            # Beside each other on the same link, the order rotated per round.
            for kind in args.mbit_kinds:
                for compression in _rotated(list(args.compression), r):
                    runs.append(
                        {
                            "round": r,
                            **run_once(
                                kind,
                                2,
                                1,
                                args,
                                work,
                                mbit=mbit or None,
                                steps=args.mbit_steps,
                                compression=compression,
                            ),
                        }
                    )
    return runs


def sweep_straggler(args, work: Path) -> list[dict]:
    """SyncReplicaStrategy, 3 workers, one backup, a digits-sized MLP: with
    every link unlimited, and with the last worker's limited to
    `--slow-mbit`, alternating."""
    runs = []
    for r in range(args.rounds):
        for slow in _rotated([None, args.slow_mbit], r):
            runs.append(
                {
                    "round": r,
                    **run_once(
                        "sync-backup", 3, 1, args, work, slow_mbit=slow, hidden=64
                    ),
                }
            )
    return runs


def _median(runs: list[dict], key: str):
    values = [run[key] for run in runs if "error" not in run and key in run]
    return harness.median_or_none(values)


def _group(runs: list[dict], *keys: str) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        groups.setdefault(tuple(run[k] for k in keys), []).append(run)
    return groups


def tables(results: dict) -> None:
    fmt = harness.fmt
    if results.get("straggler"):
        straggler_table(results["straggler"])
    if results.get("workers"):
        rows = []
        worker_runs = [{"compression": "none", **run} for run in results["workers"]]
        groups = _group(worker_runs, "workers", "kind", "compression")
        for (workers, kind, wire), runs in groups.items():
            tf_keras = groups.get((workers, "tf_keras", "none"), [])
            ours = _median(runs, "examples_per_s")
            base = _median(tf_keras, "examples_per_s")
            cpu = [
                harness.median_or_none(list(run["cpu_fraction"].values()))
                for run in runs
                if "error" not in run
            ]
            rows.append(
                [
                    workers,
                    kind if wire == "none" else f"{kind}, {wire}",
                    fmt(ours, ".0f"),
                    fmt(_median(runs, "updates_per_s"), ".1f"),
                    harness.times(harness.ratio(ours, base))
                    if kind != "tf_keras"
                    else "",
                    ""
                    if kind == "tf_keras"
                    else fmt(
                        harness.median_or_none(c for c in cpu if c is not None), ".2f"
                    ),
                    fmt(_median(runs, "machine_busy"), ".2f"),
                    f"{sum('error' in run for run in runs)} failed"
                    if any("error" in run for run in runs)
                    else "",
                ]
            )
        print(
            harness.markdown_table(
                rows,
                ["workers", "kind", "examples/s", "updates/s", "vs tf_keras",
             "worker CPU/wall", "machine busy", ""],
            )
        )  # fmt: skip
    if results.get("workers"):
        cost_table(results["workers"], (results.get("model_step") or [None])[0])
    if results.get("ps"):
        rows = []
        for (rows_, num_ps), runs in _group(results["ps"], "rows", "num_ps").items():
            rss = [run["peak_rss_mb"] for run in runs if "error" not in run]
            per_task = harness.median_or_none(max(r.values()) for r in rss)
            rows.append(
                [
                    rows_,
                    f"{rows_ * EMBED_DIM * 4 / 2**20:.0f}",
                    num_ps,
                    fmt(_median(runs, "updates_per_s"), ".1f"),
                    fmt(per_task, ".0f"),
                    fmt(_median(runs, "machine_busy"), ".2f"),
                ]
            )
        print(
            harness.markdown_table(
                rows,
                ["rows", "table MB", "ps tasks", "updates/s", "peak RSS of a ps task (MB)",
             "machine busy"],
            )
        )  # fmt: skip
    if results.get("mbit"):
        rows = []
        # Runs of before --compression and --mbit-kinds: async, uncompressed.
        mbit_runs = [
            {"kind": "async", "compression": "none", **run} for run in results["mbit"]
        ]
        groups = _group(mbit_runs, "mbit", "kind", "compression")
        for (mbit, kind, compression), runs in groups.items():
            per_update = _median(runs, "ps_link_bytes_per_update")
            speed = _median(runs, "examples_per_s")
            plain = groups.get((mbit, kind, "none"), [])
            rows.append(
                [
                    "unlimited" if not mbit else f"{mbit:g} Mbit/s",
                    kind,
                    compression,
                    fmt(speed, ".0f"),
                    harness.times(
                        harness.ratio(speed, _median(plain, "examples_per_s"))
                    ),
                    fmt(_median(runs, "updates_per_s"), ".1f"),
                    fmt(None if per_update is None else per_update / 2**20, ".2f"),
                    harness.times(harness.ratio(per_update, MLP_STEP_BYTES)),
                ]
            )
        print(
            harness.markdown_table(
                rows,
                ["link", "kind", "compression", "examples/s", "vs none",
             "updates/s", "ps link MB per update", "vs variables + gradient"],
            )
        )  # fmt: skip


def cost_table(runs: list[dict], model_step: dict | None) -> None:
    """Issue 54 §3: what one update costs, per mode and worker count, beside
    tf_keras's PSv2 in the same rounds.

    - ps CPU ms per update (the figure that says how many workers one ps
      task serves), and its ratio to tf_keras's;
    - worker CPU ms per worker step, and beyond the model's own step (the
      same MLP, batch and steps per call on one device, `model_step`);
    - the chief's CPU ms per update (in-graph's chief, tf_keras's
      coordinator);
    - MB through the ps host's link per update (read and write);
    - the update period beyond the model's own step (wall): for sync and
      in-graph, the critical path an update adds to the slowest worker's
      step (on 2 shared cores this includes waiting for a core).
    """

    def fmt(value, spec):  # Blank where a figure does not apply.
        return "" if value is None else f"{value:{spec}}"

    if not any("ps_cpu_ms_per_update" in run for run in runs):
        return  # Runs from before these were measured.
    model_cpu = model_step["cpu_ms"] if model_step else None
    model_wall = model_step["wall_ms"] if model_step else None
    rows = []
    runs = [{"compression": "none", **run} for run in runs]
    groups = _group(runs, "workers", "kind", "compression")
    for (workers, kind, wire), group in groups.items():
        ps_cpu = _median(group, "ps_cpu_ms_per_update")
        base = _median(
            groups.get((workers, "tf_keras", "none"), []), "ps_cpu_ms_per_update"
        )
        worker_cpu = _median(group, "worker_cpu_ms_per_step")
        link = _median(group, "ps_link_bytes_per_update")
        rate = _median(group, "updates_per_s")
        period = None if not rate else 1e3 / rate
        rows.append(
            [
                workers,
                kind if wire == "none" else f"{kind}, {wire}",
                fmt(ps_cpu, ".2f"),
                "" if kind == "tf_keras" else harness.times(harness.ratio(ps_cpu, base)),
                fmt(worker_cpu, ".2f"),
                fmt(
                    None if worker_cpu is None or model_cpu is None
                    else worker_cpu - model_cpu, ".2f",
                ),
                fmt(_median(group, "chief_cpu_ms_per_update"), ".2f"),
                fmt(None if link is None else link / 2**20, ".2f"),
                fmt(
                    period - model_wall
                    if kind in ("sync", "in-graph") and period and model_wall
                    else None, ".2f",
                ),
            ]
        )  # fmt: skip
    if model_step:
        print(
            f"the model's own step (one device, one process): "
            f"{model_cpu:.2f} CPU ms, {model_wall:.2f} wall ms"
        )
    print(
        harness.markdown_table(
            rows,
            ["workers", "kind", "ps CPU ms/update", "vs tf_keras",
             "worker CPU ms/step", "beyond the model", "chief CPU ms/update",
             "ps link MB/update", "update period beyond the model (ms)"],
        )
    )  # fmt: skip


def straggler_table(runs: list[dict]) -> None:
    """Per round: the slow-link run against the run without it."""
    rows = []
    for (r,), pair in sorted(_group(runs, "round").items()):
        fast = next((x for x in pair if not x["slow_mbit"] and "error" not in x), None)
        slow = next((x for x in pair if x["slow_mbit"] and "error" not in x), None)
        if fast is None or slow is None:
            rows.append(f"round {r}: a run failed")
            continue
        rows.append(
            [
                r,
                f"{fast['updates_per_s']:.1f}",
                f"{slow['updates_per_s']:.1f}",
                f"{slow['updates_per_s'] / fast['updates_per_s']:.2f}",
                f"{fast['job_s']:.1f}",
                f"{slow['job_s']:.1f}",
                f"{slow['job_s'] / fast['job_s']:.2f}",
            ]
        )
    print(
        harness.markdown_table(
            rows,
            [
                "round",
                "updates/s",
                "updates/s, slow link",
                "ratio (target >= 0.9)",
                "job s",
                "job s, slow link",
                "ratio (target <= 1.1)",
            ],
        )  # fmt: skip
    )


def plot(results: dict, path: Path) -> None:
    panels = [k for k in SWEEPS[:3] if results.get(k)]
    if not panels:
        return
    with harness.figure(
        path, 1, len(panels), figsize=(5 * len(panels), 4), squeeze=False
    ) as (
        _,
        axes,
    ):
        for ax, panel in zip(axes[0], panels, strict=True):
            runs = results[panel]
            if panel == "workers":
                for (kind,), group in _group(runs, "kind").items():
                    xs = sorted({run["workers"] for run in group})
                    ys = [
                        _median(
                            [r for r in group if r["workers"] == x], "examples_per_s"
                        )
                        for x in xs
                    ]
                    ax.plot(xs, ys, marker="o", label=kind)
                ax.set_xscale("log", base=2)
                ax.set_xlabel("workers (1 ps)")
                ax.set_ylabel("examples/s")
            elif panel == "ps":
                for (rows,), group in _group(runs, "rows").items():
                    xs = sorted({run["num_ps"] for run in group})
                    ys = [
                        _median([r for r in group if r["num_ps"] == x], "updates_per_s")
                        for x in xs
                    ]
                    ax.plot(xs, ys, marker="o", label=f"{rows} rows")
                ax.set_xlabel("ps tasks (2 async workers)")
                ax.set_ylabel("ps updates/s")
            else:
                # The uncompressed async runs.
                runs = [
                    r
                    for r in runs
                    if r.get("kind", "async") == "async"
                    and r.get("compression", "none") == "none"
                ]
                xs = sorted({run["mbit"] or 0 for run in runs})
                ys = [
                    _median(
                        [r for r in runs if (r["mbit"] or 0) == x], "examples_per_s"
                    )
                    for x in xs
                ]
                labels = ["unlimited" if not x else f"{x:g}" for x in xs]
                ax.bar(labels, [y or 0 for y in ys])
                ax.set_xlabel("link Mbit/s (2 async workers, 1 ps)")
                ax.set_ylabel("examples/s")
            ax.set_title(panel)
            if panel != "mbit":
                ax.legend()


def parse_args(argv=None) -> argparse.Namespace:
    parser = harness.BenchmarkParser(
        __doc__.split("\n")[0],
        name="scaling",
        quick="smoke run: 1 and 2 workers, 1 and 2 ps, one table size, two rates",
        quick_json=True,
        plot=(
            "the curves' PNG (default docs/images/scaling.png for the whole "
            "sweep; none with --quick or --only)"
        ),
    )
    parser.add_child_role((*KINDS, "embedding", "sync-backup", "model-step"))
    parser.add_argument("--hidden", type=int, default=512, help=argparse.SUPPRESS)
    parser.add_argument(
        "--depth", type=harness.positive, default=2,
        help="the MLP's hidden layers (2: 6 variables; each more adds a kernel "
        "and a bias; e.g. 23: 48 variables, for what packing saves)",
    )  # fmt: skip
    parser.add_rounds(2, "rounds; each runs every configuration, kinds rotated (2)")
    parser.add_argument("--num-ps", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--only", nargs="+", choices=SWEEPS, default=list(SWEEPS))
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument(
        "--workers", nargs="+", type=harness.positive, default=[1, 2, 4, 8]
    )
    parser.add_argument("--ps", nargs="+", type=harness.positive, default=[1, 2, 4])
    parser.add_argument(
        "--rows", nargs="+", type=harness.positive, default=[100_000, 1_000_000]
    )
    parser.add_argument(
        "--mbit", nargs="+", type=float, default=[0, 1000, 100, 10],
        help="link rates in Mbit/s; 0 is unlimited (default 0 1000 100 10)",
    )  # fmt: skip
    parser.add_argument(
        "--compression", nargs="+", default=["none"],
        help="the bandwidth sweep's compressors, each beside the others on "
        "every link (default none; e.g. none 'top_k(ratio=0.01)' fp16); "
        "'@bfloat16' at the end also reads the variables in bfloat16 "
        "(read_dtype): 'top_k(ratio=0.01)@bfloat16', none@bfloat16; a second "
        "'@top_k(ratio=0.05)' reads the change since the last read "
        "(read_compression): 'top_k(ratio=0.01)@bfloat16@top_k(ratio=0.05)'",
    )  # fmt: skip
    parser.add_argument(
        "--mbit-kinds", nargs="+", choices=("async", "in-graph", "sync"),
        default=["async"], help="the bandwidth sweep's modes (default async)",
    )  # fmt: skip
    parser.add_argument(
        "--workers-compression", nargs="+", default=["none"],
        help="the workers sweep's wires besides none, each run for our kinds "
        "(as --compression; e.g. fp16@bfloat16: 16-bit gradients and reads; "
        "unpacked: none, one tensor per variable each way)",
    )  # fmt: skip
    parser.add_argument("--steps", type=harness.positive, default=30)
    parser.add_argument("--epochs", type=harness.positive, default=2)
    parser.add_argument("--batch", type=harness.positive, default=128)
    parser.add_argument(
        "--mbit-steps", type=harness.positive, default=10,
        help="steps per epoch of the bandwidth sweep (10: at 10 Mbit/s a step "
        "of 2 workers takes seconds)",
    )  # fmt: skip
    parser.add_argument(
        "--slow-mbit", type=float, default=2.0,
        help="the straggler sweep's slow link, Mbit/s each way (2)",
    )  # fmt: skip
    parser.add_argument(
        "--steps-per-execution", type=harness.positive, default=10,
        help="every side's steps per call, as docs/cluster.md and TensorFlow's "
        "parameter-server tutorial advise (10)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.quick:
        args.workers, args.ps, args.rows = [1, 2], [1, 2], [50_000]
        args.mbit, args.steps, args.epochs, args.rounds = [0, 10], 10, 1, 1
        args.mbit_steps = 5
    if args.plot is None and not args.quick and set(args.only) == set(SWEEPS):
        # Only the whole sweep redraws the docs' figure: a part of it
        # (`--only`) would replace its curves with fewer.
        args.plot = "docs/images/scaling.png"
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.role:
        args.kind = args.role
        args.workers, args.rows = args.workers[0], args.rows[0]
        return _child_main(args)
    from keras_psdist.testing import hosts

    hosts.check_available()
    harness.use_checkout()
    load_start = harness.loadavg()
    start = time.monotonic()
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="scaling-") as tmp:
        work = Path(tmp)
        sweeps = {
            "workers": sweep_workers,
            "ps": sweep_ps,
            "mbit": sweep_mbit,
            "straggler": sweep_straggler,
        }
        if "workers" in args.only:
            results["model_step"] = [measure_model_step(args, work)]
        for name in args.only:
            results[name] = sweeps[name](args, work)
    tables(results)
    if args.plot and not args.quick:
        plot(results, Path(args.plot))
    settings = ("only", "kinds", "workers", "ps", "rows", "mbit", "mbit_steps", "mbit_kinds",
                "compression", "workers_compression", "slow_mbit", "steps", "depth",
                "epochs", "batch", "steps_per_execution", "rounds", "seed", "quick")  # fmt: skip
    return harness.finish(
        args, settings, load_start, time.monotonic() - start, {}, results
    )


if __name__ == "__main__":
    sys.exit(main())
