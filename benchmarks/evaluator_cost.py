"""What the side-car evaluator costs training: examples/s with and without it.

What it measures
----------------
Async ``PSStrategy(mode="between-graph")`` on a local cluster of ``--workers``
(1) worker process + 1 ps (``keras_psdist.cluster.launch``), the digits MLP
64 -> ``--hidden`` -> ``--hidden`` -> 10, Adam, ``--batch`` 32, ``--epochs``
8, the chief writing a checkpoint (``ModelCheckpoint``, ``.weights.h5``) per
epoch. Each round runs the job without and with ``launch(evaluator=True)``
(``keras-psdist launch --evaluator``: one more process, at ``nice`` 10, that
evaluates every checkpoint on the 297 held-out digits as it appears), the
order rotated every round. Per run: the training examples/s (every worker's
examples over its ``fit`` time, summed); per round the ratio with / without;
the median and range over rounds.

This machine has 2 cores, shared by the ps, the workers and the evaluator:
the evaluator's evaluations take CPU the training would use, which on a
cluster they would not (the evaluator runs on a host of its own). The ratio
here is an upper bound on its cost.

How to run
----------
From the repository root::

    python benchmarks/evaluator_cost.py              # ~4 min on 2 cores
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import harness
from harness import log as _log
from harness import read_reports, run_dir, use_checkout

harness.prepare_tensorflow()

JOB = Path(__file__).resolve().parent / "_evaluator_cost_job.py"
RUN_TIMEOUT_S = 600.0
BASELINE = "without evaluator"


def configs(args) -> dict:
    """Name -> the evaluator's `min_interval_s`, None for no evaluator."""
    return {
        BASELINE: None,
        "every checkpoint": 0.0,
        f"min_interval_s={args.min_interval:g}": args.min_interval,
    }


def run_one(work: Path, min_interval: float | None, args) -> dict:
    """One `launch`: training examples/s, and what the evaluator did."""

    evaluator = min_interval is not None
    config = {
        "epochs": args.epochs,
        "batch": args.batch,
        "hidden": args.hidden,
        "seed": args.seed,
        "idle_evaluator": args.idle_evaluator,
        "min_interval_s": min_interval or 0.0,
    }
    out_dir, log = run_dir(work, "with_" if evaluator else "without_")
    start = time.perf_counter()
    code = harness.launch_logged(
        [sys.executable, str(JOB), str(out_dir), json.dumps(config)],
        log,
        num_ps=1,
        num_workers=args.workers,
        mode="between-graph",
        timeout_s=RUN_TIMEOUT_S,
        evaluator=evaluator,
    )
    reports = read_reports(out_dir, args.workers, log, code, "worker_*.json")
    result = {
        "examples_per_s": sum(r["examples"] / r["fit_s"] for r in reports),
        "workers_fit_cpu_s": sum(r["fit_cpu_s"] for r in reports),
        "wall_s": time.perf_counter() - start,
    }
    if evaluator:
        result["evaluator"] = json.loads((out_dir / "evaluator.json").read_text())
    return result


def parse_args(argv=None):
    parser = harness.BenchmarkParser(
        "Training examples/s with and without the side-car evaluator "
        "(launch --evaluator), async PSStrategy on a local cluster.",
        name="evaluator_cost",
    )
    parser.add_rounds(6, "rounds; each runs both, the order rotated (6)")
    parser.add_argument("--workers", type=harness.positive, default=1, help="(1)")
    parser.add_argument("--epochs", type=harness.positive, default=20, help="(20)")
    parser.add_argument("--batch", type=harness.positive, default=32, help="(32)")
    parser.add_argument("--hidden", type=harness.positive, default=256, help="(256)")
    parser.add_argument(
        "--min-interval",
        type=float,
        default=2.0,
        help="the third configuration's min_interval_s (2.0)",
    )
    parser.add_argument(
        "--idle-evaluator",
        action="store_true",
        help="a diagnostic: the evaluator process imports and waits, "
        "evaluating nothing (what its mere presence costs)",
    )
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    use_checkout()
    import tempfile

    load_start = harness.loadavg()
    start = time.perf_counter()
    named = configs(args)
    with tempfile.TemporaryDirectory(prefix="evaluator_cost_") as work:

        def measure(name, round_):
            result = run_one(Path(work), named[name], args)
            _log(f"round {round_}: {name}: {result['examples_per_s']:.0f} examples/s")
            return result

        rounds = harness.interleaved_rounds(
            list(named), measure, args.rounds, on_error=harness.log_failure
        )

    def field(name, r, get):
        res = rounds.results[r].get(name)
        return get(res) if isinstance(res, dict) else None

    speeds = {
        name: {
            r: field(name, r, lambda res: res["examples_per_s"])
            for r in range(len(rounds.results))
        }
        for name in named
    }
    columns = [
        harness.Column("evaluator", 22, "<"),
        harness.Column("examples/s (median)", 19),
        harness.Column("vs without (median)", 20),
        harness.Column("range over rounds", 17),
        harness.Column("evaluations", 11),
        harness.Column("evaluator CPU s", 15),
        harness.Column("workers' fit CPU s", 18),
    ]
    rows, summary = [], {}
    for name in named:
        ratios = harness.paired_ratios(speeds[name], speeds[BASELINE])
        median = harness.median_or_none(ratios)
        runs = [res.get(name) for res in rounds.results]
        runs = [res for res in runs if isinstance(res, dict)]
        evaluators = [res["evaluator"] for res in runs if "evaluator" in res]
        summary[name] = {
            "examples_per_s": harness.median_or_none(
                [v for v in speeds[name].values() if v is not None]
            ),
            "ratio_median": median,
            "ratios": ratios,
            "evaluations": [e.get("evaluations") for e in evaluators],
            "evaluator_cpu_s": [e.get("cpu_s") for e in evaluators],
        }
        rows.append(
            [
                name,
                harness.fmt(summary[name]["examples_per_s"], ".0f"),
                harness.fmt(median, ".3f", "x"),
                harness.value_range(ratios, ".3f"),
                harness.fmt(
                    harness.median_or_none([e.get("evaluations") for e in evaluators]),
                    ".0f",
                )
                if evaluators
                else "",
                harness.fmt(
                    harness.median_or_none([e.get("cpu_s") for e in evaluators]), ".1f"
                )
                if evaluators
                else "",
                harness.fmt(
                    harness.median_or_none([res["workers_fit_cpu_s"] for res in runs]),
                    ".1f",
                ),
            ]
        )
    print("\n".join(harness.text_table(columns, rows)))
    print(
        f"\n{args.workers} worker(s) + 1 ps + the evaluator on this machine's CPUs; "
        f"{args.rounds} rounds, order rotated; medians over rounds"
    )
    return harness.finish(
        args,
        (
            "rounds",
            "workers",
            "epochs",
            "batch",
            "hidden",
            "seed",
            "idle_evaluator",
            "min_interval",
        ),
        load_start,
        time.perf_counter() - start,
        summary,
        {
            "runs": [
                {k: v for k, v in res.items() if isinstance(v, dict)}
                for res in rounds.results
            ]
        },
    )


if __name__ == "__main__":
    sys.exit(main())
