"""End-to-end robustness table: held-out accuracy of every rule under every attack.

What it measures
----------------
For each registered aggregation rule and each simulated attack, one training
run of the same model on the same data, and its accuracy on held-out data:

* data: scikit-learn's ``load_digits`` (8x8 images, 10 classes, 1,797
  samples, bundled with scikit-learn: nothing is downloaded), pixels scaled
  to [0, 1], shuffled with a fixed seed, 80 % train / 20 % held out;
* model: MLP 64 -> ``--hidden`` (relu) -> 10 logits, SGD with momentum,
  sparse cross-entropy from logits, global batch ``--batch`` split over
  ``--replicas`` (default 8) logical CPU replicas of one
  ``keras_psdist.PSStrategy``;
* attackers: replicas ``--attackers`` (default 6 and 7); every robust rule
  runs with ``num_byzantine=--num-byzantine`` (default 2). ``mean`` refuses
  ``num_byzantine > 0`` and runs with 0: it is the undefended baseline. A rule
  whose condition fails for (n, f) is listed as ``n/a: condition`` with the
  reason its ``bind`` gave;
* attacks (strengths chosen so that the undefended mean visibly breaks under
  at least the sign flip, the large IPM and NaN; see ``ATTACKS``).

Every run resets the seeds (``keras.utils.set_random_seed``) before building
its model, so all runs start from the same weights and see the same batches;
with TensorFlow's op determinism on (the default) a re-run reproduces the
table.

Each run trains in ONE ``fit`` call over a repeated dataset, so the
distributed iterator is created once per run. Accuracy is computed eagerly on
a plain (undistributed) copy of the model, so evaluation adds no trace.

How to run
----------
From the repository root::

    python benchmarks/robustness.py            # full table, ~35 min on 2 cores
    python benchmarks/robustness.py --quick    # smoke run, ~1 min

The full run rewrites the generated block of ``docs/robustness.md`` (between
the ``BEGIN GENERATED`` / ``END GENERATED`` markers; the prose around it is
kept) and writes ``benchmarks/results/robustness.json`` (every run's
accuracy, loss, time and the aggregator's per-replica report).

Options: ``--rules``, ``--attacks`` (comma-separated subsets), ``--epochs``,
``--quick``, ``--output PATH.md``, ``--json PATH``, ``--diagnose
rule:attack,...`` (runs whose per-replica report is shown), ``--tolerance``
(accuracy points a robust rule may lose against the clean mean run),
``--noise RUNS`` (train no table: how much of a gap the draw makes, see
``harness/robustness_noise.py``), ``--num-byzantine``, ``--section NAME``
(a second generated block in the same
markdown file), ``--from-json PATH`` (train nothing: re-render a previous
run's tables and checks), ``--across-seeds PATH,PATH,...`` (train nothing:
from runs that differ in ``--seed`` only, each configuration's worst case per
seed and over all seeds; one seed's table is one draw of the data order and,
with ``--data dirichlet:ALPHA``, of the split).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import re
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

import harness
from harness import REPO_ROOT, Column, config_names, parse_config
from harness import log as _log

# Before TensorFlow is imported anywhere in this process.
harness.prepare_tensorflow()
harness.ensure_importable()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import logging as absl_logging  # noqa: E402
from harness.digits import (  # noqa: E402  (the runs, shared with --noise)
    ATTACKS,
    Run,
    Setup,
    attack_list,
    build_model,
    load_data,
    rule_f,
    train_one,
)

import keras_psdist as kpd  # noqa: E402
from keras_psdist.devices import split_host_cpu  # noqa: E402

DEFAULTS = Setup()


def markers(section: str | None) -> tuple[str, str]:
    """The comments around a generated block (one pair per `--section`)."""
    name = "benchmarks/robustness.py" + (f" [{section}]" if section else "")
    return f"<!-- BEGIN GENERATED: {name} -->", f"<!-- END GENERATED: {name} -->"


# Attacks that must break the undefended mean, or the table proves nothing.
MUST_BREAK_MEAN = ("sign_flip", "ipm_large", "nan")
DEFAULT_DIAGNOSE = (
    "krum:sign_flip",
    "krum:alie",
    "krum:ipm_small",
    "multi_krum:ipm_large",
    "trimmed_mean:sign_flip",
    "centered_clipping:alie",
)


# ------------------------------------------------------------------ setup


# -------------------------------------------------------------------- runs


def run_table(args) -> tuple[list[Run], dict]:
    load_start = harness.loadavg()
    args.devices = split_host_cpu(args.replicas)
    if args.deterministic:
        tf.config.experimental.enable_op_determinism()
    data = load_data(args.seed)
    eval_model = build_model(args.hidden, args.lr, args.momentum)
    runs = []
    total = len(args.rules) * len(args.attacks)
    for rule in args.rules:
        for attack in args.attacks:
            run = Run(rule, attack)
            train_one(run, data, eval_model, args)
            runs.append(run)
            _log(f"[{len(runs)}/{total}] {_describe(run)}")
    info = {
        "devices": args.devices,
        "train_samples": len(data[0]),
        "held_out_samples": len(data[2]),
        "steps_per_epoch": (
            -(-len(data[0]) // args.batch)
            if args.input == "arrays"
            else len(data[0]) // args.batch
        ),
        "loadavg_start": load_start,
        "loadavg_end": harness.loadavg(),
    }
    return runs, info


def _describe(run: Run) -> str:
    head = f"{run.rule} x {run.attack}"
    if run.status != "ok":
        return f"{head}: {run.status}: {run.reason}"
    tail = "" if run.finite_weights else ", non-finite weights"
    return (
        f"{head}: accuracy {run.accuracy:.3f}, loss {run.final_loss:.3g}, "
        f"{run.time_s:.1f}s{tail}"
    )


# ---------------------------------------------------------------- verdicts


def baseline(runs: list[Run]) -> float | None:
    """The clean mean run's accuracy: what every robust rule is compared with."""
    for run in runs:
        if run.rule == "mean" and run.attack == "none" and run.status == "ok":
            return run.accuracy
    return None


