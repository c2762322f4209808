"""A Byzantine worker process under SyncReplicaStrategy: accuracy kept, clean vs attacked.

What it measures
----------------
Held-out accuracy of ``SyncReplicaStrategy`` training on a local cluster of
``--workers`` (5) worker processes + 1 ps, started by
``keras_psdist.cluster.launch(mode="between-graph")``, for each rule
configuration in ``--rules``, once without an attack and once with worker
``--attacker`` (the last one) running ``--attack``, all in one invocation:

* model and data: the digits MLP 64 -> 64 -> 10 on scikit-learn's
  ``load_digits`` (bundled, nothing downloaded): the first 1,500 images (each
  worker its own shuffle) train, the other 297 are held out; ``--batch`` 32
  per worker and step, ``--epochs`` 6;
* optimizer: ``SGD(--lr, momentum=0.9)``; a configuration with worker
  momentum (``+wm``, beta 0.9) uses ``SGD(--lr / (1 - beta))`` without
  momentum, the same steps for the mean;
* every update aggregates all workers (``replicas_to_aggregate`` = workers),
  so a run is deterministic up to the order of float additions;
* attacks are those a worker process can run on its own gradient
  (sign flip, scaling, noise, NaN, label flipping): crafted attacks need the
  other workers' gradients, which a worker cannot see.

Per configuration: clean accuracy, attacked accuracy, and the drop in points.

How to run
----------
From the repository root::

    python benchmarks/sync_byzantine.py                 # ~3 min on 2 cores
    python benchmarks/sync_byzantine.py --rules mean,centered_clipping+wm \\
        --attack label_flip
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import harness
from harness import RunFailed, parse_config, use_checkout
from harness import log as _log

harness.prepare_tensorflow()

JOB = Path(__file__).resolve().parent / "_sync_byzantine_job.py"
RUN_TIMEOUT_S = 600.0
ATTACKS = {
    "sign_flip": lambda w: {
        "class_name": "sign_flip",
        "config": {"replicas": [w], "scale": 10.0},
    },
    "scale": lambda w: {
        "class_name": "scale",
        "config": {"replicas": [w], "factor": 100.0},
    },
    "gaussian_noise": lambda w: {
        "class_name": "gaussian_noise",
        "config": {"replicas": [w], "stddev": 10.0},
    },
    "non_finite": lambda w: {"class_name": "non_finite", "config": {"replicas": [w]}},
    "label_flip": lambda w: {
        "class_name": "label_flip",
        "config": {"replicas": [w], "num_classes": 10},
    },
}


def run_one(work: Path, name: str, attack: dict | None, args, seed: int) -> dict:
    """One `launch`; the chief's report."""

    rule, aggregator, worker_momentum = parse_config(name)
    config = {
        "aggregator": aggregator,
        "num_byzantine": 0 if rule == "mean" else args.num_byzantine,
        "worker_momentum": worker_momentum,
        "attack": attack,
        "epochs": args.epochs,
        "batch": args.batch,
        "lr": args.lr,
        "momentum": 0.9,
        "seed": seed,
    }
    prefix = f"{rule}_{'attacked' if attack else 'clean'}_"
    chief = harness.chief_of_worker_job(
        JOB, work, prefix, config, args.workers, RUN_TIMEOUT_S
    )
    return {**chief, "config": config}


def parse_args(argv=None):
    parser = harness.BenchmarkParser(
        "Accuracy of SyncReplicaStrategy with one Byzantine worker process, "
        "clean vs attacked, per rule (with or without worker momentum).",
        name="sync_byzantine",
    )
    parser.add_argument(
        "--rules",
        default="mean,median+wm,centered_clipping+wm",
        help="comma-separated configurations [pre>]rule[+wm[BETA]] (as "
        "robustness.py: e.g. arc>geometric_median+wm); default "
        "mean,median+wm,centered_clipping+wm",
    )
    parser.add_argument("--attack", choices=sorted(ATTACKS), default="sign_flip")
    parser.add_argument("--workers", type=harness.positive, default=5, help="(5)")
    parser.add_argument(
        "--num-byzantine", type=int, default=1, help="f of the robust rules (1)"
    )
    parser.add_argument("--epochs", type=harness.positive, default=6, help="(6)")
    parser.add_argument("--batch", type=harness.positive, default=32, help="(32)")
    parser.add_argument(
        "--lr", type=harness.positive_float, default=0.05, help="(0.05)"
    )
    parser.add_argument(
        "--seeds",
        type=harness.seed_list,
        help="several seeds (e.g. 0,1,2): every configuration runs clean and "
        "attacked with each, and the table shows the means over seeds "
        "(default: --seed alone)",
    )
    args = parser.parse_args(argv)
    args.rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    args.seeds = args.seeds or [args.seed]
    return args


def _mean(values: list[float | None]) -> float | None:
    return None if not values or None in values else sum(values) / len(values)


def main(argv=None) -> int:
    args = parse_args(argv)
    use_checkout()
    import tempfile

    load_start = harness.loadavg()
    start = time.perf_counter()
    results = {}
    with tempfile.TemporaryDirectory(prefix="sync_byzantine_") as work:
        for seed in args.seeds:
            for name in args.rules:
                for attacked in (False, True):
                    key = f"{name} {'attacked' if attacked else 'clean'} seed {seed}"
                    attack = (
                        ATTACKS[args.attack](args.workers - 1) if attacked else None
                    )
                    try:
                        results[key] = run_one(Path(work), name, attack, args, seed)
                        _log(f"{key}: accuracy {results[key]['accuracy']:.3f}")
                    except RunFailed as e:
                        results[key] = {"error": str(e)}
                        _log(f"{key}: failed: {e}")
    seeds = ",".join(str(s) for s in args.seeds)
    print()
    print(
        f"{'rule':<32}{'clean':>8}{'attacked':>10}{'drop (points)':>16}"
        f"   per seed ({seeds}): clean/attacked"
    )
    summary, kept = {}, []
    for name in args.rules:
        per_seed = [
            (
                results[f"{name} clean seed {s}"].get("accuracy"),
                results[f"{name} attacked seed {s}"].get("accuracy"),
            )
            for s in args.seeds
        ]
        clean = _mean([c for c, _ in per_seed])
        attacked = _mean([a for _, a in per_seed])
        drop = None if None in (clean, attacked) else 100 * (clean - attacked)
        summary[name] = {
            "clean": clean,
            "attacked": attacked,
            "drop_points": drop,
            "per_seed": per_seed,
        }
        cells = [harness.fmt(v, ".3f") for v in (clean, attacked)]
        detail = " ".join(
            f"{harness.fmt(c, '.3f')}/{harness.fmt(a, '.3f')}" for c, a in per_seed
        )
        print(
            f"{name:<32}{cells[0]:>8}{cells[1]:>10}{harness.fmt(drop, '.1f'):>16}"
            f"   {detail}"
        )
        kept.append([name, *cells, harness.fmt(drop, ".1f"), detail])
    harness.keep_table(
        ["rule", "clean", "attacked", "drop (points)", f"per seed ({seeds})"], kept
    )
    print(
        f"\n{args.workers} workers + 1 ps, worker {args.workers - 1} runs "
        f"{args.attack}; f = {args.num_byzantine} (mean: 0)"
    )
    return harness.finish(
        args,
        (
            "rules",
            "attack",
            "workers",
            "num_byzantine",
            "epochs",
            "batch",
            "lr",
            "seeds",
        ),
        load_start,
        time.perf_counter() - start,
        summary,
        {"runs": [results]},
    )


if __name__ == "__main__":
    sys.exit(main())
