"""PSStrategy across local processes: in-graph step time, async throughput,
and both against tf_keras's ParameterServerStrategy.

What it measures
----------------
Three things, in one run, on the MLP of ``benchmarks/strategies.py``
(64 -> 512 -> 512 -> 2, Adam, sparse cross-entropy from logits, global batch
``--batch`` 256, synthetic NumPy data):

1. **In-graph step time.** ``PSStrategy()`` as the chief of a local cluster
   of 2 worker tasks and 2 ps tasks started by
   ``keras_psdist.cluster.launch(mode="in-graph")`` (replicas: the workers'
   CPUs; variables: the ps tasks' CPUs; every task its own process, talking
   gRPC over localhost), against the same 2 replicas in one process: the host
   CPU split into 4 logical devices, ``PSStrategy(devices=[cpu0, cpu1],
   parameter_devices=[cpu2, cpu3])``.
2. **Between-graph async throughput.** ``PSStrategy(mode="between-graph")`` on every
   worker task of a cluster of 1 ps task and 1, then 2, workers
   (``launch(mode="between-graph")``). The batch size is global: with W
   workers each worker step trains on ``batch / W`` examples.

3. **Against tf_keras's ParameterServerStrategy** (``--only vs-tf-keras``).
   Throughput (examples/s) of three ways to train the same model on the same
   cluster shape, 2 worker tasks and 1 ps task, each configured as its own
   docs advise for speed:

   * **tf_keras PSS**: tf_keras (Keras 2) ``model.fit`` under
     ``tf.distribute.ParameterServerStrategy``, this script's child as the
     coordinator (``benchmarks/harness/tf_keras_ps.py``, where TensorFlow's
     tutorial is quoted): ``compile(steps_per_execution=--steps-per-execution)``
     (default 10), ``tf_keras.optimizers.legacy.Adam``, input from a
     ``DatasetCreator(dataset_fn)`` of a repeated dataset with
     ``steps_per_epoch``, as ``fit`` requires there;
   * **async**: ``PSStrategy(mode="between-graph")`` on both workers;
   * **in-graph**: ``PSStrategy()`` as the chief of the same 2 workers + 1 ps.

   Ours take Keras 3's ``Adam`` (the same algorithm and learning rate; Keras
   3 has no other), the same ``steps_per_execution`` (docs/cluster.md
   advises it), and finite NumPy data of exactly one epoch of global batches
   without ``steps_per_epoch``, so every epoch builds its iterators as a
   user's ``fit(x, y)`` does.

   **One epoch is the same examples on every side**: ``S * batch`` for
   ``S`` = ``--vs-lengths`` (40 and 400) and ``batch`` = ``--batch`` (256),
   so 10,240 and 102,400 examples, ``S * batch / 2`` per worker:

   * tf_keras PSS: ``2 * S`` steps of ``batch / 2`` examples (one worker's
     batch each), scheduled by the coordinator in functions of
     ``steps_per_execution`` steps, each run by whichever worker is free; the
     epoch ends when all have finished;
   * async: each worker ``S`` steps of ``batch / 2`` examples (its half of
     each of the ``S`` global batches), in executions of
     ``steps_per_execution`` steps, without waiting for the other;
   * in-graph: ``S`` synchronous steps of ``batch`` examples (``batch / 2``
     on each worker), in executions of ``steps_per_execution`` steps.

   examples/s of a run = the examples of its timed epochs / the wall time
   from the first timed epoch's start to the last one's end (async: over
   both workers, from the first start to the last end). The three run in a
   rotating order, ``--rounds`` rounds (4) per epoch length: tf_keras,
   async, in-graph; async, in-graph, tf_keras; in-graph, tf_keras, async;
   ... Each round's ratios ours / tf_keras (>1: ours faster) are taken
   within the round; the table shows their median and min..max, and says
   when the rounds straddle 1.0 (some faster, some slower). tf_keras is in
   the ``bench`` extra, never a dependency of the library.

Method: every measurement runs in fresh processes (this script re-invoked
with ``--role``; tf_keras's coordinator is ``benchmarks/_tf_keras_ps.py``),
which build the model, run one warm-up epoch of ``--steps``
steps (tracing and the first iterator fills excluded), then ``--epochs`` more
epochs of ``--steps`` steps in the same ``fit`` call, each timed from
``on_epoch_begin`` to ``on_epoch_end`` (Keras syncs the logs at the epoch
end). Process start-up, connecting and warm-up are never timed.

* In-graph: ms/step of a run = median over its timed epochs of epoch time /
  steps. One-process and cluster runs alternate for ``--rounds`` rounds
  (one-process, cluster, one-process, cluster, ...) so drift of the machine's
  load hits both; the ratio cluster / one-process is taken per round and its
  median reported.
* Async: after the warm-up epoch, the workers wait for each other (a file
  barrier), so their timed epochs overlap. Throughput = examples trained in
  the timed epochs, summed over workers, / wall time from the earliest
  worker's first timed epoch start to the latest worker's last epoch end
  (clocks of one machine). The sum of each worker's own examples/s is also
  recorded. 1-worker and 2-worker runs alternate for ``--rounds`` rounds;
  the ratio 2-worker / 1-worker is the median of the per-round ratios.

Children report through JSON files in a temporary directory, not through
their logs; their output goes to log files there, and the last lines of a
failed run's log are printed. ``launch`` stops every process it started,
on success or failure.

On one machine the processes share its cores: the in-graph ratio shows the
cost of gRPC and of separate processes, not a gain, and the async speed-up
is bounded by the number of cores.

How to run
----------
From the repository root::

    python benchmarks/cluster.py --only in-graph
    python benchmarks/cluster.py --only async
    python benchmarks/cluster.py --only vs-tf-keras \\
        --json benchmarks/results/cluster_vs_tf_keras.json
    python benchmarks/cluster.py --quick      # smoke run of all three, 3 to 5 min

Each of the first two takes about 4 minutes on 2 cores; the tf_keras
comparison about 15 on a quiet machine (24 runs of about 20 s of start-up
each, the 12 with 400-step epochs also about 30 s of training), more under
load. Without ``--only`` all three run in turn.

Options: ``--steps`` (steps per epoch of the first two measurements, 40),
``--epochs`` (timed epochs per run, 5), ``--rounds`` (4), ``--batch``
(256), ``--seed``, ``--only in-graph|async|vs-tf-keras``, ``--vs-lengths``
(steps per epoch of the tf_keras comparison, 40,400),
``--steps-per-execution`` (of every side of the tf_keras comparison, 10),
``--json PATH`` (raw numbers + machine; default
``benchmarks/results/cluster.json``, with ``--quick`` ``cluster_quick.json``).
The exit code is 1 if any run failed (its error and the last lines of its
log are in the JSON).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness
from harness import (
    RunFailed,
    finish,
    log_failure,
    median_table,
    read_reports,
    run_dir,
    run_process,
    tf_keras_ps,
    use_checkout,
)
from harness import fmt as _fmt
from harness import log as _log
from harness import median_or_none as _median_or_none
from harness import ok as _ok

# Before TensorFlow is imported anywhere in this process.
harness.prepare_tensorflow()

ROLES = ("local", "in-graph", "async")
# The cluster shapes compared.
IN_GRAPH_WORKERS = 2
IN_GRAPH_PS = 2
ASYNC_PS = 1
ASYNC_WORKERS = (1, 2)
# Against tf_keras's ParameterServerStrategy: 1 ps, 2 workers for everyone.
VS_PS = 1
VS_WORKERS = 2
VS_KEYS = ("tf_keras", "async", "in-graph")
VS_LABELS = {"tf_keras": "tf_keras PSS", "async": "async", "in-graph": "in-graph"}

# Limits that turn a hang into a failure (seconds).
RUN_TIMEOUT_S = 300.0
BARRIER_TIMEOUT_S = 120.0


# --------------------------------------------------------- child processes


def _child_main(args: argparse.Namespace) -> int:
    """What a child process does: build, warm up, time, write its JSON."""
    import keras
    from harness import mlp  # the MLP and data of strategies.py

    import keras_psdist as kpd

    if args.role == "local":
        from keras_psdist.devices import split_host_cpu

        names = split_host_cpu(4)
        strategy = kpd.PSStrategy(devices=names[:2], parameter_devices=names[2:])
    elif args.role == "in-graph":
        strategy = kpd.PSStrategy()
    else:
        strategy = kpd.PSStrategy(mode="between-graph")
    topology = strategy.extended.topology
    workers = topology.num_training_processes
    index = topology.worker_index

    model = mlp.build_model(
        strategy, args.seed, steps_per_execution=args.steps_per_execution
    )
    if args.finite:
        # Exactly `steps` global batches: every epoch builds its own iterator,
        # as a user's `fit(x, y)` does.
        x, y = mlp.make_arrays(args.steps * args.batch, args.seed)
        data = {"x": x, "y": y, "batch_size": args.batch}
    else:
        dataset = mlp.make_dataset(args.batch, args.seed)
        data = {"x": dataset, "steps_per_epoch": args.steps}

    barrier = None
    if args.role == "async":
        barrier = _FileBarrier(Path(args.out_dir), index, workers)
    clock = _make_epoch_clock()(barrier)
    fit_start = time.perf_counter()
    model.fit(
        **data,
        epochs=1 + args.epochs,
        verbose=0,
        shuffle=False,
        callbacks=[clock, keras.callbacks.TerminateOnNaN()],
    )
    timed = clock.epochs[1:]  # The first epoch is the warm-up.
    examples_per_step = args.batch // workers
    report = {
        "role": args.role,
        "mode": topology.mode,
        "task": None if topology.config is None else topology.config.task_name,
        "worker_index": index,
        "num_training_processes": workers,
        "compute_devices": list(topology.compute_devices),
        "parameter_devices": list(topology.parameter_devices),
        "replicas": strategy.num_replicas_in_sync,
        "steps_per_epoch": args.steps,
        "steps_per_execution": args.steps_per_execution,
        "examples_per_step": examples_per_step,
        "examples_per_epoch": examples_per_step * args.steps,
        "optimizer": type(model.optimizer).__module__
        + "."
        + type(model.optimizer).__name__,
        "warmup_s": clock.epochs[0][1] - clock.epochs[0][0],
        "fit_start_to_warmup_end_s": clock.warmup_end_perf - fit_start,
        "barrier_wait_s": clock.barrier_wait_s,
        "epoch_s": [end - begin for begin, end in timed],
        "ms_per_step": [1e3 * (end - begin) / args.steps for begin, end in timed],
        # Wall-clock (time.time) bounds of the timed epochs, comparable
        # between processes of this machine.
        "timed_start_wall": clock.wall[1][0],
        "timed_end_wall": clock.wall[-1][1],
        "examples": examples_per_step * args.steps * len(timed),
        "final_loss": clock.last_loss,
    }
    name = report["task"] or "local"
    path = Path(args.out_dir) / f"{name.replace(':', '_')}.json"
    path.write_text(json.dumps(report, indent=1))
    return 0


class _FileBarrier:
    """Waits until every worker has reached the barrier (files in `out_dir`)."""

    def __init__(self, out_dir: Path, index: int, count: int):
        self.out_dir = out_dir
        self.index = index
        self.count = count

    def __call__(self) -> None:
        (self.out_dir / f"ready_{self.index}").touch()
        deadline = time.monotonic() + BARRIER_TIMEOUT_S
        while True:
            ready = sum(
                (self.out_dir / f"ready_{i}").exists() for i in range(self.count)
            )
            if ready == self.count:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Only {ready} of {self.count} workers reached the barrier "
                    f"after {BARRIER_TIMEOUT_S:g} s."
                )
            time.sleep(0.01)


def _make_epoch_clock():
    import keras

    class EpochClock(keras.callbacks.Callback):
        """Begin/end of each epoch; runs `barrier` after the first (warm-up)."""

        def __init__(self, barrier=None):
            super().__init__()
            self.barrier = barrier
            self.epochs: list[tuple[float, float]] = []
            self.wall: list[tuple[float, float]] = []
            self.barrier_wait_s = 0.0
            self.warmup_end_perf = None
            self.last_loss = None
            self._begin = None

        def on_epoch_begin(self, epoch, logs=None):
            self._begin = (time.perf_counter(), time.time())

        def on_epoch_end(self, epoch, logs=None):
            end = (time.perf_counter(), time.time())
            self.epochs.append((self._begin[0], end[0]))
            self.wall.append((self._begin[1], end[1]))
            if logs and "loss" in logs:
                self.last_loss = float(logs["loss"])
            if epoch == 0:
                self.warmup_end_perf = end[0]
                if self.barrier is not None:
                    self.barrier()
                    self.barrier_wait_s = time.perf_counter() - end[0]

    return EpochClock


# ------------------------------------------------------------ orchestration


def _child_command(
    role: str, out_dir: Path, args: argparse.Namespace, steps_per_execution: int = 1
) -> list[str]:
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--role",
        role,
        "--out-dir",
        str(out_dir),
        "--steps",
        str(args.steps),
        "--epochs",
        str(args.epochs),
        "--batch",
        str(args.batch),
        "--seed",
        str(args.seed),
        "--steps-per-execution",
        str(steps_per_execution),
        *(["--finite"] if args.finite else []),
    ]


def run_local(work: Path, args: argparse.Namespace) -> dict:
    """The one-process baseline: 2 logical CPU replicas + 2 parameter devices."""
    out_dir, log = run_dir(work, "local_")
    start = time.perf_counter()
    code = run_process(_child_command("local", out_dir, args), log, RUN_TIMEOUT_S)
    (report,) = read_reports(out_dir, 1, log, code)
    report["process_wall_s"] = time.perf_counter() - start
    return report


def run_cluster(
    work: Path,
    role: str,
    num_ps: int,
    num_workers: int,
    args: argparse.Namespace,
    steps_per_execution: int = 1,
) -> list[dict]:
    """One `launch` of a local cluster; returns the training processes' reports."""

    mode = "between-graph" if role == "async" else "in-graph"
    out_dir, log = run_dir(work, f"{role}_{num_workers}w_")
    start = time.perf_counter()
    code = harness.launch_logged(
        _child_command(role, out_dir, args, steps_per_execution),
        log,
        num_ps=num_ps,
        num_workers=num_workers,
        mode=mode,
        timeout_s=RUN_TIMEOUT_S,
    )
    expected = num_workers if role == "async" else 1
    reports = read_reports(out_dir, expected, log, code)
    for report in reports:
        report["launch_wall_s"] = time.perf_counter() - start
    return reports