def verdicts(runs: list[Run], args) -> list[str]:
    """PASS/FAIL lines: the attacks bite the mean; robust rules stay close."""
    base = baseline(runs)
    if base is None:
        return ["no clean mean run: checks skipped (add mean and none)"]
    lines = []
    for run in runs:
        if not _undefended(run) or run.attack not in MUST_BREAK_MEAN:
            continue
        if run.status != "ok":
            lines.append(f"{run.rule} x {run.attack}: {run.status}")
            continue
        drop = 100 * (base - run.accuracy)
        ok = drop >= args.broken_drop
        lines.append(
            f"{'PASS' if ok else 'FAIL'} attack bites: {run.rule} x {run.attack} "
            f"accuracy {run.accuracy:.3f}, {_points(drop)} the clean run "
            f"(need >= {args.broken_drop:g} below)"
        )
    skipped = {}
    for run in runs:
        if _undefended(run):
            continue
        if run.status == "n/a":
            skipped.setdefault(run.rule, []).append(run.attack)
            continue
        if run.status != "ok":
            lines.append(f"FAIL {run.rule} x {run.attack} crashed: {run.reason}")
            continue
        drop = 100 * (base - run.accuracy)
        ok = drop <= args.tolerance
        if not ok or args.verbose_verdicts:
            lines.append(
                f"{'PASS' if ok else 'FAIL'} {run.rule} x {run.attack}: accuracy "
                f"{run.accuracy:.3f}, {_points(drop)} the clean mean run "
                f"(bar: {args.tolerance:g} below)"
            )
    for rule, attacks in skipped.items():
        lines.append(
            f"n/a  {rule}: its condition fails for n={args.replicas}, "
            f"f={args.num_byzantine} ({len(attacks)} runs skipped)"
        )
    robust_ok = [r for r in runs if not _undefended(r) and r.status == "ok"]
    misses = [r for r in robust_ok if 100 * (base - r.accuracy) > args.tolerance]
    lines.append(
        f"robust runs within {args.tolerance:g} points of the clean mean "
        f"({base:.3f}): {len(robust_ok) - len(misses)}/{len(robust_ok)}"
    )
    return lines


def _undefended(run: Run) -> bool:
    return parse_config(run.rule, allow_compression=True)[0] == "mean"


def worst_case(runs: list[Run], config: str, attacks: list[str]) -> Run | None:
    """The configuration's run with the lowest accuracy over every attack
    (`none` left out); a failed run counts as the worst. None if n/a."""
    attacked = [r for r in runs if r.rule == config and r.attack in attacks]
    attacked = [r for r in attacked if r.attack != "none"]
    if not attacked or any(r.status == "n/a" for r in attacked):
        return None
    failed = [r for r in attacked if r.status != "ok"]
    if failed:
        return failed[0]
    return min(attacked, key=lambda r: r.accuracy)


def _worst_cell(runs: list[Run], config: str, args) -> str:
    worst = worst_case(runs, config, args.attacks)
    if worst is None:
        return "n/a"
    if worst.status != "ok":
        return f"failed ({ATTACKS[worst.attack].label})"
    return f"{100 * worst.accuracy:.1f} ({ATTACKS[worst.attack].label})"


