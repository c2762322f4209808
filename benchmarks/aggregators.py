"""Throughput of each aggregation rule, next to NumPy's and TensorFlow's sums.

What it measures
----------------
For each replica count n (``--n``, default 4, 8, 16, 32) and parameter count
d (``--d``, default 1e5, 1e6, 1e7 float32 values in ONE variable), the time
of one call of each registered rule's ``aggregate`` on n random replicas'
values, inside a ``tf.function`` (as the strategy runs it; the rules' own
XLA kernels included), and of two references on the same data:

* ``numpy.sum``      -- ``np.sum(x, axis=0)`` of the stacked ``[n, d]`` array:
  a read of the whole input, single-threaded;
* ``tf.reduce_mean`` -- ``tf.reduce_mean(x, axis=0)`` of the stacked tensor in
  a ``tf.function`` (TensorFlow's intra-op threads).

Throughput is input bytes (``4 n d``) / time, in GB/s (1e9 bytes). Every
rule runs with f (``num_byzantine``) = the largest value <= ``--max-f``
(default 2) that its condition accepts for n (``mean``: 0); a rule that
accepts none is skipped for that n, saying why.

Method: per (n, d), every case is traced and run once (not timed), then
timed ``--repeats`` times, the cases interleaved round-robin (the order
rotating between repeats) so machine noise hits them alike; the table shows
the median. A case whose untimed call takes longer than ``--max-call-s`` is
timed once only, and skipped at every larger n*d; combos whose input exceeds
``--max-input-gb`` are skipped. The point n=8, d=2**20 is always added (unless
``--no-targets``) to check the targets:

* ``median`` and ``trimmed_mean`` reach >= 50 % of ``numpy.sum``'s GB/s;
* ``krum`` takes <= 3x the time of ``mean``.

Read the numbers as ratios measured side by side in one run: the machine's
other load moves the absolute values.

How to run
----------
From the repository root::

    python benchmarks/aggregators.py                 # full grid, ~20 min
    python benchmarks/aggregators.py --n 8           # n = 8 only
    python benchmarks/aggregators.py --quick         # smoke run, < 1 min

Options: ``--n 4,8``, ``--d 1e5,2**20`` (ints, floats or powers ``2**k``),
``--rules median,krum``, ``--repeats R``, ``--max-f``, ``--max-call-s``,
``--max-input-gb``, ``--no-targets``, ``--json PATH`` (default
``benchmarks/results/aggregators.json``), ``--plot PATH`` (PNG).
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import harness
from harness import log as _log
from harness import ratio as _ratio
from harness import times as _x

harness.prepare_tensorflow()
harness.ensure_importable()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_psdist as kpd  # noqa: E402

TARGET_N = 8
TARGET_D = 2**20
NUMPY = "numpy.sum"
TF_MEAN = "tf.reduce_mean"


@dataclass
class Case:
    """One rule (or reference) at one (n, d)."""

    name: str
    n: int
    d: int
    f: int | None = None
    status: str = "ok"  # ok | skipped | failed
    reason: str | None = None
    first_call_s: float | None = None
    times_s: list[float] = field(default_factory=list)
    traceback: str | None = None
    call: Callable[[], object] | None = field(default=None, repr=False)

    @property
    def bytes(self) -> int:
        return 4 * self.n * self.d

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.times_s) if self.times_s else None

    @property
    def gbps(self) -> float | None:
        t = self.median_s
        return self.bytes / t / 1e9 if t else None


def largest_f(rule: str, n: int, max_f: int) -> tuple[int | None, str | None]:
    """The largest f <= max_f the rule accepts for n, or (None, the reason)."""
    reason = None
    for f in range(max_f, -1, -1):
        try:
            kpd.aggregators.get(rule).bind(n, f)
            return f, None
        except ValueError as e:
            reason = reason or str(e)
    return None, reason


def make_cases(n: int, d: int, rules: list[str], args, too_slow: dict) -> list[Case]:
    """References and rules for (n, d), with their inputs; nothing run yet."""
    rng = np.random.default_rng(args.seed)
    stacked_np = rng.standard_normal((n, d), dtype=np.float32)
    stacked = tf.constant(stacked_np)
    columns = [tf.identity(row) for row in tf.unstack(stacked)]

    cases = [Case(NUMPY, n, d), Case(TF_MEAN, n, d)]
    cases[0].call = lambda: np.sum(stacked_np, axis=0)
    reduce_mean = tf.function(lambda x: tf.reduce_mean(x, axis=0))
    cases[1].call = lambda: reduce_mean(stacked)
    for name in rules:
        case = Case(name, n, d)
        cases.append(case)
        if name in too_slow and too_slow[name] <= n * d:
            case.status = "skipped"
            case.reason = f"time: a call took > {args.max_call_s:g} s at a smaller n*d"
            continue
        case.f, reason = largest_f(name, n, args.max_f)
        if case.f is None:
            case.status, case.reason = "skipped", f"condition: {reason}"
            continue
        rule = kpd.aggregators.get(name).bind(n, case.f)
        fn = tf.function(lambda xs, rule=rule: rule.aggregate([xs])[0])
        case.call = lambda fn=fn: fn(columns)
    return cases


def _timed(case: Case) -> float:
    start = time.perf_counter()
    # Eager execution is synchronous: a tf.function call returns once its
    # outputs are computed, so no copy to NumPy is needed (or timed).
    case.call()
    return time.perf_counter() - start


def measure(n: int, d: int, rules: list[str], args, too_slow: dict) -> list[Case]:
    cases = make_cases(n, d, rules, args, too_slow)
    live = [c for c in cases if c.status == "ok"]
    for case in live:
        try:
            _timed(case)  # trace / compile
            case.first_call_s = _timed(case)
        except Exception as e:  # noqa: BLE001 - report and go on
            case.status = "failed"
            case.reason = f"{type(e).__name__}: {e}".splitlines()[0]
            case.traceback = traceback.format_exc()
            case.call = None
            continue
        if case.first_call_s > args.max_call_s:
            case.times_s.append(case.first_call_s)
            if case.name not in (NUMPY, TF_MEAN):
                too_slow[case.name] = min(too_slow.get(case.name, n * d), n * d)
    timed = {c.name: c for c in live if c.status == "ok" and not c.times_s}
    rounds = harness.interleaved_rounds(
        timed, lambda case, r: _timed(case), args.repeats, catch=()
    )
    for name, case in timed.items():
        case.times_s += rounds.samples(name)
    for case in cases:
        case.call = None
    return cases


def run_grid(args) -> list[Case]:
    combos = sorted({(n, d) for n in args.n for d in args.d}, key=lambda c: c[0] * c[1])
    if args.targets and (TARGET_N, TARGET_D) not in combos:
        combos.append((TARGET_N, TARGET_D))
        combos.sort(key=lambda c: c[0] * c[1])
    results: list[Case] = []
    too_slow: dict[str, int] = {}
    for n, d in combos:
        gb = 4 * n * d / 1e9
        if gb > args.max_input_gb:
            _log(f"n={n} d={d:,}: skipped (input {gb:.2f} GB > --max-input-gb)")
            results.append(
                Case(
                    "(all)",
                    n,
                    d,
                    status="skipped",
                    reason=f"memory: input {gb:.2f} GB > {args.max_input_gb:g} GB",
                )
            )
            continue
        start = time.perf_counter()
        cases = measure(n, d, args.rules, args, too_slow)
        results += cases
        gc.collect()
        _log(f"n={n} d={d:,}: {time.perf_counter() - start:.1f}s")
    return results


# ---------------------------------------------------------------- report


def _find(results: list[Case], name: str, n: int, d: int) -> Case | None:
    for c in results:
        if (c.name, c.n, c.d) == (name, n, d):
            return c
    return None


def format_table(results: list[Case]) -> str:
    head = (
        f"{'n':>3} {'d':>11} {'rule':<18} {'f':>2} {'ms/call':>9} "
        f"{'min..max':>17} {'GB/s':>7} {'vs numpy':>9} {'time/mean':>9}"
    )
    lines = [head, "-" * len(head)]
    kept = []  # the same table, for the JSON
    last = None
    for c in results:
        if last is not None and (c.n, c.d) != last:
            lines.append("")
        last = (c.n, c.d)
        f = "-" if c.f is None else str(c.f)
        prefix = f"{c.n:>3} {c.d:>11,} {c.name:<18} {f:>2}"
        if c.status != "ok" or not c.times_s:
            lines.append(f"{prefix} {c.status}: {_short(c.reason)}")
            kept.append(lines[-1].strip())
            continue
        numpy_case = _find(results, NUMPY, c.n, c.d)
        mean_case = _find(results, "mean", c.n, c.d)
        vs_numpy = _ratio(c.gbps, numpy_case.gbps if numpy_case else None)
        vs_mean = _ratio(c.median_s, mean_case.median_s if mean_case else None)
        spread = f"{1e3 * min(c.times_s):.2f}..{1e3 * max(c.times_s):.2f}"
        once = " (1 call)" if len(c.times_s) == 1 else ""
        lines.append(
            f"{prefix} {1e3 * c.median_s:>9.2f} {spread:>17} {c.gbps:>7.2f} "
            f"{_x(vs_numpy):>9} {_x(vs_mean):>9}{once}"
        )
        kept.append(
            [c.n, f"{c.d:,}", c.name, f, f"{1e3 * c.median_s:.2f}", spread]
            + [f"{c.gbps:.2f}", _x(vs_numpy), _x(vs_mean) + once]
        )
    harness.keep_table(
        ["n", "d", "rule", "f", "ms/call", "min..max", "GB/s", "vs numpy", "time/mean"],
        kept,
    )
    lines += [
        "",
        "GB/s      = input bytes (4*n*d) / median call time (1 GB = 1e9 bytes)",
        "vs numpy  = GB/s / numpy.sum(axis=0)'s GB/s on the same input (>1 = faster)",
        "time/mean = call time / the mean rule's call time (>1 = slower)",
    ]
    return "\n".join(lines)


def target_checks(results: list[Case]) -> list[str]:
    n, d = TARGET_N, TARGET_D
    numpy_case = _find(results, NUMPY, n, d)
    mean_case = _find(results, "mean", n, d)
    lines = []
    for rule in ("median", "trimmed_mean"):
        c = _find(results, rule, n, d)
        ratio = _ratio(c.gbps if c else None, numpy_case.gbps if numpy_case else None)
        if ratio is None:
            lines.append(
                f"n/a  {rule} GB/s >= 50% of numpy.sum at n={n}, d=2**20: not measured"
            )
            continue
        lines.append(
            f"{'PASS' if ratio >= 0.5 else 'FAIL'} {rule} at n={n}, d=2**20: "
            f"{c.gbps:.2f} GB/s = {100 * ratio:.0f}% of numpy.sum's "
            f"{numpy_case.gbps:.2f} GB/s (target >= 50%)"
        )
    c = _find(results, "krum", n, d)
    ratio = _ratio(c.median_s if c else None, mean_case.median_s if mean_case else None)
    if ratio is None:
        lines.append(f"n/a  krum within 3x mean's time at n={n}, d=2**20: not measured")
    else:
        lines.append(
            f"{'PASS' if ratio <= 3.0 else 'FAIL'} krum at n={n}, d=2**20: "
            f"{1e3 * c.median_s:.2f} ms = {ratio:.2f}x mean's "
            f"{1e3 * mean_case.median_s:.2f} ms (target <= 3x)"
        )
    return lines


def _short(text: str | None, width: int = 90) -> str:
    text = (text or "").splitlines()[0] if text else ""
    return text if len(text) <= width else text[: width - 3] + "..."


def write_json(path: str, results: list[Case], args, wall_s: float) -> None:
    rows = []
    for c in results:
        row = asdict(c)
        row.pop("call", None)
        row.update(
            bytes=c.bytes,
            median_s=c.median_s,
            gbps=c.gbps,
        )
        numpy_case = _find(results, NUMPY, c.n, c.d)
        mean_case = _find(results, "mean", c.n, c.d)
        row["ratio_gbps_to_numpy"] = _ratio(
            c.gbps, numpy_case.gbps if numpy_case else None
        )
        row["ratio_time_to_mean"] = _ratio(
            c.median_s, mean_case.median_s if mean_case else None
        )
        rows.append(row)
    payload = {
        "benchmark": "aggregators",
        "config": {
            "n": args.n,
            "d": args.d,
            "rules": args.rules,
            "repeats": args.repeats,
            "max_f": args.max_f,
            "max_call_s": args.max_call_s,
            "max_input_gb": args.max_input_gb,
            "targets": args.targets,
            "seed": args.seed,
        },
        "environment": {},
        "wall_s": wall_s,
        "targets": target_checks(results) if args.targets else [],
        "results": rows,
    }
    harness.write_results(path, payload)


def write_plot(path: str, results: list[Case]) -> None:
    """GB/s against d, one panel per n, one line per rule (log-log)."""
    ns = sorted({c.n for c in results if c.times_s})
    names = list(dict.fromkeys(c.name for c in results if c.times_s))
    with harness.figure(path, 1, len(ns), figsize=(4 * len(ns), 4), squeeze=False) as (
        fig,
        axes,
    ):
        _plot_panels(axes, ns, names, results)


def _plot_panels(axes, ns: list[int], names: list[str], results: list[Case]) -> None:
    for ax, n in zip(axes[0], ns, strict=True):
        for name in names:
            pts = sorted(
                (c.d, c.gbps) for c in results if c.n == n and c.name == name and c.gbps
            )
            if pts:
                style = "--" if name in (NUMPY, TF_MEAN) else "-"
                ax.plot(*zip(*pts, strict=True), style, marker="o", label=name)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"n = {n}")
        ax.set_xlabel("d (float32 parameters)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("GB/s (input bytes / time)")
    axes[0][-1].legend(fontsize=7)


# ------------------------------------------------------------------- CLI


def _int_list(text: str) -> list[int]:
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if "**" in item:
            base, _, exp = item.partition("**")
            value = int(base) ** int(exp)
        else:
            value = int(float(item))
        if value < 1:
            raise argparse.ArgumentTypeError(f"must be >= 1, got {item!r}")
        out.append(value)
    return out


def _default_max_input_gb() -> float:
    """An eighth of the available memory: rules hold a few copies of the input."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return round(int(line.split()[1]) * 1024 / 8 / 1e9, 2)
    except OSError:
        pass
    return 1.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = harness.BenchmarkParser(
        "GB/s of every aggregation rule's aggregate() in a "
        "tf.function, next to numpy.sum and tf.reduce_mean.",
        name="aggregators",
        quick="smoke run: n=8, d=1e5 and the target point, 3 repeats",
        plot="write a PNG (GB/s vs d per n)",
        json_help="default benchmarks/results/aggregators.json",
        output_group="output",
    )
    grid = parser.add_argument_group("grid")
    grid.add_argument(
        "--n", type=_int_list, default=[4, 8, 16, 32], help="replica counts"
    )
    grid.add_argument(
        "--d", type=_int_list, default=[10**5, 10**6, 10**7], help="parameter counts"
    )
    grid.add_argument(
        "--rules",
        type=harness.name_list(kpd.aggregators.names, "rules"),
        help="comma-separated rules (default: all registered)",
    )
    grid.add_argument(
        "--max-f", type=int, default=2, help="largest num_byzantine tried (default 2)"
    )
    grid.add_argument(
        "--no-targets",
        dest="targets",
        action="store_false",
        help="do not add n=8, d=2**20 and its target checks",
    )
    timing = parser.add_argument_group("timing")
    parser.add_rounds(7, "timed calls (default 7)", "--repeats", timing)
    timing.add_argument(
        "--max-call-s",
        type=float,
        default=15.0,
        help="a case slower than this per call is timed once, and skipped at "
        "larger n*d (default 15)",
    )
    timing.add_argument(
        "--max-input-gb",
        type=float,
        default=_default_max_input_gb(),
        help="skip combos with a larger input (default: 1/8 of available memory)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.d, args.repeats = [8], [10**5], min(args.repeats, 3)
    args.rules = args.rules or kpd.aggregators.names()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    faulthandler.enable()
    # Every case is its own tf.function, traced once on purpose; TF's
    # "excessive retracing" warning would only be noise here.
    tf.get_logger().setLevel("ERROR")
    start = time.perf_counter()
    load_start = harness.loadavg()
    results = run_grid(args)
    wall_s = time.perf_counter() - start
    print(
        f"aggregate() in a tf.function, one float32 variable of d values from "
        f"n replicas; median of {args.repeats} interleaved calls; f = largest "
        f"valid <= {args.max_f}"
    )
    print(format_table(results))
    if args.targets:
        print()
        print("\n".join(target_checks(results)))
    for c in results:
        if c.traceback:
            print(f"\n{c.name} at n={c.n}, d={c.d} failed:\n{c.traceback}")
    print(
        f"\nwall time: {wall_s:.1f}s; load average at start {load_start}, at end "
        f"{harness.loadavg()} on {os.cpu_count()} CPUs"
    )
    write_json(args.json, results, args, wall_s)
    print(f"wrote {args.json}")
    if args.plot:
        write_plot(args.plot, results)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
