"""How far below the clean run a harmless column of the robustness table falls.

What it measures
----------------
``robustness.py`` compares each configuration's worst accuracy over the
attacks with one clean ``mean`` run of the same ``--seed``. Each of those
numbers is one training run scored on 360 held-out digits, so part of any
gap is the draw, not the attack. This script measures that part: on the
held-out split of ``--seed``, it trains the clean ``mean`` and each
``--rules`` configuration, without attack, ``--noise`` times, with training
seeds 1000, 1001, ... (initial weights and batch order change; the split and
everything else stay as in ``robustness.py``). Per configuration it prints:

* the clean runs' lowest, mean and highest accuracy, and their standard
  deviation;
* ``chance gap``: the expected drop of "the worst of ``--columns`` runs of
  the configuration" below "one clean ``mean`` run", when no attack has any
  effect (resampled from the runs above, 20,000 draws);
* ``P(gap > tol)``: how often that chance gap alone exceeds ``--tolerance``
  points.

With ``--attacks``, each configuration is also trained ``--noise`` times
under each attack (robustness.py's names; the attack's own randomness
follows the training seed), and a second table gives, per attack, the
runs' spread and the attack's expected cost: the mean of the attacked runs
below the mean of the clean ``mean`` runs, and below the configuration's
own clean runs, each with its standard error. That is the gap of the table
with the draw averaged out; the attack with the lowest mean is the
configuration's expected worst case.

Run (``robustness.py --noise RUNS``)::

    python benchmarks/robustness.py --noise 12 --rules 'arc>geometric_median+wm'
    python benchmarks/robustness.py --noise 8 --rules 'arc>geometric_median+wm' \
        --attacks optimal_alie,ipm_small --seed 2

Two cores: about 7 s per clean run (24 runs for the first command, ~3 min),
up to 20 s under the optimised attacks.
"""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf

from keras_psdist.devices import split_host_cpu

from . import digits
from .results import write_results
from .stats import chance_gap
from .tables import attack_costs, keep_table

# Training seeds are offset from the split's, so that no run repeats a run of
# the table (whose training seed is its --seed).
SEED_OFFSET = 1000
# What the JSON records of the command line.
SETTINGS = ("rules", "attacks", "noise", "seed", "columns", "tolerance", "json")


def run(args) -> int:
    """The study of `args` (robustness.py's, with `--noise`)."""
    configs = ["mean", *[c for c in args.rules if c != "mean"]]
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
        for k in range(args.noise):
            table_args.seed = SEED_OFFSET + k
            trained = digits.Run(config, attack)
            digits.train_one(trained, data, eval_model, table_args)
            if trained.status != "ok":
                print(f"{config} x {attack}: {trained.reason}", file=sys.stderr)
                _write_json(args, accuracies, attacked)  # what ran, for a re-run
                return 1
            if attack == "none":
                accuracies.setdefault(config, []).append(trained.accuracy)
            else:
                attacked.setdefault((config, attack), []).append(trained.accuracy)
            print(
                f"{config} x {attack} run {k}: {100 * trained.accuracy:.1f}",
                file=sys.stderr,
            )
    print(
        f"clean runs on the split of --seed {args.seed}, {args.noise} training "
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
            f"under attack, {args.noise} training seeds each; below: the clean "
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
            "args": {k: v for k, v in vars(args).items() if k in SETTINGS},
            "accuracies": accuracies,
            "attacked": {f"{c} x {a}": v for (c, a), v in attacked.items()},
        },
        indent=1,
    )
    print(f"wrote {args.json}", file=sys.stderr)