def _ms_per_step(report: dict) -> float:
    return statistics.median(report["ms_per_step"])


def _throughput(reports: list[dict]) -> dict:
    examples = sum(r["examples"] for r in reports)
    span = max(r["timed_end_wall"] for r in reports) - min(
        r["timed_start_wall"] for r in reports
    )
    return {
        "examples": examples,
        "span_s": span,
        "examples_per_s": examples / span,
        "sum_of_worker_examples_per_s": sum(
            r["examples"] / sum(r["epoch_s"]) for r in reports
        ),
    }


def _in_graph_run(work: Path, args, name: str, r: int) -> dict:
    _log(f"in-graph round {r + 1}/{args.rounds}: {name} ...")
    if name == "one_process":
        report = run_local(work, args)
    else:
        (report,) = run_cluster(work, "in-graph", IN_GRAPH_PS, IN_GRAPH_WORKERS, args)
    _log(f"  {_ms_per_step(report):.1f} ms/step")
    return report


def measure_in_graph(work: Path, args, rounds: list[dict]) -> None:
    """One process, then the cluster, in every round (always that order)."""
    measured = harness.interleaved_rounds(
        ("one_process", "cluster"),
        functools.partial(_in_graph_run, work, args),
        args.rounds,
        rotate=False,
        catch=(RunFailed,),
        on_error=log_failure,
    )
    for entry in measured.entries():
        if _ok(entry, "one_process") and _ok(entry, "cluster"):
            entry["ratio"] = _ms_per_step(entry["cluster"]) / _ms_per_step(
                entry["one_process"]
            )
        rounds.append(entry)


