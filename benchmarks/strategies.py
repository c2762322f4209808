"""Side-by-side `model.fit` step time of PSStrategy vs TensorFlow's strategies.

What it measures
----------------
The steady-state time of one `model.fit` training step of the same model
under four strategies, all in ONE process on the same logical devices:

* ``default``         -- no distribution (one device): the baseline;
* ``mirrored``        -- ``tf.distribute.MirroredStrategy(devices)``;
* ``central_storage`` -- ``tf.distribute.experimental.CentralStorageStrategy(devices)``;
* ``ps``              -- ``keras_psdist.PSStrategy(devices=devices)``.

Before TensorFlow initializes, the host CPU is split into ``--replicas``
logical devices (default 4); every distributed strategy gets one replica per
logical device. The model is an MLP 64 -> 512 -> 512 -> 2 (relu, relu,
logits) trained with Adam on sparse categorical cross-entropy from logits, at
a global batch of ``--batch`` (default 256) on synthetic NumPy data (nothing
is downloaded).

Method: each model is built and compiled under its strategy's scope, then a
warm-up ``fit`` (1 epoch of 10 steps) traces and runs the train function so
tracing is excluded. Then ``fit(..., epochs=1, steps_per_epoch=--steps,
verbose=0)`` is timed ``--repeats`` times, the strategies interleaved
round-robin within each repeat (the order rotates between repeats) so slow
drift of the machine hits all of them alike. Per strategy the table shows:

* ``ms/step``      -- wall time of the whole timed ``fit`` call / steps, the
  median over repeats. It includes ``fit``'s per-call cost, which for the
  distributed strategies is large (creating the distributed iterator on every
  ``fit`` call) and noisy;
* ``in-loop``      -- steady-state step time: from the start of the 2nd step
  to the end of the epoch / (steps - 1), taken by a callback that hooks only
  ``on_train_batch_begin`` / ``on_epoch_end`` (so Keras keeps its
  asynchronous batch-end dispatch);
* ``vs default``   -- each of those / the default strategy's (>1 = slower);
* ``fit overhead`` -- per ``fit`` call: setup + first step + teardown;

and, below, PSStrategy's time / MirroredStrategy's and / CentralStorage's.
Logical CPU devices share the same physical cores, so replicas add no
compute: the numbers show each strategy's *overhead* relative to one device,
and are meant to be read as ratios measured side by side in one run, not as
absolute throughput (absolute values drift between runs and machines).

Then, whole epochs (``--epoch-lengths``, default 5, 40 and 400 steps):
``fit(x, y, epochs=--epochs)`` on NumPy data of exactly that many global
batches, with no ``steps_per_epoch``, so every epoch builds and tears down its
own iterator as in a user's ``fit``. Per strategy and length: the median
epoch wall time after the first epoch (``epoch ms``), its ratio to the single
device and PSStrategy's to MirroredStrategy's; and the fixed cost per epoch,
``epoch ms`` at the shortest length minus that many steps at the longest
length's per-step time. Strategies are interleaved round-robin here too.

A strategy that raises (at build, warm-up or timing) is reported as
``failed: <error>`` and the others still run.

How to run
----------
From the repository root::

    python benchmarks/strategies.py \\
        --json benchmarks/results/strategies.json \\
        --plot benchmarks/results/strategies.png

With ``--ablations``, PS's steady step is timed against one device's with
one thing changed at a time (a `MirroredStrategy` that ran `fit` in the
same process, batches of unknown size, a larger inter-op pool, ...), each
case in processes of its own (``harness/step_ablations.py`` lists the
cases; JSON ``benchmarks/results/step_ablations.json``)::

    python benchmarks/strategies.py --ablations all --repeats 3 --steps 100

With ``--ops``, nothing is timed: the ops of each strategy's train step
are counted instead, traced and as executed, per device partition, with
the ``_Send`` / ``_Recv`` pairs between devices (``harness/graph_ops.py``;
JSON ``benchmarks/results/graph_ops.json``)::

    python benchmarks/strategies.py --ops

With ``--profile``, TensorFlow's profiler traces steady steps of the
default strategy and PS and sums the op times by kind
(``harness/profile_step.py``; JSON ``benchmarks/results/profile_step.json``,
``profile_step_dynamic.json`` with ``--dynamic-batch``)::

    python benchmarks/strategies.py --profile --steps 100 [--dynamic-batch]

Options: ``--replicas N``, ``--steps S``, ``--repeats R``, ``--batch B``,
``--strategies default,mirrored,central_storage,ps`` (any subset),
``--warmup-steps W``, ``--seed``, ``--json PATH`` (raw numbers and
environment; default ``benchmarks/results/strategies.json``), ``--plot
PATH`` (PNG bar chart).
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

import harness
from harness import Column, format_row, text_table
from harness import log as _log
from harness import positive as _positive
from harness import ratio as _ratio
from harness import times as _x

# Before TensorFlow is imported anywhere in this process.
harness.prepare_tensorflow()
harness.ensure_importable()

import keras  # noqa: E402
import numpy as np  # noqa: E402
from harness.mlp import (  # noqa: E402  (the MLP, its data and strategies)
    DEFAULT_STRATEGIES,
    HIDDEN,
    INPUT_DIM,
    LABELS,
    NUM_CLASSES,
    STRATEGIES,
    build_model,
    make_arrays,
    make_dataset,
    make_strategy,
    timed_fit,
)

from keras_psdist.devices import split_host_cpu  # noqa: E402

# ----------------------------------------------------------------- timing


@dataclass
class Case:
    """One strategy's model and measurements."""

    name: str
    label: str
    replicas: int | None = None
    model: keras.Model | None = None
    error: str | None = None
    error_traceback: str | None = None
    failed_at: str | None = None
    build_s: float | None = None
    warmup_s: float | None = None
    fit_ms_per_step: list[float] = field(default_factory=list)
    loop_ms_per_step: list[float] = field(default_factory=list)
    runs: list[dict] = field(default_factory=list)
    final_loss: float | None = None

    def fail(self, stage: str, exc: BaseException) -> None:
        self.failed_at = stage
        self.error = f"{type(exc).__name__}: {exc}"
        self.error_traceback = traceback.format_exc()
        self.model = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.fit_ms_per_step)

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.fit_ms_per_step) if self.ok else None

    @property
    def median_loop_ms(self) -> float | None:
        if self.error is None and self.loop_ms_per_step:
            return statistics.median(self.loop_ms_per_step)
        return None

    @property
    def median_overhead_s(self) -> float | None:
        """Median per-`fit`-call cost outside the loop: setup + 1st step + teardown."""
        per_run = [
            r["setup_s"] + r["first_step_ms"] / 1e3 + r["teardown_s"]
            for r in self.runs
            if None not in (r["setup_s"], r["first_step_ms"], r["teardown_s"])
        ]
        return statistics.median(per_run) if per_run and self.ok else None


