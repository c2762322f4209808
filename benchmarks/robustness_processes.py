"""The robustness table from real worker processes, beside the one-process one.

What it measures
----------------
`robustness.py` simulates its attackers inside one process: two of
`PSStrategy`'s eight logical replicas are attacked at the reduction. This
script trains the same model on the same data with ``--workers`` (8) worker
processes + 1 ps under ``SyncReplicaStrategy``, started by
``keras_psdist.cluster.launch(mode="between-graph")``, and the attack runs
in the faulty processes themselves (workers ``--attackers``, default 6 and
7): each attacks its own gradient or batch before sending it, and the chief
aggregates what arrives with the configuration's rule. Only the attacks a
worker can run alone are measured (those whose ``omniscient`` is False: the
crafted ones forge from the honest workers' gradients, which a worker never
sees).

The setup is `robustness.py`'s: scikit-learn's digits (80 % train, 20 %
held out, shuffled with the seed), the MLP 64 -> ``--hidden`` -> 10, global
batch ``--batch`` (128): every worker reads the same seeded shuffle of global
batches and keeps its piece of each (16 rows of 128 with 8 workers), so a
step trains on one global batch, ``len(train) // batch`` steps an
epoch, ``--epochs`` (20), SGD(``--lr``, momentum ``--momentum``), a ``+wm``
configuration with worker momentum 0.9 and SGD(lr / 0.1) without. Every
update aggregates all workers (``replicas_to_aggregate`` = workers).

``--beside PATH,...`` reads one-process results (robustness.py JSONs of the
same seed) and prints their cell next to each process cell.

How to run
----------
From the repository root::

    python benchmarks/robustness_processes.py \\
        --rules 'arc>geometric_median+wm,trimmed_mean+wm' \\
        --beside benchmarks/results/robustness_iid_seed0.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import harness
from harness import RunFailed, use_checkout
from harness import log as _log

harness.prepare_tensorflow()

JOB = Path(__file__).resolve().parent / "_robustness_processes_job.py"
RUN_TIMEOUT_S = 900.0


def worker_attacks() -> list[str]:
    """The table's attacks a worker process can run on its own."""
    from harness.digits import ATTACKS

    return [
        name
        for name, spec in ATTACKS.items()
        if name == "none" or not spec.build([0], 0).omniscient
    ]


def run_one(work: Path, config: str, attack: str, args, seed: int) -> dict:
    """One `launch` of the cluster; the chief's report."""
    rule = harness.parse_config(config)[0]
    job = {
        "config": config,
        "attack": attack,
        "workers": args.workers,
        "attackers": args.attackers,
        "num_byzantine": 0 if rule == "mean" else args.num_byzantine,
        "epochs": args.epochs,
        "batch": args.batch,
        "hidden": args.hidden,
        "lr": args.lr,
        "momentum": args.momentum,
        "seed": seed,
    }
    return harness.chief_of_worker_job(
        JOB, work, f"{rule}_{attack}_", job, args.workers, RUN_TIMEOUT_S
    )


def one_process_cells(paths: list[str], seed: int) -> dict[tuple[str, str], float]:
    """(configuration, attack) -> accuracy from robustness.py JSONs of `seed`."""
    cells = {}
    for path in paths:
        payload = json.loads(Path(path).read_text())
        if payload["config"]["seed"] != seed:
            continue
        for run in payload["runs"]:
            if run["status"] == "ok":
                cells[(run["rule"], run["attack"])] = run["accuracy"]
    return cells


def _worst(attacked: list[tuple[float, str]], attacks) -> str:
    """The worst cell over the attacks (a failed run, -1, is the worst).

    >>> from types import SimpleNamespace as S
    >>> _worst([(0.9, "a"), (0.8, "b")], {"a": S(label="A"), "b": S(label="B")})
    '80.0 (B)'
    """
    if not attacked:
        return "n/a"
    accuracy, attack = min(attacked)
    value = "failed" if accuracy < 0 else f"{100 * accuracy:.1f}"
    return f"{value} ({attacks[attack].label})"