def _async_run(work: Path, args, workers: int, r: int) -> dict:
    _log(f"async round {r + 1}/{args.rounds}: {workers} worker(s) ...")
    reports = run_cluster(work, "async", ASYNC_PS, workers, args)
    result = {"workers": reports, **_throughput(reports)}
    _log(f"  {result['examples_per_s']:.0f} examples/s")
    return result


def measure_async(work: Path, args, rounds: list[dict]) -> None:
    """1 worker, then 2, in every round (always that order)."""
    measured = harness.interleaved_rounds(
        {f"workers_{w}": w for w in ASYNC_WORKERS},
        functools.partial(_async_run, work, args),
        args.rounds,
        rotate=False,
        catch=(RunFailed,),
        on_error=log_failure,
    )
    for entry in measured.entries():
        if _ok(entry, "workers_1") and _ok(entry, "workers_2"):
            entry["ratio"] = (
                entry["workers_2"]["examples_per_s"]
                / entry["workers_1"]["examples_per_s"]
            )
        rounds.append(entry)


def _vs_tf_keras_run(work: Path, args, steps: int, key: str, r: int) -> dict:
    """One run of the tf_keras comparison at `steps` global batches per epoch:
    `key`'s examples/s over the same examples per epoch on every side."""
    _log(f"vs tf_keras, {steps}-step epochs, round {r + 1}: {key} ...")
    if key == "tf_keras":
        # One step is one worker's batch: twice the steps for the same examples.
        result = tf_keras_ps.run(
            work,
            num_workers=VS_WORKERS,
            num_ps=VS_PS,
            steps_per_epoch=steps * VS_WORKERS,
            per_worker_batch=args.batch // VS_WORKERS,
            epochs=args.epochs,
            steps_per_execution=args.steps_per_execution,
            seed=args.seed,
            timeout_s=RUN_TIMEOUT_S,
        )
    else:
        run_args = argparse.Namespace(**{**vars(args), "steps": steps, "finite": True})
        reports = run_cluster(
            work, key, VS_PS, VS_WORKERS, run_args, args.steps_per_execution
        )
        if key == "async":
            result = {"workers": reports, **_throughput(reports)}
        else:
            (report,) = reports
            result = {**report, **_throughput(reports)}
    result["examples_per_epoch"] = steps * args.batch
    _log(f"  {result['examples_per_s']:.0f} examples/s")
    return result


