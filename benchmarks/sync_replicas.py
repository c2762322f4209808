"""SyncReplicaStrategy with a straggler: updates/s with and without a backup worker.

What it measures
----------------
Updates per second (the chief's global step, i.e. updates applied) of
``SyncReplicaStrategy`` on a cluster of 3 worker processes + 1 ps started by
``keras_psdist.cluster.launch(mode="between-graph")``, in three
configurations run side by side in one invocation:

1. ``no straggler, R=3``: every worker at full speed,
   ``replicas_to_aggregate=3``. Its rate is the fast workers' rate, the
   reference for the other two.
2. ``straggler, R=3``: worker 2 sleeps ``--sleep`` s (0.2) after every step.
   Every update waits for it, so the run goes at the straggler's pace:
   expected ratio to (1) about the straggler's own rate over the fast rate.
3. ``straggler, R=2``: the same straggler, ``replicas_to_aggregate=2``: one
   backup worker. Workers 0 and 1 make the updates without waiting for
   worker 2, whose late gradients are dropped as stale: expected ratio to
   (1) close to 1.

Model and data: the digits MLP of ``tests/cluster_jobs/digits_job.py``
(64 -> 64 -> 64 -> 10, Adam 0.003, sparse cross-entropy from logits) on
scikit-learn's ``load_digits`` (bundled with scikit-learn, no download):
the first 1,500 images, shuffled per worker and repeated, ``--batch`` 60
per worker and step. A small model keeps a step short, so the straggler's
sleep dominates its step as a slow machine's compute would.

Where the rate is measured, and why
-----------------------------------
Only while all 3 workers are training, at their steady pace:

* Start: each worker touches a file once it has finished ``--warmup-steps``
  (5) steps (its train step traced, its first batches read). At the end of
  each of its steps the chief looks for the three files; at the first step
  end where all exist it reads ``counts()`` (global step and per-worker
  counts) and the time.
* End: ``--seconds`` (20; ``--quick`` 10) later, at the end of a step, the
  chief reads ``counts()`` and the time again, stops its ``fit`` and touches
  a ``done`` file; every other worker stops at its next step end after it
  sees that file. So no worker has finished while the window is open (the
  script checks that each worker's last step ended after the window did).

Updates/s = (global step at the end - at the start) / (time between the two
reads). The window has a fixed length rather than a fixed number of steps
because the configurations' rates differ by an order of magnitude (a step
count that gives (3) 20 s gives (1) 2 s). Both reads happen at the end of a
chief step, i.e. just after an update released the chief, so they are at the
same phase of the update cycle. A window of steps of the whole ``fit`` would
mix in things this does not measure: tracing, workers started at different
times, and the end of a run, when fast workers that finished early leave the
straggler to make the last updates (with R=2 after one fast worker leaves,
every update waits for the straggler again).

Each worker also records the time and its process's CPU time at each of
its step ends, from which its own steps/s and the cores it kept busy in the
window are computed (the straggler's steps/s under R=2 is its own pace, with
nobody to wait for: the reference for ratio (2)/(1)). Per worker, the
chief's counts of gradients applied, dropped as stale and dropped at the end
are reported in the window and for the whole run (read after ``fit``).

Method: every run is a fresh ``launch`` (4 processes: they import
TensorFlow, connect, build and trace, none of which is timed). The three
configurations run in ``--rounds`` rounds (3; ``--quick`` 1), their order
rotating between rounds so drift of the machine's load hits each; the
ratios are taken per round and their median reported. Each worker runs
``benchmarks/_sync_replicas_job.py`` and reports through a JSON file in a
temporary directory; the processes' output goes to a log file there, and the
last lines of a failed run's log are printed.

On one machine the 4 processes share its cores. The no-straggler run has 3
workers computing, the straggler runs effectively 2 (the straggler sleeps
most of the time), so other load on the machine slows the baseline most, and
ratio (3)/(1) can then come out above 1 rather than just below it; with R=2
an update also waits for the slower of 2 workers instead of 3. The
per-worker cores (CPU seconds per second of the window) show where the CPU
goes. Run it on an otherwise idle machine, or read the rounds' spread.

How to run
----------
From the repository root::

    python benchmarks/sync_replicas.py --quick    # 1 round, 10 s windows, 2 to 3 min
    python benchmarks/sync_replicas.py            # 3 rounds, 20 s windows, 3 to 4x that

Options: ``--sleep`` (the straggler's sleep per step, 0.2 s), ``--seconds``
(window length), ``--warmup-steps`` (5), ``--rounds``, ``--batch`` (60 per
worker), ``--seed``, ``--json PATH`` (raw numbers + machine; default
``benchmarks/results/sync_replicas.json``, with ``--quick``
``sync_replicas_quick.json``). The exit code is 1 if any run failed (its
error and the last lines of its log are in the JSON).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import tempfile
import time
from pathlib import Path

import harness
from harness import RunFailed, finish, log_failure, read_reports, run_dir, use_checkout
from harness import fmt as _fmt
from harness import log as _log
from harness import median_or_none as _median_or_none
from harness import non_negative_float as _non_negative_float
from harness import ok as _ok
from harness import positive as _positive
from harness import positive_float as _positive_float

# Before TensorFlow is imported anywhere in this process.
harness.prepare_tensorflow()

JOB = Path(__file__).resolve().parent / "_sync_replicas_job.py"
NUM_WORKERS = 3
NUM_PS = 1
STRAGGLER = 2  # worker index; worker 0 is the chief

# A limit that turns a hang into a failure (seconds).
RUN_TIMEOUT_S = 300.0


@dataclasses.dataclass(frozen=True)
class Configuration:
    """One of the compared runs."""

    key: str
    label: str
    replicas_to_aggregate: int
    straggler: bool


CONFIGURATIONS = (
    Configuration("no_straggler", "no straggler, R=3", 3, False),
    Configuration("straggler_r3", "straggler, R=3 (no backup)", 3, True),
    Configuration("straggler_r2", "straggler, R=2 (1 backup worker)", 2, True),
)


# ------------------------------------------------------------ orchestration


def _child_command(
    config: Configuration, out_dir: Path, args: argparse.Namespace
) -> list[str]:
    return [
        sys.executable,
        str(JOB),
        "--out-dir",
        str(out_dir),
        "--num-workers",
        str(NUM_WORKERS),
        "--straggler",
        str(STRAGGLER),
        "--replicas-to-aggregate",
        str(config.replicas_to_aggregate),
        "--sleep",
        str(args.sleep if config.straggler else 0.0),
        "--seconds",
        str(args.seconds),
        "--warmup-steps",
        str(args.warmup_steps),
        "--batch",
        str(args.batch),
        "--seed",
        str(args.seed),
    ]


def run_configuration(work: Path, config: Configuration, args) -> dict:
    """One `launch` of 3 workers + 1 ps; returns the run's measurements."""

    out_dir, log = run_dir(work, f"{config.key}_")
    start = time.perf_counter()
    code = harness.launch_logged(
        _child_command(config, out_dir, args),
        log,
        num_ps=NUM_PS,
        num_workers=NUM_WORKERS,
        mode="between-graph",
        timeout_s=RUN_TIMEOUT_S,
    )
    workers = sorted(
        read_reports(out_dir, NUM_WORKERS, log, code, "worker_*.json"),
        key=lambda r: r["worker"],
    )
    return {
        "launch_wall_s": time.perf_counter() - start,
        **_measure(workers),
        "workers": workers,
    }