def prepare(case: Case, devices, dataset, args) -> None:
    """Builds, compiles and warms up `case`; records a failure instead of raising."""
    try:
        t0 = time.perf_counter()
        strategy = make_strategy(case.name, devices)
        case.replicas = strategy.num_replicas_in_sync
        case.model = build_model(
            strategy, args.seed, jit_compile=case.name.endswith("_xla")
        )
        case.build_s = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - report and go on
        case.fail("build", e)
        return
    try:
        t0 = time.perf_counter()
        case.model.fit(
            dataset,
            epochs=1,
            steps_per_epoch=args.warmup_steps,
            verbose=0,
            shuffle=False,
        )
        case.warmup_s = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001
        case.fail("warm-up", e)


def run_benchmark(args) -> tuple[list[Case], dict]:
    load_start = harness.loadavg()
    devices = split_host_cpu(args.replicas)
    dataset = make_dataset(args.batch, args.seed, autotune=args.autotune)
    cases = [Case(name, LABELS[name]) for name in args.strategies]

    for case in cases:
        _log(f"building + warming up {case.label} ...")
        prepare(case, devices, dataset, args)
        if case.error:
            _log(f"  {case.label} failed at {case.failed_at}: {case.error}")
        else:
            _log(f"  done (build {case.build_s:.1f}s, warm-up {case.warmup_s:.1f}s)")

    def run_one(case: Case, r: int) -> dict:
        run = timed_fit(case.model, dataset, args.steps)
        case.runs.append(run)
        case.fit_ms_per_step.append(run["fit_ms"])
        case.loop_ms_per_step.append(run["loop_ms"])
        case.final_loss = run["loss"]
        return run

    def after_round(r: int, results: dict) -> None:
        parts = [
            f"{name}=failed"
            if isinstance(run, Exception)
            else f"{name}={run['fit_ms']:.2f}/{run['loop_ms']:.2f}"
            for name, run in results.items()
        ]
        _log(f"repeat {r + 1}/{args.repeats} (ms/step fit/in-loop): {' '.join(parts)}")

    # Round-robin, rotated each repeat so no strategy always runs first.
    live = {c.name: c for c in cases if c.error is None}
    rounds = harness.interleaved_rounds(
        live,
        run_one,
        args.repeats,
        drop_failed=True,
        on_error=lambda name, r, e: live[name].fail(f"repeat {r + 1}", e),
        after_round=after_round,
    )

    for case in cases:
        if case.error is None and not case.fit_ms_per_step:
            case.error = "no successful timed run"
    info = {
        "devices": devices,
        "round_robin_orders": rounds.orders,
        "loadavg_start": load_start,
        "loadavg_end": harness.loadavg(),
    }
    return cases, info