def measure_vs_tf_keras(work: Path, args, rounds: list[dict]) -> None:
    """examples/s of tf_keras PSS, async and in-graph PSStrategy on the same
    cluster shape and the same examples per epoch, at each epoch length, in
    an order that rotates from round to round."""
    for steps in args.vs_lengths:
        measured = harness.interleaved_rounds(
            VS_KEYS,
            functools.partial(_vs_tf_keras_run, work, args, steps),
            args.rounds,
            rotate=True,
            catch=(RunFailed,),
            on_error=log_failure,
        )
        entries = measured.entries(steps=steps)
        for entry, order in zip(entries, measured.orders, strict=True):
            entry["order"] = order
            rounds.append(entry)
            for key in VS_KEYS[1:]:
                if _ok(entry, key) and _ok(entry, "tf_keras"):
                    entry[f"{key}_ratio"] = (
                        entry[key]["examples_per_s"]
                        / entry["tf_keras"]["examples_per_s"]
                    )


def _spread(values: list[float]) -> dict:
    """Median, min and max of per-round ratios, and whether they straddle 1.0.

    >>> _spread([0.9, 1.1, 1.2])["straddles_1"], _spread([])["median"]
    (True, None)
    """
    return {
        "values": values,
        "median": _median_or_none(values),
        "min": min(values, default=None),
        "max": max(values, default=None),
        "straddles_1": bool(values) and min(values) < 1.0 < max(values),
    }