def _measure(workers: list[dict]) -> dict:
    """Updates/s and per-worker numbers over the chief's window."""
    (chief,) = [w for w in workers if w["is_chief"]]
    window = chief["window"]
    if window is None or "end" not in window:
        raise RunFailed("the chief's fit ended before its window closed")
    start, end = window["start"], window["end"]
    span = end["wall"] - start["wall"]
    per_worker = []
    for w in workers:
        inside = [
            i
            for i, t in enumerate(w["step_ends_wall"])
            if start["wall"] < t <= end["wall"]
        ]
        # Cores this process kept busy, between its first and last step end
        # in the window.
        cores = None
        if len(inside) > 1:
            first, last = inside[0], inside[-1]
            cores = (w["step_ends_cpu"][last] - w["step_ends_cpu"][first]) / (
                w["step_ends_wall"][last] - w["step_ends_wall"][first]
            )
        per_worker.append(
            {
                "worker": w["worker"],
                "straggler": w["straggler"],
                "steps_per_s": len(inside) / span,
                "cpu_cores": cores,
                **{
                    k: end[k][w["worker"]] - start[k][w["worker"]]
                    for k in ("applied", "dropped_stale", "dropped_at_end")
                },
                "after_fit": {
                    k: w["counts_after_fit"][k][w["worker"]]
                    for k in ("applied", "dropped_stale", "dropped_at_end")
                },
                # The chief's fit ends by closing the window; every other
                # worker must have finished a step after it closed.
                "trained_through_window": w["is_chief"]
                or w["step_ends_wall"][-1] >= end["wall"],
            }
        )
    updates = end["global_step"] - start["global_step"]
    return {
        "window_s": span,
        "updates": updates,
        "updates_per_s": updates / span,
        "global_step_after_fit": chief["counts_after_fit"]["global_step"],
        "test_accuracy": chief["test_accuracy"],
        "all_trained_through_window": all(
            p["trained_through_window"] for p in per_worker
        ),
        "per_worker": per_worker,
    }