def plot_heatmap(runs: list[Run], args, path: str) -> None:
    """Accuracy per configuration (rows) and attack (columns), worst last."""
    columns = list(args.attacks) + ["worst"]
    grid = np.full((len(args.rules), len(columns)), np.nan)
    by_key = {(r.rule, r.attack): r for r in runs}
    for i, config in enumerate(args.rules):
        for j, attack in enumerate(args.attacks):
            run = by_key.get((config, attack))
            if run is not None and run.status == "ok":
                grid[i, j] = 100 * run.accuracy
            elif run is not None and run.status == "failed":
                grid[i, j] = 0.0
        worst = worst_case(runs, config, args.attacks)
        if worst is not None:
            grid[i, -1] = 100 * worst.accuracy if worst.status == "ok" else 0.0
    labels = [ATTACKS[a].label for a in args.attacks] + ["worst case"]
    with harness.figure(
        path, figsize=(1.0 + 0.8 * len(columns), 1.0 + 0.38 * len(args.rules))
    ) as (fig, ax):
        image = ax.imshow(grid, cmap="RdYlGn", vmin=0, vmax=100, aspect="auto")
        ax.set_xticks(range(len(columns)), labels, rotation=45, ha="right")
        ax.set_yticks(range(len(args.rules)), args.rules)
        for i in range(grid.shape[0]):
            for j in range(grid.shape[1]):
                if np.isfinite(grid[i, j]):
                    ax.text(
                        j, i, f"{grid[i, j]:.0f}", ha="center", va="center", fontsize=7
                    )
        ax.axvline(len(columns) - 1.5, color="black", linewidth=1.5)
        title = (
            "IID" if args.alpha is None else f"non-IID, Dirichlet alpha={args.alpha:g}"
        )
        ax.set_title(
            f"Held-out accuracy (%), digits, {args.replicas} replicas, "
            f"{len(args.attackers)} attackers, {title}",
            fontsize=9,
        )
        fig.colorbar(image, ax=ax, fraction=0.03)


def _points(drop: float) -> str:
    return f"{abs(drop):.1f} points {'below' if drop >= 0 else 'above'}"


# ---------------------------------------------------------------- report


def _cell(run: Run, base: float | None, tolerance: float) -> str:
    if run.status == "n/a":
        return "n/a: condition"
    if run.status == "failed":
        return "failed"
    text = f"{100 * run.accuracy:.1f}"
    if not run.finite_weights:
        text += " (NaN)"
    if base is not None and 100 * (base - run.accuracy) > tolerance:
        text = f"**{text}**"
    return text


def markdown_table(runs: list[Run], args) -> str:
    base = baseline(runs)
    by_key = {(r.rule, r.attack): r for r in runs}
    header = ["rule (f)"] + [ATTACKS[a].label for a in args.attacks] + ["worst case"]
    rows = []
    for rule in args.rules:
        f = rule_f(rule, args)
        cells = [f"`{rule}` ({f})"]
        cells += [_cell(by_key[(rule, a)], base, args.tolerance) for a in args.attacks]
        cells.append(_worst_cell(runs, rule, args))
        rows.append(cells)
    return harness.markdown_table(rows, header)


def text_table(runs: list[Run], args) -> str:
    base = baseline(runs)
    by_key = {(r.rule, r.attack): r for r in runs}
    width = max(11, *(len(ATTACKS[a].label) for a in args.attacks))
    columns = [Column("rule (f)", max(22, *(len(r) + 5 for r in args.rules)), "<")]
    columns += [Column(ATTACKS[a].label, width + 1) for a in args.attacks]
    columns.append(Column("worst case", 24))
    rows = []
    for rule in args.rules:
        row = [rule + f" ({rule_f(rule, args)})"]
        for a in args.attacks:
            run = by_key[(rule, a)]
            cell = _cell(run, base, args.tolerance).replace("**", "*")
            if run.status == "n/a":
                cell = "n/a"
            row.append(cell)
        row.append(_worst_cell(runs, rule, args))
        rows.append(row)
    lines = harness.text_table(columns, rows, sep="")
    lines.append(
        f"held-out accuracy in %; * = more than {args.tolerance:g} points below "
        "the clean mean run; (NaN) = non-finite weights"
    )
    return "\n".join(lines)


def diagnostics(runs: list[Run], args) -> list[str]:
    """The per-replica report of the runs named by --diagnose, last epoch."""
    by_key = {(r.rule, r.attack): r for r in runs}
    out = []
    for key in args.diagnose:
        run = by_key.get(key)
        if run is None or run.status != "ok" or not run.report:
            continue
        attackers = ", ".join(str(r) for r in args.attackers)
        for name, epochs in run.report.items():
            last = epochs[-1]
            values = " ".join(f"{v:.2f}" for v in last)
            out.append(
                f"{run.rule} x {ATTACKS[run.attack].label} ({name}, mean over "
                f"the last epoch's steps, replicas 0..{len(last) - 1}; attackers "
                f"{attackers}): {values}"
            )
    return out


