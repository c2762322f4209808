"""The field's evaluation protocol: tuned hyperparameters, and f x heterogeneity heatmaps.

`robustness.py` trains every configuration with one set of hyperparameters.
The field (ByzFL's benchmark; Allouah et al., AISTATS 2023 and NeurIPS 2023)
evaluates two more ways, and this script does both on `robustness.py`'s runs
(the digits MLP under `PSStrategy`, 8 logical CPU replicas, the attacks at
the reduction; `harness.digits`):

``tune``
    Each configuration's hyperparameters chosen by its **worst-case
    validation accuracy** over the attacks, not by its clean run. The
    training part of the seed's split (80 % of the digits) is cut again:
    ``--validation`` (20 %) of it is held out for the choice, the rest
    trains; the test part is never looked at until the choice is made. The
    grid: the learning rate ``--lrs`` (of SGD with momentum; with worker
    momentum beta, SGD(lr / (1 - beta)) without, the same steps for the
    mean) x the momentum ``--betas`` (the worker momentum of a ``+wm``
    configuration, else the optimizer's). Printed per configuration: every
    grid point's validation worst case, the chosen point, and its test
    accuracy under each attack beside the default point's (lr 0.05,
    beta 0.9: robustness.py's).

``heatmap``
    Each configuration's worst case over ``--attacks`` on a grid of the
    number of attackers f (1 to n/2 - 1, the last f replicas attack, every
    robust rule given ``num_byzantine=f``) x the heterogeneity of the data
    (IID, or a Dirichlet(alpha) label split over the replicas). Per
    (alpha, f) also the two references that say how far the best
    configuration is from what any rule can do:

    * **honest only**: `mean` trained on the n - f honest replicas' parts
      alone, what a rule that ignored the attackers perfectly would reach;
    * **the heterogeneity bound**: any rule can be biased by f attackers by
      a squared error of order ``f / (n - 2f) * G**2``, G**2 the honest
      replicas' mean squared distance of their full-part gradient from
      their average (Allouah et al., NeurIPS 2023). Printed is that term
      relative to the squared norm of the honest average,
      ``f / (n - 2f) * G**2 / |mean|**2``, measured at every epoch's end of
      the clean `mean` run: above 1, an attacker can turn the aggregate
      as far as the true gradient is long, and no rule can promise a
      descent step. With IID data the parts are a random equal split.

How to run
----------
From the repository root::

    python benchmarks/robustness_protocol.py tune \\
        --rules 'arc>geometric_median+wm,smea+wm'          # ~17 min a config
    python benchmarks/robustness_protocol.py heatmap \\
        --rules 'arc>geometric_median+wm' --alphas iid,1,0.5,0.1

Each writes its JSON (``--json``; default
``benchmarks/results/robustness_{tune,heatmap}.json``) and its markdown
tables (``--output``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import harness
from harness import log as _log
from harness import parse_config

harness.prepare_tensorflow()
harness.ensure_importable()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from harness.digits import (  # noqa: E402
    ATTACKS,
    Run,
    Setup,
    build_model,
    load_data,
    train_one,
)

import keras_psdist as kpd  # noqa: E402
from keras_psdist.devices import split_host_cpu  # noqa: E402

DEFAULT_POINT = (0.05, 0.9)  # robustness.py's lr and momentum
# The attacks that were the worst of some configuration in robustness.py's
# tables (IID or Dirichlet(0.5)), and the scaled sign flip.
HEATMAP_ATTACKS = (
    "sign_flip",
    "alie",
    "ipm_small",
    "optimal_alie",
    "optimal_ipm",
    "mimic",
    "min_max",
    "min_sum",
    "optimal_label_flip",
)


# ------------------------------------------------------------------ shared


def with_momentum(config: str, beta: float) -> str:
    """`config` with its worker momentum set to `beta` (none stays none).

    >>> with_momentum("arc>geometric_median+wm", 0.99)
    'arc>geometric_median+wm0.99'
    >>> with_momentum("median", 0.99)
    'median'
    """
    if not re.search(r"\+wm[0-9.]*$", config):
        return config
    return re.sub(r"\+wm[0-9.]*$", f"+wm{beta:g}", config)


def worst(runs: list[Run], score: str | None = None) -> tuple[float, str]:
    """The lowest accuracy over the attacked runs (`none` left out) and its
    attack; `score` a name of `Run.scores` (default: the test accuracy).
    A failed run counts as 0."""
    cells = [
        (
            0.0
            if r.status != "ok"
            else (r.accuracy if score is None else r.scores[score]),
            r.attack,
        )
        for r in runs
        if r.attack != "none"
    ]
    return min(cells)


def _label(attack: str) -> str:
    return ATTACKS[attack].label


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}"


def _list(text: str, kind=str) -> list:
    return [kind(t.strip()) for t in text.split(",") if t.strip()]


# -------------------------------------------------------------------- tune


def tune(args) -> dict:
    xt, yt, xtest, ytest = load_data(args.seed)
    cut = int((1 - args.validation) * len(xt))
    data = (xt[:cut], yt[:cut], xtest, ytest)
    evaluate = {"validation": (xt[cut:], yt[cut:])}
    base = Setup(
        replicas=args.replicas,
        attackers=args.attackers,
        num_byzantine=args.num_byzantine,
        epochs=args.epochs,
        seed=args.seed,
        devices=split_host_cpu(args.replicas),
    )
    eval_model = build_model(base.hidden, base.lr, base.momentum)
    points = [(lr, beta) for lr in args.lrs for beta in args.betas]
    if DEFAULT_POINT not in points:
        points.append(DEFAULT_POINT)
    total = len(args.rules) * len(points) * len(args.attacks) + 1
    runs: list[dict] = []

    def one(config: str, attack: str, lr: float, beta: float) -> Run:
        wm = re.search(r"\+wm[0-9.]*$", config) is not None
        setup = replace(base, lr=lr, momentum=base.momentum if wm else beta)
        run = Run(with_momentum(config, beta), attack)
        train_one(run, data, eval_model, setup, evaluate=evaluate)
        runs.append({"config": config, "lr": lr, "beta": beta, **asdict(run)})
        _log(
            f"[{len(runs)}/{total}] {run.rule} x {attack} lr={lr:g}: test "
            f"{_pct(run.accuracy)}, validation {_pct(run.scores.get('validation'))}"
        )
        return run

    clean_mean = one("mean", "none", *DEFAULT_POINT)
    results = {}
    for config in args.rules:
        grid = {}
        for lr, beta in points:
            grid[(lr, beta)] = [one(config, a, lr, beta) for a in args.attacks]
        chosen = max(
            points,
            key=lambda p: (
                worst(grid[p], "validation")[0],
                -abs(p[0] - DEFAULT_POINT[0]),
            ),
        )
        results[config] = {"grid": grid, "chosen": chosen}
    return {
        "clean_mean": clean_mean,
        "results": results,
        "runs": runs,
        "points": points,
    }


def tune_tables(out: dict, args) -> str:
    lines = []
    clean = out["clean_mean"].accuracy
    summary = [
        [
            "config",
            "default (lr 0.05, beta 0.9): test worst",
            "chosen (lr, beta)",
            "its validation worst",
            "its test worst",
            "its test clean",
            "below the clean mean",
        ]
    ]
    for config, result in out["results"].items():
        grid, chosen = result["grid"], result["chosen"]
        default = grid[DEFAULT_POINT]
        d_acc, d_attack = worst(default)
        v_acc, v_attack = worst(grid[chosen], "validation")
        t_acc, t_attack = worst(grid[chosen])
        clean_run = next(r for r in grid[chosen] if r.attack == "none")
        summary.append(
            [
                f"`{config}`",
                f"{_pct(d_acc)} ({_label(d_attack)})",
                f"{chosen[0]:g}, {chosen[1]:g}",
                f"{_pct(v_acc)} ({_label(v_attack)})",
                f"{_pct(t_acc)} ({_label(t_attack)})",
                _pct(clean_run.accuracy),
                f"{100 * (clean - t_acc):.1f}",
            ]
        )
    lines += [
        f"Seed {args.seed}: hyperparameters chosen by the worst-case validation "
        f"accuracy over {len([a for a in args.attacks if a != 'none'])} attacks "
        f"({len(out['points'])} grid points: lr {', '.join(f'{x:g}' for x in args.lrs)}"
        f" x beta {', '.join(f'{x:g}' for x in args.betas)}); the clean `mean` "
        f"run at the default point: {_pct(clean)} % (test).",
        "",
        harness.markdown_table(summary[1:], summary[0]),
        "",
    ]
    for config, result in out["results"].items():
        grid, chosen = result["grid"], result["chosen"]
        header = ["lr, beta", "validation worst", "test worst", "test clean"]
        rows = []
        for point, point_runs in grid.items():
            v, va = worst(point_runs, "validation")
            t, ta = worst(point_runs)
            mark = " (chosen)" if point == chosen else ""
            mark += " (default)" if point == DEFAULT_POINT else ""
            rows.append(
                [
                    f"{point[0]:g}, {point[1]:g}{mark}",
                    f"{_pct(v)} ({_label(va)})",
                    f"{_pct(t)} ({_label(ta)})",
                    _pct(next(r for r in point_runs if r.attack == "none").accuracy),
                ]
            )
        lines += [f"`{config}`, every grid point:", ""]
        lines += [harness.markdown_table(rows, header), ""]
        per_attack = [
            [_label(r.attack), _pct(r.accuracy), _pct(d.accuracy)]
            for r, d in zip(grid[chosen], grid[DEFAULT_POINT], strict=True)
        ]
        lines += [f"`{config}`, test accuracy per attack (chosen, default):", ""]
        lines += [
            harness.markdown_table(per_attack, ["attack", "chosen", "default"]),
            "",
        ]
    return "\n".join(lines)


# ----------------------------------------------------------------- heatmap


class Spread(keras.callbacks.Callback):
    """At the start and every epoch's end: each replica's gradient of its
    loss over its whole part, at the current weights (a plain copy of the
    model computes them eagerly, outside the strategy)."""

    def __init__(self, parts: list[tuple[np.ndarray, np.ndarray]], hidden: int):
        super().__init__()
        self.parts = parts
        self.plain = build_model(hidden, 0.05, 0.0)
        self.loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        self.gradients: list[np.ndarray] = []  # [epoch] -> [replicas, d]

    def _measure(self) -> None:
        self.plain.set_weights(self.model.get_weights())
        rows = []
        for x, y in self.parts:
            with tf.GradientTape() as tape:
                loss = self.loss(y, self.plain(x, training=True))
            grads = tape.gradient(loss, self.plain.trainable_variables)
            rows.append(np.concatenate([g.numpy().ravel() for g in grads]))
        self.gradients.append(np.stack(rows))

    def on_train_begin(self, logs=None):
        self._measure()

    def on_epoch_end(self, epoch, logs=None):
        self._measure()


def bound_term(gradients: np.ndarray, honest: list[int], f: int) -> float:
    """``f / (n - 2f) * G**2 / |mean|**2`` for the honest rows of one
    measurement (n = all rows).

    >>> g = np.array([[1.0, 0.0], [1.0, 2.0], [9.0, 9.0]])
    >>> round(bound_term(g, [0, 1], 1), 3)  # G**2 = 1, |mean|**2 = 2
    0.5
    """
    n = len(gradients)
    rows = gradients[honest]
    mean = rows.mean(axis=0)
    spread = float(np.mean(np.sum((rows - mean) ** 2, axis=1)))
    return f / (n - 2 * f) * spread / float(np.sum(mean**2))


def parts_of(y: np.ndarray, args, alpha: float | None) -> list[np.ndarray]:
    if alpha is None:
        order = np.random.default_rng(args.seed).permutation(len(y))
        return np.array_split(order, args.replicas)
    return kpd.heterogeneity.dirichlet_split(y, args.replicas, alpha, args.seed)


def heatmap(args) -> dict:
    data = load_data(args.seed)
    xt, yt = data[0], data[1]
    devices = split_host_cpu(args.replicas)
    eval_model = build_model(args.hidden, 0.05, 0.9)
    cells, references = [], []
    per_alpha = len(args.fs) * (len(args.rules) * len(args.attacks) + 1) + 1
    total = len(args.alphas) * per_alpha
    done = 0

    def log(run: Run, where: str) -> None:
        nonlocal done
        done += 1
        _log(
            f"[{done}/{total}] {where} {run.rule} x {run.attack}: {_pct(run.accuracy)}"
        )

    for alpha in args.alphas:
        n = args.replicas
        base = Setup(
            replicas=n,
            attackers=[],
            num_byzantine=0,
            epochs=args.epochs,
            seed=args.seed,
            hidden=args.hidden,
            alpha=alpha,
            devices=devices,
        )
        parts = parts_of(yt, args, alpha)
        spread = Spread([(xt[p], yt[p]) for p in parts], args.hidden)
        clean = Run("mean", "none")
        train_one(clean, data, eval_model, base, callbacks=(spread,))
        log(clean, f"alpha={alpha}")
        for f in args.fs:
            honest = list(range(n - f))
            terms = [bound_term(g, honest, f) for g in spread.gradients]
            # Mean on the honest replicas alone, each on its own part (IID:
            # drawing from all the data), the attacked runs' steps an epoch.
            alone = Run("mean", "none")
            alone_setup = replace(
                base,
                replicas=n - f,
                batch=base.batch // n * (n - f),
                devices=devices[: n - f],
                parts=None if alpha is None else [parts[i] for i in honest],
                steps=len(xt) // base.batch,
            )
            train_one(alone, data, eval_model, alone_setup)
            log(alone, f"alpha={alpha} f={f} honest only:")
            references.append(
                {
                    "alpha": alpha,
                    "f": f,
                    "clean_mean": clean.accuracy,
                    "honest_only": alone.accuracy,
                    "bound_terms": terms,
                }
            )
            setup = replace(base, attackers=list(range(n - f, n)), num_byzantine=f)
            for config in args.rules:
                for attack in args.attacks:
                    run = Run(config, attack)
                    train_one(run, data, eval_model, setup)
                    log(run, f"alpha={alpha} f={f}")
                    cells.append({"alpha": alpha, "f": f, **asdict(run)})
    return {"cells": cells, "references": references}


def heatmap_tables(out: dict, args) -> str:
    cells = out["cells"]
    lines = []
    alpha_name = {a: ("IID" if a is None else f"α = {a:g}") for a in args.alphas}
    best = {}
    for config in args.rules:
        header = ["f"] + [alpha_name[a] for a in args.alphas]
        rows = []
        for f in args.fs:
            row = [f"{f} of {args.replicas}"]
            for alpha in args.alphas:
                runs = [
                    Run(**{k: v for k, v in c.items() if k not in ("alpha", "f")})
                    for c in cells
                    if c["alpha"] == alpha and c["f"] == f and c["rule"] == config
                ]
                acc, attack = worst(runs)
                clean = next(r for r in runs if r.attack == "none")
                row.append(
                    f"{_pct(acc)} ({_label(attack)}; clean {_pct(clean.accuracy)})"
                )
                if acc > best.get((alpha, f), (-1.0, ""))[0]:
                    best[(alpha, f)] = (acc, config, attack)
            rows.append(row)
        lines += [
            f"`{config}`: worst case over {len(args.attacks) - 1} attacks "
            "(held-out accuracy %; the attack; the configuration's clean run):",
            "",
            harness.markdown_table(rows, header),
            "",
        ]
    header = [
        "data",
        "f",
        "clean mean",
        "honest only",
        "best worst case (config)",
        "below honest only",
        "bound term f/(n-2f) G²/|mean|² (start; median over epochs; end)",
    ]
    rows = []
    for ref in out["references"]:
        acc, config, attack = best[(ref["alpha"], ref["f"])]
        terms = ref["bound_terms"]
        rows.append(
            [
                alpha_name[ref["alpha"]],
                str(ref["f"]),
                _pct(ref["clean_mean"]),
                _pct(ref["honest_only"]),
                f"{_pct(acc)} (`{config}`, {_label(attack)})",
                f"{100 * (ref['honest_only'] - acc):.1f}",
                f"{terms[0]:.2f}; {float(np.median(terms)):.2f}; {terms[-1]:.2f}",
            ]
        )
    lines += [
        "Per data and f: the references (see the script's docstring):",
        "",
        harness.markdown_table(rows, header),
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------- momentum


def momentum_check(paths: list[str]) -> tuple[str, list[dict]]:
    """From robustness.py JSONs (nothing trained): every configuration that
    ran both without and with worker momentum (``X`` and ``X+wm``), and each
    attack under which the momentum's accuracy is below the raw one's."""
    rows, below = [], []
    for path in paths:
        payload = json.loads(Path(path).read_text())
        config = payload["config"]
        data = config.get("data", "iid")
        by_key = {(r["rule"], r["attack"]): r for r in payload["runs"]}
        for raw in config["rules"]:
            wm = raw + "+wm"
            if raw.endswith("+wm") or wm not in config["rules"]:
                continue
            if parse_config(raw)[0] == "mean":
                continue
            lower, compared = [], 0
            for attack in config["attacks"]:
                a, b = by_key.get((raw, attack)), by_key.get((wm, attack))
                if not a or not b or "ok" not in (a["status"], b["status"]):
                    continue
                acc_a = a["accuracy"] if a["status"] == "ok" else 0.0
                acc_b = b["accuracy"] if b["status"] == "ok" else 0.0
                compared += 1
                if acc_b < acc_a:
                    lower.append((attack, acc_a, acc_b))
                    below.append(
                        {
                            "json": Path(path).name,
                            "config": raw,
                            "attack": attack,
                            "raw": acc_a,
                            "wm": acc_b,
                        }
                    )
            cells = "; ".join(
                f"{'clean' if att == 'none' else _label(att)} {100 * x:.1f} → {100 * y:.1f}"
                for att, x, y in lower
            )
            rows.append(
                [
                    f"`{raw}`",
                    f"{data}, seed {config['seed']} (`{Path(path).name}`)",
                    f"{compared - len(lower)}/{compared}",
                    cells or "—",
                ]
            )
    header = [
        "rule",
        "data",
        "attacks (clean incl.) with +wm >= raw",
        "where +wm is below",
    ]
    return harness.markdown_table(rows, header), below


# -------------------------------------------------------------------- main


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="The field's protocol on robustness.py's runs: tuned "
        "hyperparameters (tune) and f x heterogeneity heatmaps (heatmap)."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser(
        "momentum",
        help="train nothing: from robustness.py JSONs, where each rule with "
        "worker momentum is below its own result without",
    )
    check.add_argument("jsons", nargs="+", metavar="JSON")
    check.add_argument("--output", help="also write the table to this markdown file")
    for name, helptext in (
        ("tune", "hyperparameters chosen by worst-case validation accuracy"),
        ("heatmap", "worst case over f x Dirichlet alpha, with references"),
    ):
        sub = commands.add_parser(name, help=helptext)
        sub.add_argument("--rules", required=True, help="comma-separated configs")
        sub.add_argument("--seed", type=int, default=0)
        sub.add_argument("--epochs", type=harness.positive, default=20)
        sub.add_argument("--replicas", type=harness.positive, default=8)
        sub.add_argument("--hidden", type=harness.positive, default=64)
        sub.add_argument("--json", help=f"(benchmarks/results/robustness_{name}.json)")
        sub.add_argument("--output", help="also write the tables to this markdown file")
        if name == "tune":
            sub.add_argument("--attacks", help="(default: none and every attack)")
            sub.add_argument("--attackers", default="6,7", help="(6,7)")
            sub.add_argument("--num-byzantine", type=int, default=2, help="(2)")
            sub.add_argument("--lrs", default="0.025,0.05,0.1", help="(0.025,0.05,0.1)")
            sub.add_argument("--betas", default="0.9,0.99", help="(0.9,0.99)")
            sub.add_argument("--validation", type=float, default=0.2, help="(0.2)")
        else:
            sub.add_argument("--attacks", help=f"(none,{','.join(HEATMAP_ATTACKS)})")
            sub.add_argument("--fs", help="attackers counts (default 1 .. n/2 - 1)")
            sub.add_argument(
                "--alphas", default="iid,1,0.5,0.1", help="(iid,1,0.5,0.1)"
            )
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.command == "momentum":
        return args
    args.rules = _list(args.rules)
    default_attacks = (
        list(ATTACKS) if args.command == "tune" else ["none", *HEATMAP_ATTACKS]
    )
    args.attacks = default_attacks if args.attacks is None else _list(args.attacks)
    unknown = [a for a in args.attacks if a not in ATTACKS]
    if unknown:
        parser.error(
            f"--attacks: unknown {', '.join(unknown)}; known: {', '.join(ATTACKS)}"
        )
    if "none" not in args.attacks:
        args.attacks.insert(0, "none")
    bad = [c for c in args.rules if parse_config(c)[0] == "mean"]
    if bad:
        parser.error(
            "--rules: the mean is the reference every table runs; leave it out"
        )
    if args.command == "tune":
        args.attackers = _list(args.attackers, int)
        args.lrs = _list(args.lrs, float)
        args.betas = _list(args.betas, float)
        if not 0 < args.validation < 1:
            parser.error(f"--validation must be in (0, 1), got {args.validation}")
    else:
        n = args.replicas
        args.fs = (
            list(range(1, (n + 1) // 2)) if args.fs is None else _list(args.fs, int)
        )
        if any(not 1 <= f < n / 2 for f in args.fs):
            parser.error(
                f"--fs: each f in 1 .. {(n - 1) // 2} (f < n/2) for n = {n}; got {args.fs}"
            )
        args.alphas = [
            None if a.lower() == "iid" else float(a) for a in _list(args.alphas)
        ]
        if any(a is not None and not a > 0 for a in args.alphas):
            parser.error("--alphas: iid or numbers > 0")
    args.json = args.json or str(harness.RESULTS / f"robustness_{args.command}.json")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.command == "momentum":
        table, _ = momentum_check(args.jsons)
        command = "python benchmarks/robustness_protocol.py " + " ".join(args.argv)
        text = f"`{command}`\n\n{table}"
        print(text)
        if args.output:
            Path(args.output).write_text(text + "\n")
        return 0
    tf.config.experimental.enable_op_determinism()
    start = time.perf_counter()
    if args.command == "tune":
        out = tune(args)
        text = tune_tables(out, args)
        payload = {"clean_mean": asdict(out["clean_mean"]), "runs": out["runs"]}
        payload["chosen"] = {c: r["chosen"] for c, r in out["results"].items()}
    else:
        out = heatmap(args)
        text = heatmap_tables(out, args)
        payload = out
    wall = time.perf_counter() - start
    command = "python benchmarks/robustness_protocol.py " + " ".join(
        a for a in args.argv
    )
    text = f"`{command}` ({wall / 60:.1f} min wall)\n\n" + text
    print(text)
    harness.write_results(
        args.json,
        {
            "benchmark": f"robustness_{args.command}",
            "config": {k: v for k, v in vars(args).items() if k != "argv"}
            | {"argv": args.argv},
            "environment": {},
            "wall_s": wall,
            **payload,
        },
    )
    if args.output:
        Path(args.output).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