class _EpochClock(keras.callbacks.Callback):
    """Wall time of each epoch, from `on_epoch_begin` to `on_epoch_end`."""

    def __init__(self):
        super().__init__()
        self.seconds: list[float] = []
        self._start = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self._start)


EPOCH_STRATEGIES = ("default", "mirrored", "ps")


def run_epochs(cases: list[Case], args) -> dict:
    """`{name: {length: [epoch ms after the first, over repeats]}}`."""
    by_name = {c.name: c for c in cases if c.name in EPOCH_STRATEGIES and not c.error}
    times = {name: {} for name in by_name}
    for length in args.epoch_lengths:
        x, y = make_arrays(length * args.batch, args.seed)
        live = {n: c for n, c in by_name.items() if c.error is None}
        rounds = harness.interleaved_rounds(
            live,
            lambda case, r, x=x, y=y: _epoch_ms(case, x, y, args),
            args.repeats,
            drop_failed=True,
            on_error=lambda name, r, e, length=length: by_name[name].fail(
                f"epochs of {length} steps", e
            ),
        )
        for name in live:
            if rounds.samples(name):
                times[name][length] = [ms for run in rounds.samples(name) for ms in run]
        summary = " ".join(
            f"{name}={statistics.median(t[length]):.0f}ms"
            for name, t in times.items()
            if t.get(length)
        )
        _log(f"epochs of {length} steps (median epoch time): {summary}")
    return times


def _epoch_ms(case: Case, x, y, args) -> list[float]:
    """One whole-epoch `fit`: its epochs' ms after the first."""
    clock = _EpochClock()
    case.model.fit(
        x,
        y,
        batch_size=args.batch,
        epochs=args.epochs,
        shuffle=False,
        verbose=0,
        callbacks=[clock],
    )
    return [1e3 * t for t in clock.seconds[1:]]


