"""`model.fit` step time of PSStrategy with each aggregation rule, side by side.

What it measures
----------------
The steady-state time of one ``model.fit`` training step of the same model
under ``keras_psdist.PSStrategy`` with different aggregators, all in ONE
process on the same ``--replicas`` (default 8) logical CPU devices, and each
rule's time relative to ``mean`` (plain data-parallel averaging).

The model is an MLP 64 -> ``--hidden`` -> ``--hidden`` -> 10 (default 512:
about 300k parameters, 1.2 MB of gradients per replica and step, so the
aggregation is a visible part of the step), Adam, sparse cross-entropy from
logits, global batch ``--batch`` (default 256), synthetic NumPy data. Every
rule runs with ``num_byzantine`` = ``--num-byzantine`` (default 2), lowered to
the largest value its condition accepts for the replica count (``mean``: 0;
``bulyan`` at 8 replicas: 1). No attack: this is the cost of the defence.

Method (as ``strategies.py``): every model is built and warmed up first
(tracing excluded), then ``--repeats`` rounds; in each round every rule runs
one timed ``fit(epochs=1, steps_per_epoch=--steps)``, the order rotating
between rounds so drift of the machine's load hits every rule alike. Per rule:

* ``in-loop``  -- steady-state step time (2nd step to epoch end) / steps,
  median over rounds;
* ``vs mean``  -- the median over rounds of (rule's in-loop time / mean's
  in-loop time in the same round): paired, so a round slowed by other load
  cancels;
* ``ms/step``  -- the whole ``fit`` call / steps (includes Keras's per-``fit``
  cost of building distributed iterators), for reference.

With ``--mode steps`` a round is instead ``--steps`` (default 5) calls of
the model's compiled ``train_function`` (the step ``fit`` runs, same graph)
on a distributed iterator made once per model, for ``--repeats`` (default 60)
rounds: rounds last a fraction of a second instead of a minute, so the
pairing with ``mean`` cancels the machine's load drift much better; it leaves
out only ``fit``'s callback bookkeeping, which is the same for every rule.

Targets (PASS/FAIL): ``median`` and ``trimmed_mean`` <= 1.10x mean;
``krum`` and ``bulyan`` <= 1.25x mean; worker momentum's own cost, for every
``rule+wm`` run beside its ``rule`` (``mean+wm`` beside ``mean``,
``median+wm`` beside ``median``, ...): <= 1.05x that rule, paired by round
as above.

How to run
----------
From the repository root::

    python benchmarks/step_time_rules.py \\
        --json benchmarks/results/step_time_rules.json

    python benchmarks/step_time_rules.py --mode steps \\
        --json benchmarks/results/step_time_rules_steps.json

Options: ``--rules mean,median,...`` (``mean`` is always added: it is the
reference; a configuration may start with a compressor,
``top_k(ratio=0.01)>mean``: compression's cost on one host), ``--mode fit|steps``, ``--replicas``, ``--num-byzantine``,
``--hidden``, ``--batch``, ``--steps``, ``--repeats``, ``--warmup-steps``,
``--seed``, ``--quick``, ``--json PATH``, ``--plot PATH``.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import Column, format_row, text_table  # noqa: E402
from harness import log as _log  # noqa: E402
from harness import times as _x  # noqa: E402

harness.prepare_tensorflow()
harness.ensure_importable()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from harness.mlp import build_model, timed_fit  # noqa: E402

import keras_psdist as kpd  # noqa: E402
from keras_psdist.devices import split_host_cpu  # noqa: E402

INPUT_DIM = 64
NUM_CLASSES = 10
NUM_SAMPLES = 8192
DEFAULT_RULES = ("mean", "median", "trimmed_mean", "krum", "bulyan")
TARGETS = {
    "median": 1.10,
    "trimmed_mean": 1.10,
    "krum": 1.25,
    "bulyan": 1.25,
}
# Worker momentum's cost on a rule: rule+wm against the same rule, for every
# rule run both ways.
WORKER_MOMENTUM_TARGET = 1.05


def rule_names(text: str) -> list[str]:
    """argparse type: configurations `[pre>...>]rule[+wm[BETA]]` of registered
    rules (`harness.parse_config`, as `robustness.py` takes them)."""
    names = list(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    valid = kpd.aggregators.names()
    bad = []
    for name in names:
        try:  # the registry checks every stage's id
            kpd.aggregators.get(harness.parse_config(name, allow_compression=True)[1])
        except ValueError:
            bad.append(name)
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown rules {bad}; choose from {','.join(valid)}, each optionally "
            "behind pre-aggregations (arc>, nnm>, ...) and with +wm (worker "
            "momentum 0.9)"
        )
    return names


@dataclass
class Case:
    rule: str
    f: int | None = None
    model: keras.Model | None = None
    error: str | None = None
    traceback: str | None = None
    build_s: float | None = None
    warmup_s: float | None = None
    runs: list[dict] = field(default_factory=list)
    iterator: object | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.runs)

    def median(self, key: str) -> float | None:
        values = [r[key] for r in self.runs if r.get(key) is not None]
        return statistics.median(values) if self.ok and values else None


def largest_f(rule: str | dict, n: int, wanted: int) -> int:
    """The largest f <= wanted that the rule accepts for n replicas."""
    for f in range(wanted, -1, -1):
        try:
            kpd.aggregators.get(rule).bind(n, f)
            return f
        except ValueError:
            continue
    raise ValueError(f"{rule} accepts no num_byzantine <= {wanted} with {n} replicas")


def make_dataset(batch: int, seed: int) -> tf.data.Dataset:
    """Endless batches of synthetic 10-class data (a noisy linear rule)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((NUM_SAMPLES, INPUT_DIM)).astype(np.float32)
    w = rng.standard_normal((INPUT_DIM, NUM_CLASSES)).astype(np.float32)
    y = np.argmax(x @ w + 0.5 * rng.standard_normal((NUM_SAMPLES, NUM_CLASSES)), -1)
    return (
        tf.data.Dataset.from_tensor_slices((x, y.astype(np.int32)))
        .repeat()
        .batch(batch, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )


def prepare(case: Case, devices, dataset, args) -> None:
    """Builds and warms up one rule's model; records a failure instead of raising."""
    stage = "build"
    try:
        t0 = time.perf_counter()
        _, rule, beta = harness.parse_config(case.rule, allow_compression=True)
        case.f = largest_f(rule, len(devices), args.num_byzantine)
        strategy = kpd.PSStrategy(
            devices=devices,
            aggregator=rule,
            num_byzantine=case.f,
            worker_momentum=beta,
            compression=harness.compression_of(case.rule),
        )
        case.model = build_model(
            strategy, args.seed, hidden=args.hidden, num_classes=NUM_CLASSES
        )
        case.build_s = time.perf_counter() - t0
        stage = "warm-up"
        t0 = time.perf_counter()
        case.model.fit(
            dataset,
            epochs=1,
            steps_per_epoch=args.warmup_steps,
            verbose=0,
            shuffle=False,
        )
        if args.mode == "steps":
            case.iterator = iter(strategy.experimental_distribute_dataset(dataset))
            timed_steps(case, args.warmup_steps)
        case.warmup_s = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - report and go on
        case.error = f"{stage}: {type(e).__name__}: {e}".splitlines()[0]
        case.traceback = traceback.format_exc()
        case.model = None


def timed_steps(case: Case, steps: int) -> dict:
    """Runs `steps` calls of the model's compiled train step (what `fit` calls
    each step) on the case's persistent distributed iterator."""
    train_function = case.model.train_function
    start = time.perf_counter()
    for _ in range(steps):
        # Eager calls are synchronous: the step has run when this returns.
        train_function(case.iterator)
    ms = 1e3 * (time.perf_counter() - start) / steps
    return {"loop_ms": ms, "fit_ms": None}


def run_benchmark(args) -> tuple[list[Case], dict]:
    load_start = harness.loadavg()
    devices = split_host_cpu(args.replicas)
    dataset = make_dataset(args.batch, args.seed)
    cases = [Case(rule) for rule in args.rules]
    for case in cases:
        _log(f"building + warming up {case.rule} ...")
        prepare(case, devices, dataset, args)
        if case.error:
            _log(f"  failed: {case.error}")
        else:
            _log(
                f"  f={case.f}, build {case.build_s:.1f}s, warm-up {case.warmup_s:.1f}s"
            )

    def run_one(case: Case, r: int) -> dict:
        if args.mode == "steps":
            run = timed_steps(case, args.steps)
        else:
            run = timed_fit(case.model, dataset, args.steps)
        run["round"] = r
        case.runs.append(run)
        return run

    def on_error(rule: str, r: int, e: Exception) -> None:
        case = live[rule]
        case.error = f"round {r + 1}: {type(e).__name__}: {e}".splitlines()[0]
        case.traceback = traceback.format_exc()
        case.model = None

    def after_round(r: int, results: dict) -> None:
        if args.mode == "fit" or r % 10 == 9 or r == args.repeats - 1:
            parts = [
                f"{rule}={run['loop_ms']:.1f}"
                for rule, run in results.items()
                if not isinstance(run, Exception)
            ]
            _log(f"round {r + 1}/{args.repeats} (in-loop ms/step): {' '.join(parts)}")

    live = {c.rule: c for c in cases if c.error is None}
    rounds = harness.interleaved_rounds(
        live,
        run_one,
        args.repeats,
        drop_failed=True,
        on_error=on_error,
        after_round=after_round,
    )
    info = {
        "devices": devices,
        "orders": rounds.orders,
        "loadavg_start": load_start,
        "loadavg_end": harness.loadavg(),
    }
    return cases, info


def paired_ratios(case: Case, mean: Case, key: str = "loop_ms") -> list[float]:
    """Per round: the rule's time / mean's time in the same round."""
    return harness.paired_ratios(
        {r["round"]: r.get(key) for r in case.runs},
        {r["round"]: r.get(key) for r in mean.runs},
    )


def summary(cases: list[Case]) -> dict[str, dict]:
    mean = next((c for c in cases if c.rule == "mean" and c.ok), None)
    out = {}
    for c in cases:
        row = {
            "f": c.f,
            "ok": c.ok,
            "error": c.error,
            "in_loop_ms": c.median("loop_ms"),
            "fit_ms": c.median("fit_ms"),
        }
        if c.ok and mean is not None:
            ratios = paired_ratios(c, mean)
            row["ratio_to_mean"] = statistics.median(ratios) if ratios else None
            row["ratio_to_mean_min_max"] = (
                [min(ratios), max(ratios)] if ratios else None
            )
            row["ratio_of_medians"] = c.median("loop_ms") / mean.median("loop_ms")
            fit_ratios = paired_ratios(c, mean, "fit_ms")
            row["fit_ratio_to_mean"] = (
                statistics.median(fit_ratios) if fit_ratios else None
            )
        out[c.rule] = row
    return out


def format_table(cases: list[Case], args) -> str:
    rows = summary(cases)
    columns = [
        Column("rule", 14, "<"),
        Column("f", 2),
        Column("in-loop ms", 10),
        Column("vs mean", 8),
        Column("(min..max)", 13),
        Column("ms/step", 8),
        Column("vs mean", 8),
    ]
    params = (
        INPUT_DIM * args.hidden
        + args.hidden
        + args.hidden * args.hidden
        + args.hidden
        + args.hidden * NUM_CLASSES
        + NUM_CLASSES
    )
    what = (
        "timed fit epochs"
        if args.mode == "fit"
        else "calls of model.train_function on a persistent iterator"
    )
    table = []
    for c in cases:
        row = rows[c.rule]
        f = "-" if c.f is None else c.f
        if not c.ok:
            table.append(f"{format_row(columns, [c.rule, f])} failed ({c.error})")
            continue
        mm = row.get("ratio_to_mean_min_max")
        spread = f"{mm[0]:.2f}..{mm[1]:.2f}" if mm else "n/a"
        fit_ms = "n/a" if row["fit_ms"] is None else f"{row['fit_ms']:.2f}"
        table.append(
            [
                c.rule,
                f,
                f"{row['in_loop_ms']:.2f}",
                _x(row.get("ratio_to_mean")),
                spread,
                fit_ms,
                _x(row.get("fit_ratio_to_mean")),
            ]
        )
    lines = [
        f"model.fit step time under PSStrategy: MLP {INPUT_DIM}-{args.hidden}-"
        f"{args.hidden}-{NUM_CLASSES} ({params:,} parameters), adam, global batch "
        f"{args.batch}, {args.replicas} logical CPU replicas; {args.repeats} "
        f"interleaved rounds of {args.steps} steps ({what}), median",
        *text_table(columns, table),
    ]
    lines += [
        "",
        "in-loop = steady-state step (2nd step -> epoch end) / (steps - 1)"
        if args.mode == "fit"
        else "in-loop = time of the round's train_function calls / steps",
        "vs mean = median over rounds of (rule / mean in the same round), "
        "min..max over rounds",
        "ms/step = whole fit() call / steps (includes per-fit iterator setup)",
    ]
    return "\n".join(lines)


def target_checks(cases: list[Case]) -> list[str]:
    rows = summary(cases)
    lines = []
    for rule, limit in TARGETS.items():
        row = rows.get(rule)
        if row is None:
            continue
        ratio = row.get("ratio_to_mean")
        if ratio is None:
            lines.append(
                f"n/a  {rule} <= {limit:.2f}x mean: {row['error'] or 'no mean'}"
            )
            continue
        lines.append(_verdict(f"{rule} (f={row['f']}):", ratio, "mean", limit))
    return lines + worker_momentum_checks(cases)


def _verdict(subject: str, ratio: float, base: str, limit: float) -> str:
    """One PASS/FAIL line: `subject`'s in-loop step time as a ratio to `base`'s."""
    verdict = "PASS" if ratio <= limit else "FAIL"
    return (
        f"{verdict} {subject} {ratio:.2f}x {base}'s in-loop step time "
        f"(target <= {limit:.2f}x)"
    )


def worker_momentum_checks(cases: list[Case]) -> list[str]:
    """For every `rule+wm...` run: the median over rounds of (rule+wm / rule),
    worker momentum's own cost on that rule, measured against the rule itself
    (so the rule's own cost over the mean is left out); `n/a` when the rule
    was not run beside it or either failed."""
    by_rule = {c.rule: c for c in cases}
    lines = []
    for name, case in by_rule.items():
        base, plus, _ = name.partition("+")  # as `harness.parse_config`
        if not plus:
            continue
        target = f"worker momentum on {base} <= {WORKER_MOMENTUM_TARGET:.2f}x"
        other = by_rule.get(base)
        if other is None:
            lines.append(f"n/a  {target}: run {base} beside {name} to measure it")
            continue
        failed = next((c for c in (case, other) if not c.ok), None)
        if failed is not None:
            lines.append(f"n/a  {target}: {failed.rule} {failed.error or 'no runs'}")
            continue
        ratios = paired_ratios(case, other)
        if not ratios:
            lines.append(f"n/a  {target}: no round ran both")
            continue
        subject = f"worker momentum on {base}: {name}"
        ratio = statistics.median(ratios)
        lines.append(_verdict(subject, ratio, base, WORKER_MOMENTUM_TARGET))
    return lines


def write_json(path: str, cases: list[Case], info: dict, args, wall_s: float) -> None:
    payload = {
        "benchmark": "step_time_rules",
        "config": {
            k: v
            for k, v in vars(args).items()
            if isinstance(v, str | int | float | bool | list | type(None))
        },
        "environment": {},
        "info": info,
        "wall_s": wall_s,
        "summary": summary(cases),
        "targets": target_checks(cases),
        "runs": {
            c.rule: {
                "f": c.f,
                "build_s": c.build_s,
                "warmup_s": c.warmup_s,
                "error": c.error,
                "traceback": c.traceback,
                "runs": c.runs,
            }
            for c in cases
        },
    }
    harness.write_results(path, payload)


def write_plot(path: str, cases: list[Case], args) -> None:
    """Each rule's in-loop step time relative to `mean` in the same round:
    the median over rounds, whiskers the middle half of the rounds. The
    figure carries the command that made it and the machine."""
    by_rule = {c.rule: c for c in cases if c.ok}
    mean = by_rule.get("mean")
    rules = [c for c in cases if c.ok and c.rule != "mean"]
    if mean is None or not rules:
        return
    with harness.figure(
        path, figsize=(7, 4.2), tight_layout={"rect": (0, 0.06, 1, 1)}
    ) as (fig, ax):
        _plot_ratios(fig, ax, mean, rules, args)


def _plot_ratios(fig, ax, mean: Case, rules: list[Case], args) -> None:
    labels, medians, lows, highs = [], [], [], []
    for case in rules:
        q1, med, q3 = np.percentile(paired_ratios(case, mean), [25, 50, 75])
        labels.append(f"{case.rule}\n(f={case.f})")
        medians.append(med)
        lows.append(med - q1)
        highs.append(q3 - med)
    ax.bar(labels, medians, yerr=[lows, highs], capsize=3)
    for x, v in enumerate(medians):
        ax.text(x, v / 2, f"{v:.2f}x", ha="center", color="white", fontsize=9)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("step time / mean's (median; whiskers: middle half)")
    ax.set_title(
        f"model.fit step time by aggregator, relative to mean "
        f"({mean.median('loop_ms'):.1f} ms/step): MLP, batch {args.batch}, "
        f"{args.replicas} logical CPU replicas",
        fontsize=8,
    )
    env = harness.environment()
    fig.text(
        0.01,
        0.01,
        f"python benchmarks/step_time_rules.py {' '.join(sys.argv[1:])}\n"
        f"{env['date'][:10]}, {env['cpu_count']} CPUs ({env['processor'] or 'x86_64'}"
        f", {env['platform']}), TF {env['tensorflow']}, Keras {env['keras']}",
        fontsize=6,
        color="dimgray",
    )


# ------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None = None):
    parser = harness.BenchmarkParser(
        "Time model.fit steps under PSStrategy with each aggregator, "
        "interleaved in one process, relative to the mean.",
        name="step_time_rules",
        quick="smoke run: 10 steps x 2 rounds",
        plot="write a PNG bar chart",
        json_help="default benchmarks/results/step_time_rules.json",
    )
    parser.add_argument(
        "--rules",
        type=rule_names,
        help=f"comma-separated rules (default: those of {','.join(DEFAULT_RULES)} "
        "that are registered), each optionally behind pre-aggregations "
        "(arc>geometric_median) and with +wm (worker momentum 0.9; its own "
        "cost is checked against the rule without it when both run, e.g. "
        "median,median+wm); mean is always included",
    )
    parser.add_argument("--replicas", type=int, default=8, help="default 8")
    parser.add_argument(
        "--num-byzantine",
        type=int,
        default=2,
        help="f, lowered per rule to the largest valid (default 2)",
    )
    parser.add_argument("--hidden", type=int, default=512, help="default 512")
    parser.add_argument("--batch", type=int, default=256, help="global batch (256)")
    parser.add_argument(
        "--mode",
        choices=("fit", "steps"),
        default="fit",
        help="fit: each round is one timed fit epoch (default); steps: each "
        "round is --steps calls of the model's train_function (the step fit "
        "runs) on a persistent iterator, so rounds are short and many, and "
        "the machine's load drift cancels better",
    )
    parser.add_argument(
        "--steps",
        type=int,
        help="steps per round (fit: 40 per timed epoch; steps: 5)",
    )
    parser.add_rounds(None, "interleaved rounds (fit: 7; steps: 60)", "--repeats")
    parser.add_argument("--warmup-steps", type=int, default=10, help="default 10")
    args = parser.parse_args(argv)
    rules = args.rules or [r for r in DEFAULT_RULES if r in kpd.aggregators.names()]
    args.rules = list(dict.fromkeys(["mean", *rules]))
    fit_mode = args.mode == "fit"
    args.steps = args.steps or (40 if fit_mode else 5)
    args.repeats = args.repeats or (7 if fit_mode else 60)
    if args.quick:
        args.steps, args.repeats, args.warmup_steps = 10, 2, 3
    if args.batch % args.replicas:
        parser.error(f"--batch ({args.batch}) must be a multiple of --replicas")
    if fit_mode and args.steps < 2:
        parser.error("--steps must be >= 2 (the in-loop time starts at step 2)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    faulthandler.enable()
    start = time.perf_counter()
    cases, info = run_benchmark(args)
    wall_s = time.perf_counter() - start
    print(format_table(cases, args))
    print()
    print("\n".join(target_checks(cases)))
    for c in cases:
        if c.traceback:
            print(f"\n{c.rule} failed:\n{c.traceback}")
    print(
        f"\nwall time: {wall_s:.1f}s; load average (1/5/15 min) at start "
        f"{info['loadavg_start']}, at end {info['loadavg_end']} on {os.cpu_count()} CPUs"
    )
    write_json(args.json, cases, info, args, wall_s)
    print(f"wrote {args.json}")
    if args.plot:
        write_plot(args.plot, cases, args)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