def markdown_block(runs: list[Run], info: dict, args, wall_s: float, env: dict) -> str:
    base = baseline(runs)
    na = [r for r in runs if r.status == "n/a" and r.attack == args.attacks[0]]
    failed = [r for r in runs if r.status == "failed"]
    times = [r.time_s for r in runs if r.status == "ok"]
    begin, end = markers(args.section)
    lines = [
        begin,
        "",
        f"Generated by `python benchmarks/robustness.py{_cli_suffix(args)}` on "
        f"{env['date'][:10]} ({wall_s / 60:.1f} min wall on {env['cpu_count']} "
        f"CPUs, load average {info['loadavg_start']} -> {info['loadavg_end']}; "
        f"TF {env['tensorflow']}, Keras {env['keras']}"
        + (f", commit {env['git_commit'][:10]}" if env["git_commit"] else "")
        + ").",
        "",
        f"Held-out accuracy (%) on {info['held_out_samples']} digits after "
        f"{args.epochs} epochs x {info['steps_per_epoch']} steps; "
        + (
            (
                "IID data"
                if args.input == "dataset"
                else "IID data fed as arrays (`model.fit(x, y, batch_size=...)`: "
                "Keras's shuffle, a partial last batch each epoch)"
            )
            if args.alpha is None
            else f"non-IID data (replica r trains on part r of a Dirichlet("
            f"{args.alpha:g}) split over labels)"
        )
        + f"; {args.replicas} replicas, attackers = replicas "
        f"{', '.join(map(str, args.attackers))}; f = `num_byzantine` in "
        f"parentheses. **Bold**: more than {args.tolerance:g} points below the "
        "clean `mean` run"
        + (f" ({100 * base:.1f})" if base is not None else "")
        + "; (NaN): the weights became non-finite.",
        "",
        markdown_table(runs, args),
        "",
    ]
    for run in na:
        lines.append(f"- `{run.rule}` n/a: condition: {run.reason}")
    for run in failed:
        lines.append(f"- `{run.rule}` x {run.attack} failed: {run.reason}")
    if times:
        lines.append(
            f"- time per run (build, trace, train, evaluate): median "
            f"{np.median(times):.1f} s, max {max(times):.1f} s"
        )
    lines += ["", "Checks:", "", "```"] + verdicts(runs, args) + ["```"]
    diag = diagnostics(runs, args)
    if diag:
        lines += ["", "Per-replica reports (`AggregationReport`):", "", "```"]
        lines += diag + ["```"]
    lines += ["", end]
    return "\n".join(lines)


def write_markdown(path: str, block: str, section: str | None) -> None:
    """Replaces the generated block of `path` (or appends it / creates the file)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = out.read_text() if out.exists() else ""
    begin, end = markers(section)
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = (text.rstrip() + "\n\n" if text else "") + block
    out.write_text(text.rstrip() + "\n")


def _cli_suffix(args) -> str:
    """The run's flags, less those that only say where results are written."""
    shown, skip = [], False
    for arg in args.argv:
        if skip:
            skip = False
            continue
        if arg in (
            "--output",
            "--json",
            "--from-json",
            "--across-seeds",
            "--seed-means",
        ):
            skip = True
            continue
        if arg.split("=")[0] in (
            "--output",
            "--json",
            "--from-json",
            "--across-seeds",
            "--seed-means",
        ):
            continue
        shown.append(arg)
    return "".join(f" {shlex.quote(a)}" for a in shown)  # copied, it runs


def write_json(path: str, runs: list[Run], info: dict, args, wall_s: float) -> None:
    config = {
        k: v for k, v in vars(args).items() if k not in ("devices",) and _plain(v)
    }
    payload = {
        "benchmark": "robustness",
        "config": config,
        "attack_configs": {
            name: (
                None
                if (a := ATTACKS[name].build(list(args.attackers), args.seed)) is None
                else kpd.attacks.serialize(a)
            )
            for name in args.attacks
        },
        "environment": {},
        "info": info,
        "wall_s": wall_s,
        "clean_mean_accuracy": baseline(runs),
        "checks": verdicts(runs, args),
        "runs": [asdict(r) for r in runs],
    }
    harness.write_results(path, payload)


def _plain(value) -> bool:
    return isinstance(value, str | int | float | bool | list | tuple | type(None))


# What may differ between the runs `--across-seeds` compares: the seed and
# where results were written.
_SEED_ONLY = ("seed", "argv", "json", "output", "section", "plot", "from_json")
# Options added later, as results written before them ran.
_DEFAULTS = {"input": "dataset"}