def summarize_vs_tf_keras(rounds: list[dict], args) -> dict:
    """The configuration of each side and, per epoch length, the medians of
    examples/s and the spread of the per-round ratios ours / tf_keras."""
    lengths = {}
    for steps in args.vs_lengths:
        entries = [e for e in rounds if e["steps"] == steps]
        row: dict = {
            "examples_per_epoch": steps * args.batch,
            "orders": [e["order"] for e in entries],
        }
        for key in VS_KEYS:
            rates = [e[key]["examples_per_s"] for e in entries if _ok(e, key)]
            row[key] = {"examples_per_s": rates, "median": _median_or_none(rates)}
        for key in VS_KEYS[1:]:
            row[f"{key}_ratio"] = _spread(
                [e[f"{key}_ratio"] for e in entries if f"{key}_ratio" in e]
            )
        lengths[steps] = row
    per_worker = args.batch // VS_WORKERS
    spe = args.steps_per_execution
    return {
        "configuration": {
            "cluster": f"{VS_WORKERS} workers + {VS_PS} ps on this machine",
            "tf_keras": (
                "tf_keras Model.fit under tf.distribute.ParameterServerStrategy "
                f"(coordinator as chief); compile(steps_per_execution={spe}), "
                "tf_keras.optimizers.legacy.Adam(1e-3); DatasetCreator(dataset_fn) "
                f"of a repeated dataset; epoch = {VS_WORKERS} x S steps of "
                f"{per_worker} examples"
            ),
            "async": (
                'PSStrategy(mode="between-graph") on each worker; compile('
                f"steps_per_execution={spe}), keras.optimizers.Adam(1e-3); finite "
                f"NumPy data; epoch = S steps of {per_worker} examples per worker"
            ),
            "in-graph": (
                f"PSStrategy() as chief; compile(steps_per_execution={spe}), "
                "keras.optimizers.Adam(1e-3); finite NumPy data; epoch = S steps "
                f"of {args.batch} examples ({per_worker} per worker)"
            ),
        },
        "lengths": lengths,
    }


