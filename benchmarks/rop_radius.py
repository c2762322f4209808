"""ROP's strength against centered clipping's radius.

What it measures
----------------
The relocated orthogonal perturbation (ROP, Ozfatura et al., TIFS 2024;
`keras_psdist.attacks.ROP`) puts its forgery at centered clipping's centre
(the previous aggregate) and pushes it a length ``z`` sideways. A forgery
within the clipping radius of the centre is never clipped, so the rule's
output turns by about ``f/n * min(z, radius)`` every step, always to the
same side: the radius decides how strong a ROP gets through. The tables
ran the authors' default length only (ALIE's ``z_max``, 0.32 for 2 of 8
replicas). This script trains `robustness.py`'s digits model (8 logical
CPU replicas, replicas 6 and 7 attacking, ``num_byzantine=2``, 20 epochs,
the same data and seed; `harness.digits`) for every configuration in
``--rules`` (by default centered clipping with worker momentum at fixed
radii 0.1 to 3, at ``radius="auto"``, and behind ARC) under ROP at every
length in ``--zs`` (``paper`` is the authors' default), and prints the
held-out accuracy, each configuration's worst over the lengths and its
clean run.

How to run
----------
From the repository root (about 6 minutes on 2 cores)::

    python benchmarks/rop_radius.py
    python benchmarks/rop_radius.py --rules 'centered_clipping(radius=0.3)+wm' \\
        --zs paper,1,3 --seed 1
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict

import harness
from harness import log as _log

harness.prepare_tensorflow()
harness.ensure_importable()

import tensorflow as tf  # noqa: E402
from harness.digits import (  # noqa: E402
    ATTACKS,
    AttackSpec,
    Run,
    Setup,
    build_model,
    load_data,
    train_one,
)

import keras_psdist as kpd  # noqa: E402
from keras_psdist.devices import split_host_cpu  # noqa: E402

DEFAULT_RULES = (
    "centered_clipping(radius=0.1)+wm",
    "centered_clipping(radius=0.3)+wm",
    "centered_clipping+wm",
    "centered_clipping(radius=3)+wm",
    "centered_clipping(radius=auto)+wm",
    "arc>centered_clipping+wm",
)
DEFAULT_ZS = "paper,0.1,0.3,1,3,10"


def rop_attack(z: float | None) -> str:
    """Registers ROP of length `z` (None: the authors' default) as an attack
    of `harness.digits.ATTACKS` and returns its name."""
    name = "rop" if z is None else f"rop_z{z:g}"
    if name not in ATTACKS:
        ATTACKS[name] = AttackSpec(
            f"ROP z={z:g}", lambda r, s, z=z: kpd.attacks.ROP(replicas=r, z=z)
        )
    return name


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}"


def parse_args(argv=None):
    parser = harness.BenchmarkParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rules",
        default=",".join(DEFAULT_RULES),
        help="comma-separated configs (default: centered clipping at radii "
        "0.1, 0.3, 1, 3, auto and behind ARC, each with worker momentum)",
    )
    parser.add_argument(
        "--zs",
        default=DEFAULT_ZS,
        help=f"ROP's lengths, 'paper' for the authors' default ({DEFAULT_ZS})",
    )
    parser.add_argument("--epochs", type=harness.positive, default=20)
    args = parser.parse_args(argv)
    args.rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    zs = []
    for text in args.zs.split(","):
        text = text.strip()
        if text == "paper":
            zs.append(None)
            continue
        try:
            z = float(text)
        except ValueError:
            z = float("nan")
        if not z > 0 or z == float("inf"):
            parser.error(f"--zs: each 'paper' or a number > 0; got {text!r}")
        zs.append(z)
    args.zs = zs
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.json = args.json or str(harness.RESULTS / "rop_radius.json")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    tf.config.experimental.enable_op_determinism()
    start = time.perf_counter()
    setup = Setup(
        epochs=args.epochs, seed=args.seed, devices=split_host_cpu(Setup.replicas)
    )
    data = load_data(args.seed)
    eval_model = build_model(setup.hidden, setup.lr, setup.momentum)
    attacks = ["none", *(rop_attack(z) for z in args.zs)]
    total = 1 + len(args.rules) * len(attacks)
    runs: list[Run] = []

    def one(rule: str, attack: str) -> Run:
        run = Run(rule, attack)
        train_one(run, data, eval_model, setup)
        runs.append(run)
        _log(f"[{len(runs)}/{total}] {rule} x {attack}: {_pct(run.accuracy)}")
        return run

    clean_mean = one("mean", "none")
    for rule in args.rules:
        for attack in attacks:
            one(rule, attack)
    wall = time.perf_counter() - start

    by = {(r.rule, r.attack): r for r in runs}
    labels = [ATTACKS[a].label for a in attacks]
    lines = [
        f"`python benchmarks/rop_radius.py {' '.join(args.argv)}` "
        f"({wall / 60:.1f} min wall)",
        "",
        "Held-out accuracy (%) under ROP of each length z (ROP z=... ; `ROP`: "
        f"the authors' default, z = {kpd.attacks.ALIE.paper_z(8, 2):.2f}), "
        "the worst over the lengths and the clean run:",
        "",
        "| configuration | " + " | ".join(labels[1:]) + " | worst over z | clean |",
        "|---|" + "---|" * (len(labels) + 1),
    ]
    table_rows = []
    for rule in args.rules:
        cells = [by[(rule, a)] for a in attacks[1:]]
        worst = min(cells, key=lambda r: r.accuracy if r.status == "ok" else -1.0)
        row = [
            f"`{rule}`",
            *(_pct(c.accuracy) for c in cells),
            f"{_pct(worst.accuracy)} ({ATTACKS[worst.attack].label})",
            _pct(by[(rule, "none")].accuracy),
        ]
        table_rows.append(row)
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", f"The clean `mean` run: {_pct(clean_mean.accuracy)} %."]
    text = "\n".join(lines)
    print(text)
    harness.write_results(
        args.json,
        {
            "benchmark": "rop_radius",
            "config": {
                "rules": args.rules,
                "zs": args.zs,
                "epochs": args.epochs,
                "seed": args.seed,
                "argv": args.argv,
                "paper_z": kpd.attacks.ALIE.paper_z(8, 2),
            },
            "wall_s": wall,
            "runs": [asdict(r) for r in runs],
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