def _same_setup(paths: list[str], free: tuple[str, ...], what: str) -> list[dict]:
    """The JSON results at `paths`, or a `ValueError` naming the first whose
    setup differs from the first's in an option not in `free`."""
    payloads = [json.loads(Path(path).read_text()) for path in paths]
    first = payloads[0]["config"]
    for path, payload in zip(paths, payloads, strict=True):
        config = payload["config"]
        differ = sorted(
            key
            for key in set(first) | set(config)
            if key not in free
            and first.get(key, _DEFAULTS.get(key))
            != config.get(key, _DEFAULTS.get(key))
        )
        if differ:
            raise ValueError(
                f"{what}; {path} differs from {paths[0]} in {', '.join(differ)}. "
                "Re-run it with the same options."
            )
    return payloads


def _block(section: str | None, caption: str, rows: list, header: list) -> str:
    """A generated markdown block: its markers, `caption`, the table."""
    begin, end = markers(section)
    return "\n".join(
        [begin, "", caption, "", harness.markdown_table(rows, header), "", end]
    )


def across_seeds_block(paths: list[str], section: str | None) -> str:
    """Each configuration's worst case over the attacks, for each seed's run
    and over all of them: the table that says how much one seed's table can
    be trusted.

    Args:
        paths: JSON results of `robustness.py` runs that differ in `--seed`
            only (the seed also draws the non-IID split).
        section: The generated block's `--section`.

    Returns:
        The markdown block (with its markers).

    Raises:
        ValueError: A run's setup differs in anything but the seed, or its
            configurations or attacks differ.
    """
    payloads = _same_setup(
        paths,
        _SEED_ONLY,
        "--across-seeds compares runs that differ in --seed only",
    )
    first = payloads[0]["config"]
    seeds = [payload["config"]["seed"] for payload in payloads]
    args = argparse.Namespace(attacks=first["attacks"])
    tables = [[Run(**r) for r in payload["runs"]] for payload in payloads]
    header = (
        ["configuration"]
        + [f"seed {seed}: clean / worst" for seed in seeds]
        + ["worst over seeds", "most below its seed's clean `mean`"]
    )
    rows = []
    for config in first["rules"]:
        if parse_config(config, allow_compression=True)[0] == "mean":
            continue
        cells, worst, gap = [f"`{config}`"], None, None
        for runs in tables:
            clean = next(
                (r for r in runs if r.rule == config and r.attack == "none"), None
            )
            run = worst_case(runs, config, args.attacks)
            base = baseline(runs)
            if run is None or run.status != "ok" or clean is None:
                cells.append(_worst_cell(runs, config, args))
                continue
            cells.append(
                f"{100 * clean.accuracy:.1f} / {_worst_cell(runs, config, args)}"
            )
            worst = run.accuracy if worst is None else min(worst, run.accuracy)
            if base is not None:
                below = 100 * (base - run.accuracy)
                gap = below if gap is None else max(gap, below)
        cells.append("n/a" if worst is None else f"{100 * worst:.1f}")
        cells.append("n/a" if gap is None else f"{gap:.1f}")
        rows.append(cells)
    data = first.get("data", "iid")
    if first.get("input", "dataset") == "arrays":
        data += ", fed as arrays"
    names = ", ".join(f"`{Path(path).name}`" for path in paths)
    return _block(
        section,
        f"Generated by `python benchmarks/robustness.py --across-seeds ...` "
        f"from {names} ({data} data, {first['epochs']} epochs, "
        f"{sum(a != 'none' for a in args.attacks)} attacks; seeds "
        f"{', '.join(map(str, seeds))}). "
        "Clean: the configuration without attack; worst: its lowest "
        "accuracy over the attacks, the attack in parentheses; the last "
        "column: how far that worst case falls below the undefended clean "
        "`mean` run of the same seed, at most.",
        rows,
        header,
    )


# What may differ between the runs `--seed-means` averages, beside the seed:
# which configurations ran and how the replicas read the variables.
_SEED_MEANS_FREE = (*_SEED_ONLY, "rules", "attacks", "read_dtype", "read_compression")


def _with_reads(config: str, setup: dict) -> str:
    """A configuration's label, with the reads it ran with."""
    reads = [
        f"{name} {setup[key]}"
        for key, name in (("read_dtype", "reads"), ("read_compression", "by change"))
        if setup.get(key)
    ]
    return f"`{config}`" + (f" ({', '.join(reads)})" if reads else "")


