"""Elastic membership: how long a join takes, and whether any update is lost.

What it measures
----------------
An async ``PSStrategy(mode="between-graph")`` job on a local cluster of 1 ps
and 2 workers, ``keras_psdist.cluster.launch(max_workers=3)`` (the job of
``tests/cluster_jobs/elastic_job.py``: ``Dense(1)`` from zeros, ``SGD(2**-6)``,
worker k's input the constant ``k + 1``, so each update of worker k
subtracts exactly ``2**-6 * (k + 1)`` from every weight). After its 5th step
the chief ``--cycles`` times asks the launcher for a worker
(``add-worker``: a new process, a new port, the slot the last one freed)
and waits for the joiner's first applied update, then asks it to leave
(``remove-worker-2``) and waits until it has: 2 membership changes a cycle.

Per join: the seconds from the request to the joiner's first applied update
(the launcher starting a Python process that imports TensorFlow, connects
to the ps, is admitted and takes a step); per leave: from the request to
the slot marked left. At the end: the updates each slot counted, and the
final weights against the weights those counts give, in updates of worker:0
(2**-6 each): 0 means no update was lost or counted twice.

With ``--kind sync``: ``SyncReplicaStrategy(replicas_to_aggregate=
"all_but_one", max_workers=3)`` on ones, so each update subtracts exactly
``2**-6``: the final weights against the global step (0 apart: no update
lost or applied twice); the gradients applied against the counts in force
at each update (``replicas_to_aggregate`` after each change); and per slot,
the gradients its workers sent against those the chief applied plus dropped
(0 apart: none lost or counted twice). A join ends at the joiner's first
gradient in an update.

How to run
----------
From the repository root::

    python benchmarks/elastic.py --cycles 10    # ~3 min on 2 cores; writes
                                                # benchmarks/results/elastic.json
    python benchmarks/elastic.py --cycles 10 --kind sync \
        --json benchmarks/results/elastic_sync.json
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness
from harness import log as _log
from harness import read_reports, run_dir

harness.prepare_tensorflow()

JOB = (
    Path(__file__).resolve().parent.parent / "tests" / "cluster_jobs" / "elastic_job.py"
)
LR = 2.0**-6


def main(argv: list[str] | None = None) -> int:
    parser = harness.BenchmarkParser(
        "Elastic membership: join time and lost updates over membership changes.",
        name="elastic",
        seed=False,
    )
    parser.add_argument(
        "--cycles", type=harness.positive, default=10,
        help="add-then-remove cycles: 2 membership changes each (default 10)",
    )  # fmt: skip
    parser.add_argument(
        "--kind", choices=("async", "sync"), default="async",
        help="async PSStrategy or SyncReplicaStrategy (default async)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="elastic-") as work:
        out, log = run_dir(Path(work), "run")
        code = harness.launch_logged(
            [sys.executable, str(JOB), str(out), str(args.cycles), args.kind],
            log,
            num_ps=1,
            num_workers=2,
            mode="between-graph",
            max_workers=3,
            timeout_s=120 + 60 * args.cycles,
        )
        reports = read_reports(out, 2 + args.cycles, log, code)
    chief = next(r for r in reports if "join_s" in r)
    applied = chief["applied"]
    if args.kind == "sync":
        expected = -LR * chief["global_step"]
    else:
        expected = -LR * sum((k + 1) * a for k, a in enumerate(applied))
    discrepancy = max(abs(w - expected) for w in chief["weights"]) / LR
    join, leave = chief["join_s"], chief["leave_s"]
    summary = {"kind": args.kind}
    if args.kind == "sync":
        summary.update(_sync_accounting(chief, reports))
    summary |= {
        "changes": 2 * args.cycles,
        "join_s_median": statistics.median(join),
        "join_s_min": min(join),
        "join_s_max": max(join),
        "leave_s_median": statistics.median(leave),
        "leave_s_max": max(leave),
        "applied": applied,
        "weight_discrepancy_in_updates": discrepancy,
    }
    _log(
        f"{summary['changes']} membership changes; join (request -> first applied "
        f"update) median {summary['join_s_median']:.2f} s "
        f"({summary['join_s_min']:.2f} to {summary['join_s_max']:.2f}); leave "
        f"median {summary['leave_s_median']:.2f} s (max {summary['leave_s_max']:.2f}); "
        f"updates applied per slot {applied}; final weights vs the counted updates: "
        f"{discrepancy:g} updates apart (0: none lost or counted twice)"
        + (
            f"; gradients applied vs the counts in force: "
            f"{summary['applied_vs_counts']} apart; per slot sent vs applied + "
            f"dropped: {summary['sent_vs_counted']} apart"
            if args.kind == "sync"
            else ""
        )
    )
    harness.write_results(
        args.json,
        {
            "benchmark": "elastic",
            "wall_s": time.perf_counter() - start,
            "summary": summary,
            "join_s": join,
            "leave_s": leave,
            "chief": chief,
        },
    )
    _log(f"wrote {args.json}")
    exact = (
        discrepancy == 0
        and not summary.get("applied_vs_counts")
        and not any(summary.get("sent_vs_counted", []))
    )
    return 0 if exact else 1


def _sync_accounting(chief: dict, reports: list[dict]) -> dict:
    """The sync run's gradients: applied against the counts in force at each
    update, and per slot sent against applied plus dropped."""
    changes = chief["count_changes"]  # [global step from which, n, R]

    def in_force(update: int) -> int:
        return [r for step, _, r in changes if step <= update][-1]

    wanted = sum(map(in_force, range(chief["global_step"])))
    sent = [0] * len(chief["applied"])
    for report in reports:
        sent[report["worker"]] += report["sent"]
    counted = [a + d for a, d in zip(chief["applied"], chief["dropped"], strict=True)]
    return {
        "global_step": chief["global_step"],
        "count_changes": changes,
        "applied_vs_counts": sum(chief["applied"]) - wanted,
        "sent": sent,
        "sent_vs_counted": [s - c for s, c in zip(sent, counted, strict=True)],
    }


if __name__ == "__main__":
    sys.exit(main())