def epoch_summary(times: dict, args) -> dict:
    """Medians, ratios and the fixed cost per epoch, from `run_epochs`."""
    lengths = sorted(args.epoch_lengths)
    short, long_ = lengths[0], lengths[-1]
    median = {
        name: {length: statistics.median(v) for length, v in per.items() if v}
        for name, per in times.items()
    }
    out = {"median_epoch_ms": median, "ratios": {}, "fixed_ms_per_epoch": {}}
    for name, per in median.items():
        if short in per and long_ in per and long_ != short:
            step_ms = per[long_] / long_
            out["fixed_ms_per_epoch"][name] = per[short] - short * step_ms
    single, mirrored, ps = (median.get(k, {}) for k in ("default", "mirrored", "ps"))
    for length in lengths:
        out["ratios"][length] = {
            "ps_vs_single": _ratio(ps.get(length), single.get(length)),
            "ps_vs_mirrored": _ratio(ps.get(length), mirrored.get(length)),
            "mirrored_vs_single": _ratio(mirrored.get(length), single.get(length)),
        }
    return out


def format_epoch_table(summary: dict, args) -> str:
    median = summary["median_epoch_ms"]
    names = [n for n in EPOCH_STRATEGIES if n in median]
    columns = [
        Column("steps/epoch", 11),
        *(Column(LABELS[n].split(" (")[0], 18) for n in names),
        Column("PS/single", 10),
        Column("PS/Mirrored", 12),
    ]
    rows = []
    for length in sorted(args.epoch_lengths):
        ratios = summary["ratios"][length]
        rows.append(
            [
                length,
                *(
                    f"{median[n][length]:.1f}" if length in median[n] else "n/a"
                    for n in names
                ),
                _x(ratios["ps_vs_single"]),
                _x(ratios["ps_vs_mirrored"]),
            ]
        )
    lines = [
        f"whole-fit epoch time (ms, median after the 1st epoch), {args.epochs} "
        f"epochs x {args.repeats} repeats, NumPy input",
        *text_table(columns, rows),
    ]
    fixed = summary["fixed_ms_per_epoch"]
    if fixed:
        lines.append(
            "fixed cost per epoch (ms): "
            + ", ".join(f"{LABELS[n]} {fixed[n]:.1f}" for n in names if n in fixed)
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- report


def _short_error(case: Case, width: int = 70) -> str:
    text = f"failed ({case.failed_at}): {case.error}".splitlines()[0]
    return text if len(text) <= width else text[: width - 3] + "..."


def format_table(cases: list[Case], args) -> str:
    by_name = {c.name: c for c in cases}
    base = by_name.get("default")
    base_ms = base.median_ms if base else None
    base_loop = base.median_loop_ms if base else None

    columns = [
        Column("strategy", 24, "<"),
        Column("replicas", 8),
        Column("ms/step", 8),
        Column("min..max", 14),
        Column("vs default", 10),
        Column("in-loop", 8),
        Column("vs default", 10),
        Column("fit overhead", 12),
    ]
    rows = []
    for case in cases:
        if not case.ok:
            head = format_row(columns, [case.label, case.replicas or "-"])
            rows.append(f"{head} {_short_error(case)}")
            continue
        spread = f"{min(case.fit_ms_per_step):.2f}..{max(case.fit_ms_per_step):.2f}"
        overhead = case.median_overhead_s
        rows.append(
            [
                case.label,
                case.replicas,
                f"{case.median_ms:.2f}",
                spread,
                _x(_ratio(case.median_ms, base_ms)),
                f"{case.median_loop_ms:.2f}",
                _x(_ratio(case.median_loop_ms, base_loop)),
                "n/a" if overhead is None else f"{overhead:.2f} s",
            ]
        )
    lines = [
        f"model.fit step time: MLP {INPUT_DIM}-{HIDDEN}-{HIDDEN}-{NUM_CLASSES}, "
        f"adam, global batch {args.batch}, {args.replicas} logical CPU devices, "
        f"{args.steps} steps x {args.repeats} repeats (median)",
        *text_table(columns, rows),
    ]
    lines += [
        "",
        "ms/step      = fit() wall time / steps (includes fit's per-call cost)",
        "in-loop      = steady-state loop only: 2nd step start -> epoch end, / (steps-1)",
        "vs default   = time / the default strategy's time (>1 = slower)",
        "fit overhead = per fit() call: setup (iterator creation) + 1st step + teardown",
    ]
    ps = by_name.get("ps")
    if ps is not None:
        for other in ("mirrored", "central_storage"):
            o = by_name.get(other)
            if o is None:
                continue
            r = _ratio(ps.median_ms, o.median_ms)
            if r is None:
                text = "n/a (a strategy failed)"
            else:
                r_loop = _ratio(ps.median_loop_ms, o.median_loop_ms)
                text = (
                    f"{r:.2f}x ms/step, {_x(r_loop)} in-loop (>1 = PSStrategy slower)"
                )
            lines.append(f"PSStrategy / {o.label}: {text}")
    for xla, plain in (("ps_xla", "ps"), ("default_xla", "default")):
        a, b = by_name.get(xla), by_name.get(plain)
        if a is not None and b is not None:
            lines.append(
                f"{a.label} / without: "
                f"{_x(_ratio(a.median_loop_ms, b.median_loop_ms))} in-loop"
            )
    return "\n".join(lines)


def write_json(path: str, cases: list[Case], info: dict, args, wall_s: float) -> None:
    by_name = {c.name: c for c in cases}
    base = by_name.get("default")
    base_ms = base.median_ms if base else None
    base_loop = base.median_loop_ms if base else None
    payload = {
        "benchmark": "strategies",
        "config": {
            "replicas": args.replicas,
            "steps": args.steps,
            "repeats": args.repeats,
            "batch": args.batch,
            "warmup_steps": args.warmup_steps,
            "seed": args.seed,
            "strategies": list(args.strategies),
            "model": f"MLP {INPUT_DIM}-{HIDDEN}-{HIDDEN}-{NUM_CLASSES}, adam, "
            "sparse CE from logits",
        },
        "environment": {},
        "devices": info["devices"],
        "round_robin_orders": info["round_robin_orders"],
        "loadavg_start": info["loadavg_start"],
        "loadavg_end": info["loadavg_end"],
        "wall_s": wall_s,
        "epochs": info.get("epochs"),
        "results": {
            c.name: {
                "label": c.label,
                "replicas": c.replicas,
                "ok": c.ok,
                "error": c.error,
                "failed_at": c.failed_at,
                "traceback": c.error_traceback,
                "build_s": c.build_s,
                "warmup_s": c.warmup_s,
                "fit_ms_per_step": c.fit_ms_per_step,
                "runs": c.runs,
                "median_fit_overhead_s": c.median_overhead_s,
                "loop_ms_per_step": c.loop_ms_per_step,
                "median_ms_per_step": c.median_ms,
                "median_loop_ms_per_step": c.median_loop_ms,
                "ratio_to_default": _ratio(c.median_ms, base_ms),
                "loop_ratio_to_default": _ratio(c.median_loop_ms, base_loop),
                "final_loss": c.final_loss,
            }
            for c in cases
        },
    }
    ps = by_name.get("ps")
    if ps is not None:
        payload["ps_ratios"] = {
            other: {
                "ms_per_step": _ratio(ps.median_ms, by_name[other].median_ms),
                "in_loop": _ratio(ps.median_loop_ms, by_name[other].median_loop_ms),
            }
            for other in ("mirrored", "central_storage")
            if other in by_name
        }
    harness.write_results(path, payload)


def write_plot(path: str, cases: list[Case], args, epochs: dict | None = None) -> None:
    """Grouped bars per strategy: fit ms/step and in-loop ms/step (median,
    min..max); with `epochs`, a second panel of whole-epoch times."""
    if epochs is None:
        with harness.figure(path, figsize=(8, 4.5)) as (fig, ax):
            _plot_steps(ax, cases, args)
    else:
        with harness.figure(path, 1, 2, figsize=(14, 4.5)) as (fig, (ax, epoch_ax)):
            _plot_epochs(epoch_ax, epochs, args)
            _plot_steps(ax, cases, args)


def _plot_steps(ax, cases: list[Case], args) -> None:
    """Fit and in-loop ms/step per strategy: median bars, min..max whiskers."""
    xs = np.arange(len(cases))
    width = 0.38
    series = (
        ("fit ms/step (fit wall / steps)", "fit_ms_per_step", -width / 2, "tab:blue"),
        ("in-loop ms/step (steady state)", "loop_ms_per_step", width / 2, "tab:orange"),
    )
    for label, attr, offset, color in series:
        medians, lows, highs = [], [], []
        for case in cases:
            vals = getattr(case, attr) if case.ok else []
            m = statistics.median(vals) if vals else 0.0
            medians.append(m)
            lows.append(m - min(vals) if vals else 0.0)
            highs.append(max(vals) - m if vals else 0.0)
        ax.bar(
            xs + offset,
            medians,
            width,
            label=label,
            color=color,
            yerr=[lows, highs],
            capsize=3,
        )
        for x, case, m in zip(xs, cases, medians, strict=True):
            # Inside the bar, left of the min..max whisker.
            ax.text(
                x + offset - width / 4,
                m / 2 if case.ok else 0.0,
                f"{m:.1f}" if case.ok else "failed",
                ha="center",
                va="center" if case.ok else "bottom",
                rotation=90,
                fontsize=8,
                color="white" if case.ok else "black",
            )
    ax.set_xticks(xs, [c.label.replace(" (1 device)", "\n(1 device)") for c in cases])
    ax.tick_params(axis="x", labelsize=8)
    ax.set_ylabel("ms / step (median; whiskers: min..max)")
    ax.set_title(
        f"model.fit step time, MLP {INPUT_DIM}-{HIDDEN}-{HIDDEN}-{NUM_CLASSES}, "
        f"batch {args.batch}, {args.replicas} logical CPU devices, "
        f"{args.steps} steps x {args.repeats}",
        fontsize=9,
    )
    ax.legend(fontsize=8)


def _plot_epochs(ax, epochs: dict, args) -> None:
    """Median whole-epoch time per epoch length and strategy (log scale)."""
    median = epochs["median_epoch_ms"]
    names = [n for n in EPOCH_STRATEGIES if n in median]
    lengths = sorted(args.epoch_lengths)
    xs = np.arange(len(lengths))
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        values = [median[name].get(length, 0.0) for length in lengths]
        offset = (i - (len(names) - 1) / 2) * width
        ax.bar(xs + offset, values, width, label=LABELS[name])
        for x, v in zip(xs + offset, values, strict=True):
            ax.text(x, v, f"{v:.0f}", ha="center", va="bottom", fontsize=7)
    ax.set_yscale("log")
    ax.set_xticks(xs, [f"{length} steps" for length in lengths])
    ax.set_ylabel("ms per epoch (median after the 1st; log scale)")
    ax.set_title(
        f"whole-fit epoch time, batch {args.batch}, {args.replicas} logical "
        "CPU devices",
        fontsize=9,
    )
    ax.legend(fontsize=8)


# ------------------------------------------------------------------- CLI


def _ablation_cases(text: str) -> list[str]:
    from harness.step_ablations import CASES

    return list(CASES) if text == "all" else harness.name_list(CASES, "cases")(text)


def parse_args(argv: list[str] | None = None):
    parser = harness.BenchmarkParser(
        "Time model.fit steps of one MLP under the default strategy, "
        "MirroredStrategy, CentralStorageStrategy and keras_psdist.PSStrategy.",
        name="strategies",
        plot="write a PNG bar chart",
    )
    parser.add_argument(
        "--replicas", type=_positive, default=4, help="logical CPU devices (default 4)"
    )
    parser.add_argument(
        "--steps", type=_positive, default=50, help="steps per timed fit (default 50)"
    )
    parser.add_rounds(5, "timed fits per strategy (default 5)", "--repeats")
    parser.add_argument(
        "--batch", type=_positive, default=256, help="global batch size (default 256)"
    )
    parser.add_argument(
        "--warmup-steps", type=_positive, default=10, help="warm-up steps (default 10)"
    )
    parser.add_argument(
        "--autotune",
        action="store_true",
        help="leave tf.data's autotuning on for the step timings (default off "
        "for every strategy alike: see make_dataset)",
    )
    parser.add_argument(
        "--strategies",
        type=harness.name_list(STRATEGIES, "strategies"),
        default=list(DEFAULT_STRATEGIES),
        help=f"comma-separated subset of {','.join(STRATEGIES)} (default: "
        f"{','.join(DEFAULT_STRATEGIES)})",
    )
    parser.add_argument(
        "--epoch-lengths",
        type=harness.int_list,
        default=[5, 40, 400],
        help="steps per epoch of the whole-epoch timings (default 5,40,400; "
        "empty to skip them)",
    )
    parser.add_argument(
        "--epochs",
        type=_positive,
        default=4,
        help="epochs per whole-epoch fit; the first is not counted (default 4)",
    )
    parser.add_argument(
        "--ablations",
        type=_ablation_cases,
        help="time PS against one device with one thing changed at a time, "
        "each case (comma-separated, or all) in processes of its own, "
        "--repeats of them (harness/step_ablations.py; default JSON "
        "benchmarks/results/step_ablations.json)",
    )
    parser.add_argument(
        "--fits",
        type=_positive,
        default=9,
        help="--ablations: timed fits per process (default 9)",
    )
    parser.add_argument("--ablation-child", help=argparse.SUPPRESS)
    parser.add_argument(
        "--ops",
        action="store_true",
        help="count the ops of each strategy's train step instead of timing "
        "it (harness/graph_ops.py; default JSON benchmarks/results/graph_ops.json)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="trace --steps steady steps of the default strategy and PS with "
        "TensorFlow's profiler and sum the op times by kind instead of timing "
        "fits (harness/profile_step.py; default JSON "
        "benchmarks/results/profile_step.json; --steps 100 as in its runs)",
    )
    parser.add_argument(
        "--dynamic-batch",
        action="store_true",
        help="--profile: batches without drop_remainder (a global batch size "
        "unknown when tracing)",
    )
    args = parser.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    if args.dynamic_batch and not args.profile:
        parser.error("--dynamic-batch is a setting of --profile; add --profile")
    if not harness.given(given, "--json"):
        if args.ops:
            args.json = str(harness.RESULTS / "graph_ops.json")
        elif args.profile:
            name = "profile_step_dynamic" if args.dynamic_batch else "profile_step"
            args.json = str(harness.RESULTS / f"{name}.json")
        elif args.ablations:
            args.json = str(harness.RESULTS / "step_ablations.json")
    if args.batch % args.replicas:
        parser.error(
            f"--batch ({args.batch}) must be a multiple of --replicas ({args.replicas})"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.ablation_child:
        from harness import step_ablations

        return step_ablations.run_child(args.ablation_child, args.fits, args.steps)
    if args.ablations:
        from harness import step_ablations

        return step_ablations.run(args, __file__)
    if args.ops:
        from harness import graph_ops

        return graph_ops.run(args)
    if args.profile:
        from harness import profile_step

        return profile_step.run(args)
    faulthandler.enable()  # a native abort at least leaves a Python traceback
    start = time.perf_counter()
    cases, info = run_benchmark(args)
    epochs = None
    if args.epoch_lengths:
        epochs = epoch_summary(run_epochs(cases, args), args)
        info["epochs"] = epochs
    wall_s = time.perf_counter() - start
    print(format_table(cases, args))
    if epochs is not None:
        print()
        print(format_epoch_table(epochs, args))
    print(
        f"wall time: {wall_s:.1f}s; load average (1/5/15 min) at start "
        f"{info['loadavg_start']}, at end {info['loadavg_end']} "
        f"on {os.cpu_count()} CPUs"
    )
    write_json(args.json, cases, info, args, wall_s)
    print(f"wrote {args.json}")
    if args.plot:
        write_plot(args.plot, cases, args, epochs)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