def format_vs_tf_keras(summary: dict, args) -> str:
    """The comparison's table (kept for the JSON), a note under it for each
    ratio whose rounds straddle 1.0."""
    lines = [
        "",
        f"Against tf_keras ParameterServerStrategy + ClusterCoordinator "
        f"({VS_WORKERS} workers + {VS_PS} ps), each side as its docs advise: "
        f"steps_per_execution {args.steps_per_execution} everywhere, tf_keras "
        "with its legacy Adam and a DatasetCreator; the same examples per epoch "
        f"on every side (tf_keras: {VS_WORKERS}x the steps of one worker's "
        f"batch). examples/s, median of {args.rounds} rounds in rotating order; "
        "ratios ours / tf_keras per round: median (min..max).",
    ]
    columns = [
        harness.Column("examples/epoch", 14),
        harness.Column("steps (ours)", 12),
        harness.Column("steps (tf_keras)", 16),
        harness.Column("tf_keras PSS", 12),
        harness.Column("async", 8),
        harness.Column("in-graph", 8),
        harness.Column("async/PSS", 9),
        harness.Column("min..max", 11),
        harness.Column("in-graph/PSS", 12),
        harness.Column("min..max", 11),
    ]
    rows: list = []
    notes = []
    for steps, row in summary["lengths"].items():
        cells = [f"{row['examples_per_epoch']:,}", steps, steps * VS_WORKERS]
        cells += [_fmt(row[k]["median"], ",.0f") for k in VS_KEYS]
        for key in VS_KEYS[1:]:
            spread = row[f"{key}_ratio"]
            cells += [
                _fmt(spread["median"], ".2f", "x"),
                harness.value_range(spread["values"], ".2f"),
            ]
            if spread["straddles_1"]:
                notes.append(
                    f"{VS_LABELS[key]} / tf_keras at {steps}-step epochs straddles "
                    f"1.0 ({spread['min']:.2f}..{spread['max']:.2f}): the rounds "
                    "disagree on which is faster."
                )
        rows.append(cells)
    measured = any(
        row[f"{k}_ratio"]["values"]
        for row in summary["lengths"].values()
        for k in VS_KEYS[1:]
    )
    if measured and not notes:
        notes.append("No ratio's rounds straddle 1.0.")
    rows += notes
    lines += harness.text_table(columns, rows)
    return "\n".join(lines)


