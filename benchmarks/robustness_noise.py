"""How far below the clean run a harmless column of the robustness table falls.

What it measures
----------------
``robustness.py`` compares each configuration's worst accuracy over the
attacks with one clean ``mean`` run of the same ``--seed``. Each of those
numbers is one training run scored on 360 held-out digits, so part of any
gap is the draw, not the attack. This script measures that part: on the
held-out split of ``--seed``, it trains the clean ``mean`` and each
``--rules`` configuration, without attack, ``--runs`` times, with training
seeds 1000, 1001, ... (initial weights and batch order change; the split and
everything else stay as in ``robustness.py``). Per configuration it prints:

* the clean runs' lowest, mean and highest accuracy, and their standard
  deviation;
* ``chance gap``: the expected drop of "the worst of ``--columns`` runs of
  the configuration" below "one clean ``mean`` run", when no attack has any
  effect (resampled from the runs above, 20,000 draws);
* ``P(gap > tol)``: how often that chance gap alone exceeds ``--tolerance``
  points.

With ``--attacks``, each configuration is also trained ``--runs`` times
under each attack (robustness.py's names; the attack's own randomness
follows the training seed), and a second table gives, per attack, the
runs' spread and the attack's expected cost: the mean of the attacked runs
below the mean of the clean ``mean`` runs, and below the configuration's
own clean runs, each with its standard error. That is the gap of the table
with the draw averaged out; the attack with the lowest mean is the
configuration's expected worst case.

Run::

    python benchmarks/robustness_noise.py --rules 'arc>geometric_median+wm' --runs 12
    python benchmarks/robustness_noise.py --rules 'arc>geometric_median+wm' \
        --attacks optimal_alie,ipm_small --runs 8 --seed 2

Two cores: about 7 s per clean run (24 runs for the first command, ~3 min),
up to 20 s under the optimised attacks.
"""

from __future__ import annotations

import argparse
import sys

import harness
import numpy as np
from harness import (
    RESULTS,
    attack_costs,
    chance_gap,
    config_names,
    keep_table,
    name_list,
    write_results,
)

# Before TensorFlow is imported anywhere in this process.
harness.prepare_tensorflow()
harness.ensure_importable()

import tensorflow as tf  # noqa: E402
from harness import digits  # noqa: E402  (robustness.py's runs)

from keras_psdist.devices import split_host_cpu  # noqa: E402

# Training seeds are offset from the split's, so that no run repeats a run of
# the table (whose training seed is its --seed).
SEED_OFFSET = 1000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command-line flags."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rules",
        default="arc>geometric_median+wm",
        help="comma-separated configurations, as robustness.py's --rules "
        "(the clean mean runs as well)",
    )
    parser.add_argument(
        "--attacks",
        type=name_list(list(digits.ATTACKS), "attacks"),
        default=[],
        help="comma-separated attacks (robustness.py's names) each configuration "
        "is also trained under, --runs times each (default: none)",
    )
    parser.add_argument("--runs", type=int, default=12, help="runs each (12)")
    parser.add_argument(
        "--seed", type=int, default=0, help="the held-out split's seed (0)"
    )
    parser.add_argument(
        "--columns",
        type=int,
        default=11,
        help="attack columns a worst case is taken over (11: robustness.py's)",
    )
    parser.add_argument(
        "--tolerance", type=float, default=2.0, help="points, for P(gap > tol)"
    )
    parser.add_argument(
        "--json",
        metavar="PATH",
        help="raw accuracies (default "
        "benchmarks/results/robustness_noise_seed<SEED>.json)",
    )
    args = parser.parse_args(argv)
    if args.runs < 2:
        parser.error(f"--runs must be at least 2 (got {args.runs})")
    if args.columns < 1:
        parser.error(f"--columns must be at least 1 (got {args.columns})")
    args.attacks = [a for a in args.attacks if a != "none"]
    if args.json is None:
        args.json = str(RESULTS / f"robustness_noise_seed{args.seed}.json")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configs = ["mean", *[c for c in config_names(args.rules) if c != "mean"]]
    # robustness.py's setup at its defaults (op determinism on, as there).
    table_args = digits.Setup(seed=args.seed)
    table_args.devices = split_host_cpu(table_args.replicas)
    tf.config.experimental.enable_op_determinism()
    data = digits.load_data(args.seed)
    eval_model = digits.build_model(
        table_args.hidden, table_args.lr, table_args.momentum
    )
    accuracies: dict[str, list[float]] = {}
    attacked: dict[tuple[str, str], list[float]] = {}
    cells = [(config, "none") for config in configs]
    cells += [(c, a) for c in configs if c != "mean" for a in args.attacks]
    for config, attack in cells:
        for k in range(args.runs):
            table_args.seed = SEED_OFFSET + k
            run = digits.Run(config, attack)
            digits.train_one(run, data, eval_model, table_args)
            if run.status != "ok":
                print(f"{config} x {attack}: {run.reason}", file=sys.stderr)
                _write_json(args, accuracies, attacked)  # what ran, for a re-run
                return 1
            if attack == "none":
                accuracies.setdefault(config, []).append(run.accuracy)
            else:
                attacked.setdefault((config, attack), []).append(run.accuracy)
            print(
                f"{config} x {attack} run {k}: {100 * run.accuracy:.1f}",
                file=sys.stderr,
            )
    print(
        f"clean runs on the split of --seed {args.seed}, {args.runs} training "
        f"seeds each; chance gap: one clean mean run minus the worst of "
        f"{args.columns} runs, no attack"
    )
    print(
        f"{'configuration':34s} {'lowest':>7s} {'mean':>7s} {'highest':>7s} "
        f"{'sd':>5s} {'chance gap':>11s} {f'P(gap > {args.tolerance:g})':>13s}"
    )
    kept = []  # the same table, for the JSON
    for config, values in accuracies.items():
        runs = np.array(values)
        gap, p = chance_gap(accuracies["mean"], values, args.columns, args.tolerance)
        print(
            f"{config:34s} {100 * runs.min():7.1f} {100 * runs.mean():7.1f} "
            f"{100 * runs.max():7.1f} {100 * runs.std(ddof=1):5.2f} "
            f"{gap:11.2f} {p:13.2f}"
        )
        kept.append(
            [config]
            + [f"{100 * v:.1f}" for v in (runs.min(), runs.mean(), runs.max())]
            + [f"{100 * runs.std(ddof=1):.2f}", f"{gap:.2f}", f"{p:.2f}"]
        )
    keep_table(
        ["configuration", "lowest", "mean", "highest", "sd", "chance gap"]
        + [f"P(gap > {args.tolerance:g})"],
        kept,
    )
    if attacked:
        print()
        labels = {a: digits.ATTACKS[a].label for a in args.attacks}
        print(
            f"under attack, {args.runs} training seeds each; below: the clean "
            "runs' mean minus the attacked runs' (points, +- standard error)"
        )
        print(attack_costs(accuracies, attacked, labels))
    _write_json(args, accuracies, attacked)
    return 0


def _write_json(args, accuracies, attacked) -> None:
    """The raw accuracies to `--json`: clean runs by configuration, attacked
    runs by `"configuration x attack"` (with the command and the machine)."""
    write_results(
        args.json,
        {
            "args": vars(args),
            "accuracies": accuracies,
            "attacked": {f"{c} x {a}": v for (c, a), v in attacked.items()},
        },
        indent=1,
    )
    print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