def seed_means_block(paths: list[str], section: str | None) -> str:
    """Each configuration's clean accuracy (no attack) on each seed, the
    mean over seeds, and its distance to the first configuration's mean:
    accuracy at the same number of steps, e.g. compressed against not.

    Args:
        paths: JSON results of `robustness.py` runs with the same setup
            (epochs, model, data, replicas) and any seeds, configurations
            and reads (`--read-dtype`, `--read-compression`).
        section: The generated block's `--section`.

    Raises:
        ValueError: A run's setup differs in more than that.
    """
    payloads = _same_setup(
        paths, _SEED_MEANS_FREE, "--seed-means averages runs of the same setup"
    )
    first = payloads[0]["config"]
    accuracies: dict[str, dict[int, float]] = {}
    for payload in payloads:
        setup = payload["config"]
        for run in payload["runs"]:
            if run["attack"] == "none" and run["status"] == "ok":
                label = _with_reads(run["rule"], setup)
                accuracies.setdefault(label, {})[setup["seed"]] = run["accuracy"]
    seeds = sorted({s for by_seed in accuracies.values() for s in by_seed})
    labels = list(accuracies)
    means = {
        label: float(np.mean(list(accuracies[label].values()))) for label in labels
    }
    base = labels[0]
    rows = []
    for label in labels:
        by_seed = accuracies[label]
        rows.append(
            [label]
            + [f"{100 * by_seed[s]:.1f}" if s in by_seed else "n/a" for s in seeds]
            + [
                f"{100 * means[label]:.1f}",
                f"{100 * (means[label] - means[base]):+.1f}",
            ]
        )
    header = ["configuration"] + [f"seed {s}" for s in seeds] + ["mean", f"vs {base}"]
    names = ", ".join(f"`{Path(path).name}`" for path in paths)
    return _block(
        section,
        f"Generated by `python benchmarks/robustness.py --seed-means ...` from "
        f"{names} ({first['epochs']} epochs, {first['replicas']} replicas, "
        f"hidden {first['hidden']}, no attack). Held-out accuracy in %; the "
        f"last column: the mean over seeds minus {base}'s, in points.",
        rows,
        header,
    )


# ------------------------------------------------------------------- CLI


def _ints(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s.strip()]