def _logged_run(work: Path, args, config: Configuration, r: int) -> dict:
    _log(f"round {r + 1}/{args.rounds}: {config.label} ...")
    result = run_configuration(work, config, args)
    _log(
        f"  {result['updates_per_s']:.1f} updates/s "
        f"({result['updates']} in {result['window_s']:.1f} s)"
    )
    return result


def measure(work: Path, args, rounds: list[dict]) -> None:
    """The configurations in rounds, their order rotating."""
    measured = harness.interleaved_rounds(
        {c.key: c for c in CONFIGURATIONS},
        functools.partial(_logged_run, work, args),
        args.rounds,
        catch=(RunFailed,),
        on_error=log_failure,
    )
    for entry in measured.entries():
        _ratios(entry)
        rounds.append(entry)


def _ratios(entry: dict) -> None:
    if not _ok(entry, "no_straggler"):
        return
    fast = entry["no_straggler"]["updates_per_s"]
    for key in ("straggler_r3", "straggler_r2"):
        if _ok(entry, key):
            entry[f"ratio_{key}"] = entry[key]["updates_per_s"] / fast
    if _ok(entry, "straggler_r2"):
        # The straggler's own pace when nobody waits for it.
        (own,) = [
            p["steps_per_s"]
            for p in entry["straggler_r2"]["per_worker"]
            if p["straggler"]
        ]
        entry["straggler_own_steps_per_s"] = own
        entry["ratio_straggler_own"] = own / fast


# ------------------------------------------------------------------ report


def summarize(rounds: list[dict]) -> dict:
    summary = {}
    for config in CONFIGURATIONS:
        rates = [e[config.key]["updates_per_s"] for e in rounds if _ok(e, config.key)]
        summary[config.key] = {
            "updates_per_s": rates,
            "median": _median_or_none(rates),
        }
    for key in ("straggler_r3", "straggler_r2", "straggler_own"):
        ratios = [e[f"ratio_{key}"] for e in rounds if f"ratio_{key}" in e]
        summary[f"ratio_{key}"] = {"values": ratios, "median": _median_or_none(ratios)}
    own = [
        e["straggler_own_steps_per_s"]
        for e in rounds
        if "straggler_own_steps_per_s" in e
    ]
    summary["straggler_own_steps_per_s"] = {
        "values": own,
        "median": _median_or_none(own),
    }
    return summary


def format_table(summary: dict, args) -> str:
    """Medians over rounds: updates/s per configuration and the ratios."""

    def row(label, entry, spec, ratio=False):
        values = entry.get("updates_per_s", entry.get("values"))
        return (label, entry["median"], values, spec, ratio)

    rows = [
        *(row(c.label, summary[c.key], ".1f") for c in CONFIGURATIONS),
        row(
            "straggler's own steps/s (in the R=2 run)",
            summary["straggler_own_steps_per_s"],
            ".1f",
        ),
        "",
        row(
            "R=2 with straggler / no straggler",
            summary["ratio_straggler_r2"],
            ".2f",
            ratio=True,
        ),
        row(
            "R=3 with straggler / no straggler",
            summary["ratio_straggler_r3"],
            ".2f",
            ratio=True,
        ),
        row(
            "straggler's own rate / no straggler",
            summary["ratio_straggler_own"],
            ".2f",
            ratio=True,
        ),
    ]
    return "\n".join(
        [
            f"Digits MLP 64-64-64-10, Adam, batch {args.batch} per worker; "
            f"{NUM_WORKERS} workers + {NUM_PS} ps on 127.0.0.1; the straggler "
            f"(worker {STRAGGLER}) sleeps {args.sleep:g} s after each step; "
            f"{args.seconds:g} s windows after every worker's "
            f"{args.warmup_steps}th step; {args.rounds} round(s), medians "
            "(min..max).",
            "",
            *harness.median_table("", "updates/s", rows, 44),
        ]
    )