def format_vs_rounds(rounds: list[dict]) -> str:
    """One line per round of the tf_keras comparison, in the order it ran."""
    lines = []
    for e in rounds:
        rates = ", ".join(
            f"{VS_LABELS[k]} "
            + (f"{e[k]['examples_per_s']:,.0f}" if _ok(e, k) else "failed")
            for k in e["order"]
        )
        ratios = ", ".join(
            f"{VS_LABELS[k]}/PSS {e[f'{k}_ratio']:.2f}x"
            for k in VS_KEYS[1:]
            if f"{k}_ratio" in e
        )
        lines.append(
            f"  vs tf_keras {e['steps']} steps, round {e['round'] + 1}: {rates} "
            f"examples/s; {ratios or 'no ratio'}"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------ report


def summarize(in_graph: list[dict], async_rounds: list[dict]) -> dict:
    one = [_ms_per_step(e["one_process"]) for e in in_graph if _ok(e, "one_process")]
    clu = [_ms_per_step(e["cluster"]) for e in in_graph if _ok(e, "cluster")]
    ratios = [e["ratio"] for e in in_graph if "ratio" in e]
    w1 = [e["workers_1"]["examples_per_s"] for e in async_rounds if _ok(e, "workers_1")]
    w2 = [e["workers_2"]["examples_per_s"] for e in async_rounds if _ok(e, "workers_2")]
    speedups = [e["ratio"] for e in async_rounds if "ratio" in e]
    return {
        "in_graph": {
            "one_process_ms_per_step": one,
            "cluster_ms_per_step": clu,
            "ratios": ratios,
            "one_process_median": _median_or_none(one),
            "cluster_median": _median_or_none(clu),
            "ratio_median": _median_or_none(ratios),
        },
        "async": {
            "workers_1_examples_per_s": w1,
            "workers_2_examples_per_s": w2,
            "ratios": speedups,
            "workers_1_median": _median_or_none(w1),
            "workers_2_median": _median_or_none(w2),
            "ratio_median": _median_or_none(speedups),
        },
    }


def format_table(summary: dict, args, sections: tuple[str, ...]) -> str:
    """The medians over rounds of the measurements in `sections`."""
    ig, asy = summary["in_graph"], summary["async"]

    lines = [
        f"MLP 64-512-512-2, Adam, global batch {args.batch}; per run 1 warm-up "
        f"epoch + {args.epochs} timed epochs of {args.steps} steps; "
        f"{args.rounds} rounds, alternating; medians over rounds (min..max)."
    ]
    if "in-graph" in sections:
        rows = [
            (
                "one process (4 logical CPUs)",
                ig["one_process_median"],
                ig["one_process_ms_per_step"],
                ".1f",
            ),
            (
                "cluster: chief + 2 workers + 2 ps",
                ig["cluster_median"],
                ig["cluster_ms_per_step"],
                ".1f",
            ),
            (
                "ratio cluster / one process",
                ig["ratio_median"],
                ig["ratios"],
                ".2f",
                True,
            ),
        ]
        lines += [
            "",
            *median_table("In-graph step time, 2 replicas", "ms/step", rows, 36),
        ]
    if "async" in sections:
        rows = [
            (
                "1 worker",
                asy["workers_1_median"],
                asy["workers_1_examples_per_s"],
                ".0f",
            ),
            (
                "2 workers (sum over workers)",
                asy["workers_2_median"],
                asy["workers_2_examples_per_s"],
                ".0f",
            ),
            (
                "ratio 2 workers / 1 worker",
                asy["ratio_median"],
                asy["ratios"],
                ".2f",
                True,
            ),
        ]
        lines += [
            "",
            *median_table("Between-graph async, 1 ps", "examples/s", rows, 36),
        ]
    return "\n".join(lines)


def format_rounds(in_graph: list[dict], async_rounds: list[dict]) -> str:
    """One line per round: what each run measured, in the order it ran."""

    def line(kind, entry, runs, show):
        cells = ", ".join(
            f"{label} {show(entry[key]) if _ok(entry, key) else 'failed'}"
            for key, label in runs
        )
        ratio = f"{entry['ratio']:.2f}x" if "ratio" in entry else "-"
        return f"  {kind} {entry['round'] + 1}: {cells}, ratio {ratio}"

    def ms(report):
        return f"{_ms_per_step(report):.1f} ms/step"

    def rate(result):
        return f"{result['examples_per_s']:.0f} examples/s"

    in_graph_runs = (("one_process", "one process"), ("cluster", "cluster"))
    async_runs = (("workers_1", "1 worker"), ("workers_2", "2 workers"))
    return "\n".join(
        [
            "Per round:",
            *(line("in-graph", e, in_graph_runs, ms) for e in in_graph),
            *(line("async", e, async_runs, rate) for e in async_rounds),
        ]
    )


# --------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = harness.BenchmarkParser(
        "PSStrategy across local processes: in-graph step time vs "
        "one process, between-graph async throughput with 1 and 2 workers, "
        "and both against tf_keras's ParameterServerStrategy.",
        name="cluster",
        quick="smoke run: 5-step epochs (the tf_keras comparison: 10), "
        "2 timed epochs, 1 round",
        quick_json=True,
    )
    parser.add_argument(
        "--steps",
        type=harness.positive,
        default=40,
        help="steps per epoch of the in-graph and async measurements (default 40)",
    )
    parser.add_argument(
        "--epochs",
        type=harness.positive,
        default=5,
        help="timed epochs per run, after 1 warm-up epoch (default 5)",
    )
    parser.add_rounds(
        4,
        "rounds of each comparison (default 4); the tf_keras comparison's "
        "order rotates from round to round",
    )
    parser.add_argument(
        "--batch",
        type=harness.positive,
        default=256,
        help="global batch size (default 256)",
    )
    parser.add_argument(
        "--only",
        choices=("in-graph", "async", "vs-tf-keras"),
        help="run only one of the three measurements",
    )
    parser.add_argument(
        "--vs-lengths",
        type=harness.int_list,
        default=[40, 400],
        help="epoch lengths of the tf_keras comparison, in global batches "
        "(default 40,400); tf_keras runs twice the steps of one worker's batch",
    )
    parser.add_argument(
        "--steps-per-execution",
        type=harness.positive,
        default=tf_keras_ps.STEPS_PER_EXECUTION,
        help="steps_per_execution of every side of the tf_keras comparison "
        f"(default {tf_keras_ps.STEPS_PER_EXECUTION}, as TensorFlow's "
        "parameter-server tutorial)",
    )
    parser.add_argument("--finite", action="store_true", help=argparse.SUPPRESS)
    parser.add_child_role(ROLES)
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.epochs, args.rounds = 5, 2, 1
        args.vs_lengths = [10]
    if args.batch % 4:
        parser.error(f"--batch must be a multiple of 4. Received: {args.batch}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role:
        return _child_main(args)
    if args.only in (None, "vs-tf-keras") and not importlib.util.find_spec("tf_keras"):
        # Before any run, not after the first two measurements.
        print(
            "The tf_keras comparison needs tf_keras, in the `bench` extra: "
            'pip install -e ".[cpu,bench]". Or leave it out: --only in-graph, '
            "--only async.",
            file=sys.stderr,
        )
        return 2
    use_checkout()
    # TensorFlow's import prints its banner here, not in the middle of the runs.
    import keras_psdist.cluster  # noqa: F401

    start = time.perf_counter()
    load_start = harness.loadavg()
    in_graph: list[dict] = []
    async_rounds: list[dict] = []
    vs_rounds: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="kpd_cluster_bench_") as tmp:
        work = Path(tmp)
        if args.only in (None, "in-graph"):
            measure_in_graph(work, args, in_graph)
        if args.only in (None, "async"):
            measure_async(work, args, async_rounds)
        if args.only in (None, "vs-tf-keras"):
            measure_vs_tf_keras(work, args, vs_rounds)
    wall_s = time.perf_counter() - start
    summary = summarize(in_graph, async_rounds)
    summary["vs_tf_keras"] = summarize_vs_tf_keras(vs_rounds, args)
    print(format_rounds(in_graph, async_rounds))
    if vs_rounds:
        print(format_vs_rounds(vs_rounds))
    print()
    sections = [k for k in ("in-graph", "async") if args.only in (None, k)]
    if sections:
        print(format_table(summary, args, tuple(sections)))
    if vs_rounds:
        print(format_vs_tf_keras(summary["vs_tf_keras"], args))
    return finish(
        args,
        (
            "steps",
            "epochs",
            "rounds",
            "batch",
            "seed",
            "quick",
            "vs_lengths",
            "steps_per_execution",
        ),
        load_start,
        wall_s,
        summary,
        {
            "in_graph_rounds": in_graph,
            "async_rounds": async_rounds,
            "vs_tf_keras_rounds": vs_rounds,
        },
    )


if __name__ == "__main__":
    sys.exit(main())