def _run_keys(text: str) -> list[tuple[str, str]]:
    keys = []
    for item in text.split(","):
        rule, _, attack = item.strip().partition(":")
        if not attack:
            raise argparse.ArgumentTypeError(f"expected rule:attack, got {item!r}")
        keys.append((rule, attack))
    return keys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = harness.BenchmarkParser(
        "Held-out accuracy of each aggregation rule under each "
        "simulated attack (digits, PSStrategy on logical CPU replicas).",
        name="robustness",
        quick_json=True,
        seed=False,
        json_help="raw results (default benchmarks/results/robustness[_quick].json)",
        output_group="output",
    )
    what = parser.add_argument_group("what to run")
    what.add_argument(
        "--rules",
        type=config_names,
        help="comma-separated configurations [pre>...>]rule[+wm[BETA]]: a "
        "registered rule, optionally behind pre-aggregations (nnm>, bucketing>, "
        "arc>, clipping>; chained, the leftmost outermost), any stage with "
        "arguments as rule(key=value;...), and with worker momentum 0.9 (+wm) "
        "or BETA (+wmBETA); default: every registered rule",
    )
    what.add_argument(
        "--attacks",
        type=attack_list,
        help=f"comma-separated attacks (default: all of {','.join(ATTACKS)}); "
        "any registered attack takes arguments as the rules' stages do, e.g. "
        "rop(z=0.3)",
    )
    what.add_argument(
        "--noise",
        type=int,
        metavar="RUNS",
        help="train no table: how far below the clean mean a harmless column "
        "falls by chance. The clean mean and each --rules configuration "
        "(default 'arc>geometric_median+wm') RUNS times each without attack, "
        "and under each of --attacks (default: none) RUNS times; at the "
        "default setup, on the split of --seed (harness/robustness_noise.py; "
        "default JSON benchmarks/results/robustness_noise_seed<SEED>.json)",
    )
    what.add_argument(
        "--columns",
        type=int,
        default=11,
        help="--noise: attack columns a worst case is taken over (11: the table's)",
    )
    what.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: mean, median, trimmed_mean x none, sign_flip, nan; "
        "3 epochs; output under benchmarks/results/",
    )
    setup = parser.add_argument_group("setup")
    setup.add_argument(
        "--data",
        default="iid",
        help="iid (default), or dirichlet:ALPHA: replica r trains on its part of "
        "a Dirichlet(ALPHA) split over labels (keras_psdist.heterogeneity)",
    )
    setup.add_argument(
        "--input",
        choices=("dataset", "arrays"),
        default=DEFAULTS.input,
        help="dataset (default): a repeated tf.data pipeline, reshuffled with "
        "the seed, full batches only; arrays: model.fit(x, y, batch_size=...) "
        "as a user writes it, Keras's own shuffle and a partial last batch "
        "each epoch (IID only)",
    )
    d = DEFAULTS
    setup.add_argument(
        "--epochs", type=int, help=f"epochs per run (default {d.epochs})"
    )
    setup.add_argument(
        "--replicas", type=int, default=d.replicas, help=f"default {d.replicas}"
    )
    setup.add_argument(
        "--attackers",
        type=_ints,
        default=list(d.attackers),
        help=f"default {','.join(map(str, d.attackers))}",
    )
    setup.add_argument(
        "--num-byzantine",
        type=int,
        default=d.num_byzantine,
        help=f"f of every robust rule (mean always runs with 0); default "
        f"{d.num_byzantine}",
    )
    setup.add_argument(
        "--batch", type=int, default=d.batch, help=f"global batch ({d.batch})"
    )
    setup.add_argument(
        "--hidden", type=int, default=d.hidden, help=f"hidden units ({d.hidden})"
    )
    setup.add_argument("--lr", type=float, default=d.lr, help=f"SGD rate ({d.lr:g})")
    setup.add_argument(
        "--momentum", type=float, default=d.momentum, help=f"({d.momentum:g})"
    )
    setup.add_argument(
        "--seed", type=int, default=d.seed, help=f"random seed ({d.seed})"
    )
    setup.add_argument(
        "--read-dtype",
        help="every replica reads the variables in this dtype (PSStrategy's "
        "read_dtype: bfloat16, float16), each read from another device "
        "counted as one across tasks, as on a cluster",
    )
    setup.add_argument(
        "--read-compression",
        help="every replica reads each large variable by its largest changes "
        "(PSStrategy's read_compression, e.g. 'top_k(ratio=0.05)'), as on a "
        "cluster",
    )
    setup.add_argument(
        "--no-deterministic",
        dest="deterministic",
        action="store_false",
        help="skip tf.config.experimental.enable_op_determinism() (on by default, "
        "so a re-run gives the same table)",
    )
    out = parser.output
    out.add_argument(
        "--output",
        metavar="PATH.md",
        help="markdown file whose generated block is replaced (default "
        "docs/robustness.md; with --quick benchmarks/results/robustness_quick.md)",
    )
    out.add_argument(
        "--section",
        help="name of the generated block to replace in --output, for a second "
        "table in the same file (default: the unnamed block)",
    )
    out.add_argument(
        "--plot",
        metavar="PATH.png",
        help="a heatmap of the table, configurations x attacks, worst case last",
    )
    out.add_argument(
        "--diagnose",
        type=_run_keys,
        default=[tuple(k.split(":")) for k in DEFAULT_DIAGNOSE],
        help="rule:attack runs whose per-replica report is printed",
    )
    out.add_argument(
        "--tolerance",
        type=float,
        default=4.0,
        help="accuracy points a robust rule may lose vs the clean mean (4)",
    )
    out.add_argument(
        "--broken-drop",
        type=float,
        default=20.0,
        help="accuracy points the mean must lose for an attack to count as biting (20)",
    )
    out.add_argument(
        "--verbose-verdicts", action="store_true", help="print PASS lines too"
    )
    out.add_argument(
        "--across-seeds",
        metavar="PATH,PATH,...",
        type=lambda text: [p for p in text.split(",") if p],
        help="train nothing: from the JSONs of runs that differ in --seed "
        "only, each configuration's worst case per seed and over all seeds "
        "(written to --output's --section block)",
    )
    out.add_argument(
        "--seed-means",
        metavar="PATH,PATH,...",
        type=lambda text: [p for p in text.split(",") if p],
        help="train nothing: from the JSONs of runs of one setup (any seeds, "
        "configurations and reads), each configuration's clean accuracy per "
        "seed, its mean, and its distance to the first one's (written to "
        "--output's --section block)",
    )
    out.add_argument(
        "--from-json",
        metavar="PATH",
        help="train nothing: re-render the tables and checks of a previous "
        "run's JSON (its rules, attacks and setup are used)",
    )
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.noise is not None:
        return _noise_args(parser, args)
    if args.quick:
        args.rules = args.rules or [
            r
            for r in ("mean", "median", "trimmed_mean")
            if r in kpd.aggregators.names()
        ]
        args.attacks = args.attacks or ["none", "sign_flip", "nan"]
        args.epochs = args.epochs or 3
    args.rules = args.rules or kpd.aggregators.names()
    args.attacks = args.attacks or list(ATTACKS)
    args.epochs = args.epochs or DEFAULTS.epochs
    args.output = args.output or (
        str(REPO_ROOT / "benchmarks/results/robustness_quick.md")
        if args.quick
        else str(REPO_ROOT / "docs/robustness.md")
    )
    if args.data == "iid":
        args.alpha = None
    else:
        kind, _, alpha = args.data.partition(":")
        try:
            args.alpha = float(alpha)
        except ValueError:
            args.alpha = None
        if kind != "dirichlet" or args.alpha is None or not args.alpha > 0:
            parser.error(
                f"--data must be iid or dirichlet:ALPHA (ALPHA > 0); got {args.data!r}"
            )
    if args.batch % args.replicas:
        parser.error(f"--batch ({args.batch}) must be a multiple of --replicas")
    if args.input == "arrays" and args.alpha is not None:
        parser.error(
            "--input arrays feeds every replica from all of x: it is for IID "
            "data. Leave --input out with --data dirichlet:ALPHA."
        )
    if any(not 0 <= r < args.replicas for r in args.attackers):
        parser.error(f"--attackers must be replica ids below {args.replicas}")
    return args


