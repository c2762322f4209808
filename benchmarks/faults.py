"""How fast a lost ps task is reported: SIGKILL to every trainer's exit.

What it measures
----------------
A local cluster (``keras_psdist.cluster.launch``) trains the digits MLP of
``tests/cluster_jobs/digits_job.py`` with the job
``tests/cluster_jobs/ps_loss_job.py``; after ``--kill-at-step`` steps of the
chief, this script SIGKILLs one ps task (the last one). Every training
process must then stop by itself with ``TaskLostError`` naming that task
(``keras_psdist.cluster.task_loss``); the launcher gives them 20 s before it
stops them, so a process that hangs shows up as a failure here.

For each mode, ``--rounds`` runs (fresh processes each):

* ``async``: ``PSStrategy(mode="between-graph")``, 2 worker processes, 2 ps.
* ``sync``: ``SyncReplicaStrategy()``, 2 worker processes, 2 ps.
* ``in-graph``: ``PSStrategy()``, the chief driving 2 worker tasks, 2 ps.

Reported per mode: seconds from the kill (wall clock, taken right after
``os.kill`` returns) to each training process's exit with the error (its own
wall-clock stamp, written as its ``fit`` raised), the median and the worst
over rounds and processes; and that latency over the median step time of
the same process just before the kill (the "how many steps late" ratio, the
baseline measured in the same run). A process that TensorFlow kept waiting
on the dead task is ended by the server watch after ``heartbeat_timeout``
(3 s here) and counted under "by watch" (it leaves no stamp). The chief waits until the killed port
refuses connections before its next step, so its latency includes that
wait (tens of ms).

How to run
----------
From the repository root::

    python benchmarks/faults.py            # about 3 minutes on 2 shared cores
    python benchmarks/faults.py --rounds 1 # about 1.5 minutes

Writes ``benchmarks/results/faults.json`` (``--json``).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "cluster_jobs"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import Column, finish, loadavg, log, text_table, use_checkout  # noqa: E402

MODES = {
    "async": {"num_ps": 2, "num_workers": 2, "mode": "between-graph"},
    "sync": {"num_ps": 2, "num_workers": 2, "mode": "between-graph"},
    "in-graph": {"num_ps": 2, "num_workers": 2, "mode": "in-graph"},
}
LAUNCH_TIMEOUT_S = 300
TASKS = {
    "async": ("worker_0", "worker_1"),
    "sync": ("worker_0", "worker_1"),
    "in-graph": ("chief_0",),
}


def one_run(strategy: str, kill_at_step: int) -> list[dict]:
    """One cluster, one kill: per training process, its latency and step."""
    import ps_loss_job

    config = {"strategy": strategy, "lose_ps_at_step": kill_at_step, "epochs": 100}
    with tempfile.TemporaryDirectory(prefix=f"faults_{strategy}_") as out_dir:
        code, output, reports = ps_loss_job.launch_and_kill_ps(
            out_dir, config, "ps:1", timeout_s=LAUNCH_TIMEOUT_S, **MODES[strategy]
        )
    killed_at = reports.pop("killed_at")
    rows = []
    for task in TASKS[strategy]:
        report = reports.get(task)
        watch_line = f"[{task.replace('_', ':')}] keras_psdist: "
        if (
            report is None
            and killed_at is not None
            and any(line.startswith(watch_line) for line in output.splitlines())
        ):
            # Ended by the server watch: its own stamp is lost with it.
            rows.append({"task": task, "ended_by_watch": True})
            continue
        failure = (report or {}).get("failure") or ""
        if killed_at is None or not failure.startswith("TaskLostError"):
            tail = "\n".join(output.splitlines()[-40:])
            raise RuntimeError(
                f"{strategy}: {task} did not stop with TaskLostError "
                f"(exit {code}): {failure[:300]!r}\n{tail}"
            )
        latency = report["ended_at"] - killed_at
        rows.append(
            {
                "task": task,
                "ended_by_watch": False,
                "latency_s": latency,
                "median_step_s": report["median_step_s"],
                "latency_in_steps": latency / report["median_step_s"],
            }
        )
    return rows


def parse_args(argv=None):
    parser = harness.BenchmarkParser(__doc__.split("\n")[0], name="faults", seed=False)
    parser.add_rounds(3, "runs per mode, fresh processes each (default 3)")
    parser.add_argument("--kill-at-step", type=harness.positive, default=30)
    parser.add_argument("--only", choices=sorted(MODES), default=None)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    use_checkout()
    load_start, start = loadavg(), time.perf_counter()
    modes = [args.only] if args.only else list(MODES)
    results, rounds = {}, {}
    for strategy in modes:
        rows = rounds[strategy] = []
        for round_ in range(args.rounds):
            log(f"{strategy}: round {round_ + 1} of {args.rounds}")
            rows += one_run(strategy, args.kill_at_step)
        timed = [r for r in rows if not r["ended_by_watch"]]
        latencies = [r["latency_s"] for r in timed] or [float("nan")]
        in_steps = [r["latency_in_steps"] for r in timed] or [float("nan")]
        results[strategy] = {
            "processes": len(rows),
            "ended_by_watch": len(rows) - len(timed),
            "median_latency_s": statistics.median(latencies),
            "max_latency_s": max(latencies),
            "median_latency_in_steps": statistics.median(in_steps),
        }
    columns = [Column("mode", 10, "<")]
    columns += [
        Column(title, 10)
        for title in ("processes", "by watch", "median s", "worst s", "in steps")
    ]
    rows = [
        [
            strategy,
            r["processes"],
            r["ended_by_watch"],
            f"{r['median_latency_s']:.2f}",
            f"{r['max_latency_s']:.2f}",
            f"{r['median_latency_in_steps']:.1f}",
        ]
        for strategy, r in results.items()
    ]
    print()
    print("\n".join(text_table(columns, rows, sep="", rule=False)))
    settings = ("rounds", "kill_at_step", "only")
    return finish(
        args, settings, load_start, time.perf_counter() - start, results, rounds
    )


if __name__ == "__main__":
    sys.exit(main())