def parse_args(argv=None):
    parser = harness.BenchmarkParser(
        "The robustness table from SyncReplicaStrategy worker processes, the "
        "attacks run in the faulty processes, beside the one-process table.",
        name="robustness_processes",
        seed=False,
    )
    parser.add_argument(
        "--rules",
        default="mean,trimmed_mean+wm,arc>geometric_median+wm",
        help="comma-separated configurations, as robustness.py's --rules",
    )
    parser.add_argument(
        "--attacks",
        help="comma-separated attacks a worker can run alone (default: none "
        "and all of them)",
    )
    parser.add_argument("--workers", type=harness.positive, default=8, help="(8)")
    parser.add_argument(
        "--attackers", default="6,7", help="faulty workers' indices (6,7)"
    )
    parser.add_argument("--num-byzantine", type=int, default=2, help="(2)")
    parser.add_argument("--epochs", type=harness.positive, default=20, help="(20)")
    parser.add_argument("--batch", type=harness.positive, default=128, help="(128)")
    parser.add_argument("--hidden", type=harness.positive, default=64, help="(64)")
    parser.add_argument("--lr", type=harness.positive_float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seeds", type=harness.seed_list, default=[0], help="(0)")
    parser.add_argument(
        "--beside",
        default="",
        help="comma-separated robustness.py JSONs: their cells of the same "
        "seed are shown in parentheses",
    )
    args = parser.parse_args(argv)
    args.rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    runnable = worker_attacks()
    args.attacks = (
        runnable
        if args.attacks is None
        else [a.strip() for a in args.attacks.split(",") if a.strip()]
    )
    wrong = [a for a in args.attacks if a not in runnable]
    if wrong:
        parser.error(
            f"--attacks {', '.join(wrong)}: not run by a worker alone (it needs "
            f"the honest workers' gradients); choose from {', '.join(runnable)}"
        )
    try:
        args.attackers = [int(a) for a in args.attackers.split(",") if a.strip()]
    except ValueError:
        parser.error(f"--attackers must be worker indices, got {args.attackers!r}")
    bad = [a for a in args.attackers if not 0 <= a < args.workers]
    if bad or len(set(args.attackers)) != len(args.attackers):
        parser.error(
            f"--attackers {args.attackers}: distinct indices in 0..{args.workers - 1}"
        )
    if 0 in args.attackers:
        parser.error("--attackers: worker 0 is the chief, which reports the accuracy")
    if args.batch % args.workers:
        parser.error(
            f"--batch {args.batch} does not split over {args.workers} workers: "
            "give a multiple of --workers"
        )
    args.beside = [p for p in args.beside.split(",") if p]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    use_checkout()
    import tempfile

    from harness.digits import ATTACKS

    load_start = harness.loadavg()
    start = time.perf_counter()
    results: dict[str, dict] = {}
    total = len(args.seeds) * len(args.rules) * len(args.attacks)
    with tempfile.TemporaryDirectory(prefix="robustness_processes_") as work:
        for seed in args.seeds:
            for config in args.rules:
                for attack in args.attacks:
                    key = f"{config} x {attack} seed {seed}"
                    try:
                        results[key] = run_one(Path(work), config, attack, args, seed)
                        _log(
                            f"[{len(results)}/{total}] {key}: accuracy "
                            f"{results[key]['accuracy']:.3f}, "
                            f"{results[key]['wall_s']:.0f} s"
                        )
                    except RunFailed as e:
                        results[key] = {"error": str(e)}
                        _log(f"[{len(results)}/{total}] {key}: failed: {e}")
    summary, kept = {}, []
    columns = ["config"] + [ATTACKS[a].label for a in args.attacks] + ["worst case"]
    for seed in args.seeds:
        beside = one_process_cells(args.beside, seed)
        for config in args.rules:
            row, attacked = [f"`{config}`"], []
            for attack in args.attacks:
                entry = results[f"{config} x {attack} seed {seed}"]
                accuracy = entry.get("accuracy")
                summary[f"{config} x {attack} seed {seed}"] = {
                    "processes": accuracy,
                    "one_process": beside.get((config, attack)),
                }
                cell = harness.fmt(None if accuracy is None else 100 * accuracy, ".1f")
                if (config, attack) in beside:
                    cell += f" ({100 * beside[(config, attack)]:.1f})"
                row.append(cell)
                if attack != "none":
                    attacked.append((-1.0 if accuracy is None else accuracy, attack))
            row.append(_worst(attacked, ATTACKS))
            kept.append(row)
        kept.append(
            f"seed {seed}: held-out accuracy (%), {args.workers} worker processes "
            f"+ 1 ps, workers {', '.join(map(str, args.attackers))} attacking; "
            "in parentheses the one-process table's cell"
            + (f" ({', '.join(args.beside)})" if args.beside else " (none given)")
        )
    print()
    print(harness.markdown_table([r for r in kept if not isinstance(r, str)], columns))
    for note in (r for r in kept if isinstance(r, str)):
        print(note)
    harness.keep_table(columns, kept)
    return harness.finish(
        args,
        (
            "rules",
            "attacks",
            "workers",
            "attackers",
            "num_byzantine",
            "epochs",
            "batch",
            "hidden",
            "lr",
            "momentum",
            "seeds",
            "beside",
        ),
        load_start,
        time.perf_counter() - start,
        summary,
        {"runs": [results]},
    )


if __name__ == "__main__":
    sys.exit(main())