def format_rounds(rounds: list[dict]) -> str:
    """Per round and configuration: the rate, and per worker its steps/s, the
    cores its process kept busy, and the chief's counts (applied / dropped
    stale / dropped at the end) in the window and, in brackets, for the whole
    run."""
    lines = [
        "Per run; per worker: steps/s and CPU cores busy in the window, gradients "
        "applied / dropped stale / dropped at the end in the window [whole run]:"
    ]
    for e in rounds:
        for config in CONFIGURATIONS:
            if config.key not in e:
                continue
            result = e[config.key]
            if "error" in result:
                lines.append(f"  round {e['round'] + 1}, {config.label}: failed")
                continue
            lines.append(
                f"  round {e['round'] + 1}, {config.label}: "
                f"{result['updates_per_s']:.1f} updates/s ({result['updates']} in "
                f"{result['window_s']:.1f} s; {result['global_step_after_fit']} "
                f"in the run; test accuracy {result['test_accuracy']:.3f})"
                + (
                    ""
                    if result["all_trained_through_window"]
                    else " WARNING: a worker stopped inside the window"
                )
            )
            for p in result["per_worker"]:
                a = p["after_fit"]
                lines.append(
                    f"    worker {p['worker']}{' (straggler)' if p['straggler'] else ''}: "
                    f"{p['steps_per_s']:5.1f} steps/s, {_fmt(p['cpu_cores'], '.2f', ' cores')}, "
                    f"{p['applied']} / {p['dropped_stale']} / {p['dropped_at_end']} "
                    f"[{a['applied']} / {a['dropped_stale']} / {a['dropped_at_end']}]"
                )
    return "\n".join(lines)


# --------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = harness.BenchmarkParser(
        "SyncReplicaStrategy, 3 workers + 1 ps, one straggler: "
        "updates/s with replicas_to_aggregate=3 and =2 against no straggler.",
        name="sync_replicas",
        quick="smoke run: 1 round of 10 s windows",
        quick_json=True,
    )
    parser.add_argument(
        "--sleep",
        type=_non_negative_float,
        default=0.2,
        help="the straggler's sleep after each step, in seconds (default 0.2)",
    )
    parser.add_argument(
        "--seconds",
        type=_positive_float,
        help="length of the measured window, in seconds (default 20; --quick 10)",
    )
    parser.add_argument(
        "--warmup-steps",
        type=_positive,
        default=5,
        help="steps every worker trains before the window opens (default 5)",
    )
    parser.add_rounds(
        None, "rounds of the three runs, order rotating (default 3; --quick 1)"
    )
    parser.add_argument(
        "--batch", type=_positive, default=60, help="batch size per worker (default 60)"
    )
    args = parser.parse_args(argv)
    if args.seconds is None:
        args.seconds = 10.0 if args.quick else 20.0
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    use_checkout()
    # TensorFlow's import prints its banner here, not in the middle of the runs.
    import keras_psdist.cluster  # noqa: F401

    start = time.perf_counter()
    load_start = harness.loadavg()
    rounds: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="kpd_sync_bench_") as tmp:
        measure(Path(tmp), args, rounds)
    wall_s = time.perf_counter() - start
    summary = summarize(rounds)
    print(format_rounds(rounds))
    print()
    print(format_table(summary, args))
    return finish(
        args,
        ("sleep", "seconds", "warmup_steps", "rounds", "batch", "seed", "quick"),
        load_start,
        wall_s,
        summary,
        {"rounds": rounds},
    )


if __name__ == "__main__":
    sys.exit(main())