# Flags that change the table's setup or output: `--noise` runs the default
# setup (the table's, whose draw it measures) and writes its own JSON.
_NOT_WITH_NOISE = (
    "--quick", "--data", "--input", "--epochs", "--replicas", "--attackers",
    "--num-byzantine", "--batch", "--hidden", "--lr", "--momentum",
    "--read-dtype", "--read-compression", "--no-deterministic", "--output",
    "--section", "--plot", "--diagnose", "--broken-drop", "--verbose-verdicts",
    "--across-seeds", "--seed-means", "--from-json",
)  # fmt: skip


def _noise_args(parser, args) -> argparse.Namespace:
    """`args` of a `--noise` study, checked; its own defaults filled in."""
    if args.noise < 2:
        parser.error(f"--noise must be at least 2 runs (got {args.noise})")
    if args.columns < 1:
        parser.error(f"--columns must be at least 1 (got {args.columns})")
    if clash := [flag for flag in _NOT_WITH_NOISE if harness.given(args.argv, flag)]:
        parser.error(
            f"--noise runs the table's default setup; {', '.join(clash)} "
            "would change it. Leave them out (or run the table with them)."
        )
    args.rules = args.rules or config_names("arc>geometric_median+wm")
    args.attacks = [a for a in (args.attacks or []) if a != "none"]
    if not harness.given(args.argv, "--tolerance"):
        args.tolerance = 2.0  # points, for P(chance gap > tolerance)
    if not harness.given(args.argv, "--json"):
        args.json = str(
            REPO_ROOT / f"benchmarks/results/robustness_noise_seed{args.seed}.json"
        )
    return args


def load_json(path: str, args) -> tuple[list[Run], dict, float, dict]:
    """A previous run's results; its run parameters replace `args`'s."""
    payload = json.loads(Path(path).read_text())
    for key in RUN_PARAMETERS:
        if key in payload["config"]:
            setattr(args, key, payload["config"][key])
    args.attackers = list(args.attackers)
    args.attacks = attack_list(",".join(args.attacks))  # spelled ones: rop(z=3)
    runs = [Run(**r) for r in payload["runs"]]
    return runs, payload["info"], payload["wall_s"], payload["environment"]


# What a table depends on; --from-json takes these from the file.
RUN_PARAMETERS = (
    "argv",
    "data",
    "input",
    "alpha",
    "rules",
    "attacks",
    "epochs",
    "replicas",
    "attackers",
    "num_byzantine",
    "batch",
    "hidden",
    "lr",
    "momentum",
    "seed",
    "deterministic",
)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.noise is not None:
        from harness import robustness_noise

        return robustness_noise.run(args)
    if args.across_seeds or args.seed_means:
        block = (
            across_seeds_block(args.across_seeds, args.section)
            if args.across_seeds
            else seed_means_block(args.seed_means, args.section)
        )
        print(block)
        write_markdown(args.output, block, args.section)
        print(f"wrote {args.output}")
        return 0
    faulthandler.enable()
    harness.check_plotting(args.plot)
    if args.from_json:
        runs, info, wall_s, env = load_json(args.from_json, args)
    else:
        # PSStrategy warns when an attack controls more replicas than
        # num_byzantine: here that is the point of the mean's runs.
        absl_logging.set_verbosity(absl_logging.ERROR)
        if args.read_dtype or args.read_compression:
            harness.digits.reads_cross_devices()
        start = time.perf_counter()
        runs, info = run_table(args)
        wall_s = time.perf_counter() - start
        env = harness.environment()
    print(text_table(runs, args))
    print()
    print("\n".join(verdicts(runs, args)))
    diag = diagnostics(runs, args)
    if diag:
        print()
        print("\n".join(diag))
    for run in runs:
        if run.traceback:
            print(f"\n{run.rule} x {run.attack} failed:\n{run.traceback}")
    print(
        f"\nwall time: {wall_s / 60:.1f} min; load average (1/5/15 min) at start "
        f"{info['loadavg_start']}, at end {info['loadavg_end']}"
    )
    # The results first: a plot that fails loses no run.
    block = markdown_block(runs, info, args, wall_s, env)
    write_markdown(args.output, block, args.section)
    if args.from_json:
        print(f"wrote {args.output} (from {args.from_json})")
    else:
        write_json(args.json, runs, info, args, wall_s)
        print(f"wrote {args.output} and {args.json}")
    if args.plot:
        plot_heatmap(runs, args, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
