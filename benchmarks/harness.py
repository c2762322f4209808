"""The harness every benchmark script shares (no TensorFlow import at load).

* arguments: `BenchmarkParser` (``--json``, ``--plot``, ``--quick``,
  ``--seed``, ``--rounds`` / ``--repeats``, the children's ``--role``) and
  the argparse types `positive`, `positive_float`, `non_negative_float`,
  `int_list`, `seed_list`; the rule configurations of the robustness
  benchmarks, `parse_config`;
* measuring: `interleaved_rounds` runs configurations in alternating rounds
  (A B, B A, ... or A B, A B, ...) and returns a `Rounds`: per-configuration
  samples, medians, ratios to a baseline paired round by round;
* repeated runs: `chance_gap` (how far the worst of k runs falls by
  chance), `points_below` and `attack_costs` (what an attack costs on
  average);
* reporting: `markdown_table`, `text_table` / `format_row` (fixed-width
  tables), `median_row`, `ratio`, `times`, `fmt`, `value_range`;
* results: `environment` (machine, load average, versions, git commit),
  `write_results` (JSON with the environment, the command line and every
  table the run printed), `finish` (the common end of the cluster
  benchmarks), `figure` (a matplotlib figure saved as PNG), `render` (a
  result's tables as markdown again: ``python benchmarks/harness.py render
  benchmarks/results/NAME.json``);
* local clusters: `use_checkout`, `run_dir`, `run_process`, `read_reports`,
  `RunFailed`, `log_failure`, `ok`.

Run ``python -m doctest benchmarks/harness.py`` to check the examples.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "benchmarks" / "results"


def log(msg: str) -> None:
    """Progress to stderr, so stdout keeps only the results."""
    print(msg, file=sys.stderr, flush=True)


def chance_gap(
    clean: Sequence[float],
    runs: Sequence[float],
    columns: int,
    tolerance: float,
    draws: int = 20_000,
) -> tuple[float, float]:
    """How far the worst of `columns` runs falls below one clean run by chance.

    `clean` and `runs` are accuracies in [0, 1] of repeated runs without any
    attack (the clean reference's and a configuration's); each draw takes
    one of `clean` and the lowest of `columns` of `runs`, with replacement.
    Returns the expected gap in points and the fraction of draws whose gap
    exceeds `tolerance` points (seeded: the same inputs give the same
    answer).

    >>> chance_gap([0.9, 0.9], [0.9, 0.9], columns=11, tolerance=2.0)
    (0.0, 0.0)
    >>> chance_gap([0.98], [0.95, 0.97], columns=11, tolerance=2.0)  # 1 in 2**11: 1.0
    (3.0, 0.999)
    """
    rng = random.Random(0)
    gaps = [
        100 * (rng.choice(clean) - min(rng.choices(runs, k=columns)))
        for _ in range(draws)
    ]
    over = sum(gap > tolerance for gap in gaps) / draws
    return round(statistics.fmean(gaps), 2), round(over, 3)


def points_below(
    reference: Sequence[float], runs: Sequence[float]
) -> tuple[float, float]:
    """How far the mean of `runs` lies below the mean of `reference` (accuracies
    in [0, 1]), in points, and that difference's standard error (unequal
    variances; each needs two runs or more).

    >>> points_below([0.97, 0.99], [0.95, 0.95])
    (3.0, 1.0)
    """
    a, b = list(reference), list(runs)
    se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    gap = statistics.fmean(a) - statistics.fmean(b)
    return round(100 * gap, 2), round(100 * se, 2)


def attack_costs(
    clean: Mapping[str, Sequence[float]],
    attacked: Mapping[tuple[str, str], Sequence[float]],
    labels: Mapping[str, str],
) -> str:
    """A text table of what each attack costs each configuration, on average.

    `clean[config]` holds a configuration's accuracies without attack over
    repeated runs (`clean["mean"]` the undefended mean's), and
    `attacked[(config, attack)]` its accuracies under `attack` (`labels`:
    the attacks' column labels). Per row: the attacked runs' lowest, mean,
    highest and standard deviation (%), and how far their mean lies below
    the clean `mean` runs' and below the configuration's own clean runs'
    (points, +- one standard error). The attack with the lowest mean is
    marked as the configuration's expected worst case.

    >>> print(attack_costs(
    ...     {"mean": [0.98, 0.97], "gm": [0.97, 0.97]},
    ...     {("gm", "alie"): [0.95, 0.96], ("gm", "ipm"): [0.97, 0.96]},
    ...     {"alie": "ALIE", "ipm": "IPM"},
    ... ))  # doctest: +NORMALIZE_WHITESPACE
    configuration attack lowest  mean highest   sd below clean mean below own clean
    gm              ALIE   95.0  95.5    96.0 0.71     2.00 +- 0.71    1.50 +- 0.50  <- worst
    gm               IPM   96.0  96.5    97.0 0.71     1.00 +- 0.71    0.50 +- 0.50
    """
    width = max(len("configuration"), *(len(c) for c, _ in attacked))
    label_width = max(len("attack"), *(len(label) for label in labels.values()))
    lines = [
        f"{'configuration':{width}s} {'attack':>{label_width}s} {'lowest':>6s} "
        f"{'mean':>5s} {'highest':>7s} {'sd':>4s} {'below clean mean':>16s} "
        f"{'below own clean':>15s}"
    ]
    kept = []  # the same table, for the JSON
    for config in dict.fromkeys(c for c, _ in attacked):
        rows = {a: v for (c, a), v in attacked.items() if c == config}
        worst = min(rows, key=lambda a: statistics.fmean(rows[a]))
        for attack, values in rows.items():
            gap, se = points_below(clean["mean"], values)
            own, own_se = points_below(clean[config], values)
            mark = "  <- worst" if attack == worst else ""
            lines.append(
                f"{config:{width}s} {labels[attack]:>{label_width}s} "
                f"{100 * min(values):6.1f} {100 * statistics.fmean(values):5.1f} "
                f"{100 * max(values):7.1f} {100 * statistics.stdev(values):4.2f} "
                f"{gap:8.2f} +-{se:5.2f} {own:7.2f} +-{own_se:5.2f}{mark}"
            )
            spread = (min(values), statistics.fmean(values), max(values))
            kept.append(
                [config, labels[attack], *(f"{100 * v:.1f}" for v in spread)]
                + [f"{100 * statistics.stdev(values):.2f}", f"{gap:.2f} +- {se:.2f}"]
                + [f"{own:.2f} +- {own_se:.2f}", mark.strip()]
            )
    keep_table(
        ["configuration", "attack", "lowest", "mean", "highest", "sd"]
        + ["below clean mean", "below own clean", ""],
        kept,
    )
    return "\n".join(lines)


def loadavg() -> list[float] | None:
    """1/5/15-minute load averages: other processes skew a 2-core machine."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def prepare_tensorflow() -> None:
    """Quiets TensorFlow's C++ logs and selects Keras's TensorFlow backend,
    unless set already: call it before TensorFlow is imported."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")


def ensure_importable() -> None:
    """Lets this process import `keras_psdist` from this checkout when it is
    not installed (an installed one is used first)."""
    try:
        import keras_psdist  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(REPO_ROOT))


def use_checkout() -> None:
    """Lets this process and its children import `keras_psdist` from this
    checkout, installed or not."""
    sys.path.insert(0, str(REPO_ROOT))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p
    )


# ------------------------------------------------------------ argparse types


def positive(text: str) -> int:
    """argparse type: an integer >= 1.

    >>> positive("3")
    3
    """
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a number > 0."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def non_negative_float(text: str) -> float:
    """argparse type: a number >= 0."""
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def int_list(text: str) -> list[int]:
    """argparse type: comma-separated integers >= 1 (empty items skipped).

    >>> int_list("5,40,400")
    [5, 40, 400]
    """
    return [positive(t) for t in text.split(",") if t.strip()]


def seed_list(text: str) -> list[int]:
    """argparse type: comma-separated integers >= 0 (seeds).

    >>> seed_list("0,1,2")
    [0, 1, 2]
    """
    try:
        seeds = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"seeds must be >= 0, got {text!r}")
    return seeds


def name_list(choices: Callable[[], Sequence[str]] | Sequence[str], what: str):
    """argparse type: comma-separated names out of `choices` (a list, or a
    function giving it when the flag is parsed), duplicates dropped.

    >>> name_list(["mean", "median"], "rules")("median,mean,median")
    ['median', 'mean']
    """

    def parse(text: str) -> list[str]:
        names = [s.strip() for s in text.split(",") if s.strip()]
        valid = list(choices() if callable(choices) else choices)
        unknown = [n for n in names if n not in valid]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {unknown}; choose from {','.join(valid)}"
            )
        return list(dict.fromkeys(names))

    return parse


# ---------------------------------------------------------------- arguments


class BenchmarkParser(argparse.ArgumentParser):
    """An `ArgumentParser` with the flags the benchmarks share.

    ``--json PATH``: with `name`, it defaults to
    ``benchmarks/results/<name>.json`` (with `quick_json` and ``--quick``,
    ``<name>_quick.json``); without, no JSON is written unless asked.
    ``--quick`` (when `quick` is its help), ``--plot PATH`` (when `plot` is
    its help) and ``--seed`` (default 0, unless `seed` is False) come with
    it; `add_rounds` adds ``--rounds`` or ``--repeats``, `add_child_role`
    the hidden flags of a child process. With `output_group`, ``--json`` and
    ``--plot`` go in an argument group of that title, `self.output`.

    >>> p = BenchmarkParser("demo", name="demo", quick="smoke run", quick_json=True)
    >>> Path(p.parse_args(["--quick"]).json).name
    'demo_quick.json'
    >>> p.parse_args([]).seed
    0
    """

    def __init__(
        self,
        description: str | None,
        *,
        name: str | None = None,
        quick: str | None = None,
        quick_json: bool = False,
        plot: str | None = None,
        seed: bool | str = True,
        json_help: str | None = None,
        output_group: str | None = None,
    ):
        super().__init__(description=description)
        self._name, self._quick_json = name, quick_json
        self._child_role = False
        self.output = self.add_argument_group(output_group) if output_group else self
        if name is not None and json_help is None:
            json_help = f"raw numbers + machine (default benchmarks/results/{name}.json"
            json_help += f"; with --quick, {name}_quick.json)" if quick_json else ")"
        self.output.add_argument(
            "--json", metavar="PATH", help=json_help or "write the results as JSON"
        )
        if plot is not None:
            self.output.add_argument("--plot", metavar="PATH", help=plot)
        if quick is not None:
            self.add_argument("--quick", action="store_true", help=quick)
        if seed:
            help_ = seed if isinstance(seed, str) else "random seed (default 0)"
            self.add_argument("--seed", type=int, default=0, help=help_)

    def add_rounds(
        self, default: int | None, help: str, flag: str = "--rounds", group=None
    ) -> None:
        """``--rounds`` (or `flag`, e.g. ``--repeats``): a count >= 1."""
        (group or self).add_argument(flag, type=positive, default=default, help=help)

    def add_child_role(self, roles: Sequence[str]) -> None:
        """Hidden ``--role`` and ``--out-dir``: this script re-invoked as a
        child process that reports into a folder."""
        self._child_role = True
        self.add_argument("--role", choices=roles, help=argparse.SUPPRESS)
        self.add_argument("--out-dir", help=argparse.SUPPRESS)

    def parse_args(self, args=None, namespace=None) -> argparse.Namespace:
        ns = super().parse_args(args, namespace)
        if ns.json is None and self._name is not None:
            quick = self._quick_json and getattr(ns, "quick", False)
            ns.json = str(RESULTS / f"{self._name}{'_quick' if quick else ''}.json")
        if self._child_role and ns.role and not ns.out_dir:
            self.error("--role needs --out-dir")
        return ns


# --------------------------------------------------------- interleaved rounds


def _value(sample: Any, key: str | Callable | None) -> Any:
    if key is None:
        return sample
    if callable(key):
        return key(sample)
    return sample.get(key) if isinstance(sample, Mapping) else getattr(sample, key)


def median_or_none(values: Iterable[float]) -> float | None:
    """The median, or None for no values.

    >>> median_or_none([3, 1, 2]), median_or_none([])
    (2, None)
    """
    values = list(values)
    return statistics.median(values) if values else None


def paired_ratios(
    values: Mapping[Any, float | None], baseline: Mapping[Any, float | None]
) -> list[float]:
    """Per round present in both (and non-zero in `baseline`): value / baseline.

    >>> paired_ratios({0: 2.0, 1: 3.0, 2: None}, {0: 1.0, 1: 2.0, 2: 1.0})
    [2.0, 1.5]
    """
    return [
        v / baseline[r] for r, v in values.items() if v is not None and baseline.get(r)
    ]


@dataclass
class Rounds:
    """What `interleaved_rounds` measured.

    `results[r]` maps each configuration run in round r, in the order it
    ran, to what `run_one` returned or to the exception it raised; `orders`
    lists those orders. A `key` below picks the number out of a result: None
    (the result itself), a dict key or attribute name, or a function.
    """

    names: list[str]
    results: list[dict[str, Any]] = field(default_factory=list)
    orders: list[list[str]] = field(default_factory=list)

    def by_round(self, name: str, key=None) -> dict[int, Any]:
        """{round: value} of `name`'s runs that did not fail."""
        return {
            r: _value(res[name], key)
            for r, res in enumerate(self.results)
            if name in res and not isinstance(res[name], BaseException)
        }

    def samples(self, name: str, key=None) -> list:
        """`name`'s values, round by round, failed runs left out."""
        return list(self.by_round(name, key).values())

    def median(self, name: str, key=None) -> float | None:
        """The median of `name`'s values (None values left out), or None."""
        return median_or_none(v for v in self.samples(name, key) if v is not None)

    def medians(self, key=None) -> dict[str, float | None]:
        """{name: median} of every configuration."""
        return {n: self.median(n, key) for n in self.names}

    def ratios(self, name: str, baseline: str, key=None) -> list[float]:
        """Per round where both ran: `name`'s value / `baseline`'s."""
        return paired_ratios(self.by_round(name, key), self.by_round(baseline, key))

    def ratio_medians(self, baseline: str, key=None) -> dict[str, float | None]:
        """{name: median over rounds of (value / baseline's in that round)}."""
        return {n: median_or_none(self.ratios(n, baseline, key)) for n in self.names}

    def entries(self, **extra) -> list[dict]:
        """One JSON-ready dict per round: ``{"round": r, **extra, name: result
        or {"error": message}}``, configurations in the order they ran."""
        return [
            {
                "round": r,
                **extra,
                **{
                    n: {"error": str(v)} if isinstance(v, BaseException) else v
                    for n, v in res.items()
                },
            }
            for r, res in enumerate(self.results)
        ]


def interleaved_rounds(
    configs: Mapping[str, Any] | Sequence[str],
    run_one: Callable[[Any, int], Any],
    rounds: int,
    *,
    rotate: bool = True,
    catch: tuple[type[BaseException], ...] = (Exception,),
    drop_failed: bool = False,
    on_error: Callable[[str, int, BaseException], None] | None = None,
    after_round: Callable[[int, dict[str, Any]], None] | None = None,
) -> Rounds:
    """Runs every configuration once per round, for `rounds` rounds.

    `configs` maps names to what `run_one(config, round)` measures (a plain
    list of names: each is its own config). With `rotate` the order turns
    by one each round (A B C, B C A, C A B, ...), else it stays (A B, A B,
    ...): either way drift of the machine's load hits every configuration
    alike, and a ratio to a baseline taken within each round cancels most
    of it. An exception of a type in `catch` is recorded as that run's
    result (`on_error(name, round, exc)` is called inside the ``except``, so
    `traceback.format_exc()` works there); with `drop_failed` that
    configuration sits out the later rounds (the rotation then turns over
    the others). `after_round(round, results)` follows every round.

    >>> speed = {"a": 1, "b": 2}
    >>> res = interleaved_rounds(speed, lambda s, r: s * (r + 1), 3)
    >>> res.orders
    [['a', 'b'], ['b', 'a'], ['a', 'b']]
    >>> res.samples("a"), res.medians()
    ([1, 2, 3], {'a': 2, 'b': 4})
    >>> res.ratio_medians("a")
    {'a': 1.0, 'b': 2.0}
    >>> res.entries()[1]
    {'round': 1, 'b': 4, 'a': 2}
    """
    if not isinstance(configs, Mapping):
        configs = {name: name for name in configs}
    names = list(configs)
    out = Rounds(names)
    dropped: set[str] = set()
    for r in range(rounds):
        live = [n for n in names if n not in dropped]
        k = r % max(len(live), 1) if rotate else 0
        order = live[k:] + live[:k]
        out.orders.append(order)
        results: dict[str, Any] = {}
        out.results.append(results)
        for name in order:
            try:
                results[name] = run_one(configs[name], r)
            except catch as e:
                results[name] = e
                if drop_failed:
                    dropped.add(name)
                if on_error is not None:
                    on_error(name, r, e)
        if after_round is not None:
            after_round(r, results)
    return out


# ------------------------------------------------------------------ tables


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing (or b is 0).

    >>> ratio(3.0, 2.0), ratio(None, 2.0), ratio(1.0, 0)
    (1.5, None, None)
    """
    return a / b if a is not None and b else None


def times(r: float | None) -> str:
    """A ratio as ``1.23x``; ``n/a`` for None.

    >>> times(1.234), times(None)
    ('1.23x', 'n/a')
    """
    return "n/a" if r is None else f"{r:.2f}x"


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    """`value` in `spec` with `suffix`, or ``failed`` for None.

    >>> fmt(2.5, ".1f", " s"), fmt(None, ".1f")
    ('2.5 s', 'failed')
    """
    return "failed" if value is None else f"{value:{spec}}{suffix}"


def value_range(values: list[float], spec: str) -> str:
    """``min..max`` of `values` in `spec`; empty for none.

    >>> value_range([3.0, 1.0, 2.0], ".1f")
    '1.0..3.0'
    """
    return f"{min(values):{spec}}..{max(values):{spec}}" if values else ""


def median_row(
    label: str,
    median: float | None,
    values: list[float],
    spec: str,
    width: int,
    ratio: bool = False,
) -> str:
    """``  <label> <median> <min..max>``: a row of a medians-over-rounds table
    (labels `width` wide, ``x`` after a `ratio`, ``failed`` for no median).

    >>> median_row("1 worker", 950.0, [900.0, 1000.0], ".0f", 12)
    '  1 worker           950   900..1000'
    """
    value = fmt(median, spec, "x" if ratio else "")
    return f"  {label:<{width}}{value:>10}   {value_range(values, spec)}"


def median_table(
    title: str, unit: str, rows: Sequence[tuple | str], width: int
) -> list[str]:
    """The lines of a medians-over-rounds table: `title` and `unit` over
    `median_row`s, one per ``(label, median, values, spec[, ratio])`` (a
    string is printed as it is: a blank line between groups). The table goes
    in the run's JSON too (see `write_results`).

    >>> print("\\n".join(median_table("Async", "examples/s",
    ...     [("1 worker", 950.0, [900.0, 1000.0], ".0f")], 12)))
    Async         examples/s   min..max
      1 worker           950   900..1000
    """
    kept, lines = [], [f"{title:<{width + 2}}{unit:>10}   min..max"]
    for row in rows:
        if isinstance(row, str):
            kept.append(row)
            lines.append(row)
            continue
        label, median, values, spec, *ratio = row
        ratio = bool(ratio and ratio[0])
        kept.append(
            [label, fmt(median, spec, "x" if ratio else ""), value_range(values, spec)]
        )
        lines.append(median_row(label, median, values, spec, width, ratio))
    keep_table([title, unit, "min..max"], kept)
    return lines


@dataclass(frozen=True)
class Column:
    """A column of a fixed-width table: its title, width and alignment
    (a format-spec alignment: ``>`` right, ``<`` left)."""

    title: str
    width: int
    align: str = ">"


def format_row(columns: Sequence[Column], cells: Sequence[Any], sep: str = " ") -> str:
    """`cells` (strings, or values formatted with `str`) padded to `columns`;
    fewer cells than columns fill the first ones.

    >>> format_row([Column("a", 3, "<"), Column("b", 5)], ["x", 1.5])
    'x     1.5'
    """
    return sep.join(
        f"{str(cell):{c.align}{c.width}}"
        for c, cell in zip(columns, cells, strict=False)
    )


# Every table this process printed through `text_table` or `markdown_table`
# since the last `write_results`, which stores them in the run's JSON
# (`"tables"`): `render` prints them again from there.
_printed_tables: list[dict[str, list]] = []


def keep_table(columns: Sequence[str], rows: Sequence[Sequence[Any] | str]) -> None:
    """Keeps a table for the run's JSON (see `write_results`), as `text_table`
    does: for a table a script prints in a layout of its own. A row that is
    a string is a note."""
    _printed_tables.append(
        {
            "columns": [str(c) for c in columns],
            "rows": [r if isinstance(r, str) else [str(c) for c in r] for r in rows],
        }
    )


def text_table(
    columns: Sequence[Column],
    rows: Iterable[Sequence[Any] | str],
    sep: str = " ",
    rule: bool = True,
) -> list[str]:
    """The lines of a fixed-width table: the titles, a rule of dashes as long
    as they (with `rule`), then one line per row; a row that is a string is
    kept as it is (a note, a blank line, a failed run's message). The table
    goes in the run's JSON too (see `write_results`).

    >>> print("\\n".join(text_table([Column("rule", 6, "<"), Column("ms", 5)],
    ...                             [["mean", "1.25"], "median failed"])))
    rule      ms
    ------------
    mean    1.25
    median failed
    """
    rows = list(rows)
    keep_table([c.title for c in columns], rows)
    header = format_row(columns, [c.title for c in columns], sep)
    lines = [header, "-" * len(header)] if rule else [header]
    for row in rows:
        lines.append(row if isinstance(row, str) else format_row(columns, row, sep))
    return lines


def markdown_table(
    rows: Iterable[Sequence[Any] | Mapping], columns: Sequence[str]
) -> str:
    """A GitHub-flavoured markdown table: `columns` are its titles; a row is
    a sequence of cells, or a mapping from titles to cells (missing: empty).
    The table goes in the run's JSON too (see `write_results`).

    >>> print(markdown_table([["mean", "97.2"], {"rule": "krum"}], ["rule", "none"]))
    | rule | none |
    |---|---|
    | mean | 97.2 |
    | krum |  |
    """
    rows = [
        [row.get(c, "") for c in columns] if isinstance(row, Mapping) else row
        for row in rows
    ]
    keep_table(columns, rows)
    return _markdown(rows, columns)


def _markdown(rows: Iterable[Sequence[Any]], columns: Sequence[str]) -> str:
    """`markdown_table`'s text, the table not kept; short rows are padded
    and a ``|`` in a cell escaped."""

    def line(cells):
        cells = [str(c).replace("|", "\\|") for c in cells]
        cells += [""] * (len(columns) - len(cells))
        return "| " + " | ".join(cells) + " |"

    return "\n".join(
        [line(columns), "|" + "---|" * len(columns), *(line(r) for r in rows)]
    )


# ----------------------------------------------------------------- results


def cpu_model() -> str | None:
    """The CPU's model name, from /proc/cpuinfo (else `platform.processor`)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def git_commit() -> str | None:
    """The checkout's HEAD commit, or None outside a git checkout."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def environment() -> dict:
    """What a run measured on: date (UTC), machine, load average, the
    versions of Python, TensorFlow, Keras, NumPy and keras_psdist, the git
    commit and TensorFlow's thread settings. Imports TensorFlow."""
    import keras
    import numpy as np
    import tensorflow as tf

    try:
        import keras_psdist

        psdist_version = keras_psdist.__version__
    except Exception:  # noqa: BLE001 - recorded as unknown
        psdist_version = None
    threading = tf.config.threading
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "sched_affinity": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else None,
        "loadavg": loadavg(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "numpy": np.__version__,
        "keras_psdist": psdist_version,
        "git_commit": git_commit(),
        "gpus": len(tf.config.list_physical_devices("GPU")),
        "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
        "inter_op_threads": threading.get_inter_op_parallelism_threads(),
        "intra_op_threads": threading.get_intra_op_parallelism_threads(),
    }


def save_json(path: str | Path, payload: dict, indent: int = 2, end: str = "\n"):
    """Writes `payload` as JSON to `path`, creating its folder; returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=indent) + end)
    return out


def command_line() -> str:
    """The command that started this run, to run it again from the
    repository root: ``python benchmarks/NAME.py --flag ...``."""
    return shlex.join(["python", *sys.argv])


def write_results(
    path: str | Path,
    payload: dict,
    *,
    env_key: str = "environment",
    indent: int = 2,
    end: str = "\n",
) -> Path:
    """Writes `payload` as JSON with the run's `command` (`command_line()`),
    the `tables` it printed since the last call (`text_table`,
    `markdown_table`; `render` prints them again) and its `environment()`
    under `env_key` (where the payload has that key already, there, its
    entries added to the environment's); returns the path."""
    env = environment()
    env.update(payload.get(env_key) or {})
    tables = list(_printed_tables)
    _printed_tables.clear()
    recorded = {"command": command_line(), "tables": tables}
    return save_json(
        path, {**recorded, **payload, env_key: env}, indent=indent, end=end
    )


def render(path: str | Path, table: int | None = None) -> str:
    """The tables a run's JSON recorded (`write_results`), as markdown: each
    numbered, after the command that made them, its notes (failed runs,
    remarks) below it. `table` picks one, counted from 1.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     path = save_json(Path(tmp, "demo.json"), {
    ...         "command": "python benchmarks/demo.py --steps 5",
    ...         "tables": [{"columns": ["rule", "ms"],
    ...                     "rows": [["mean", "1.25"], "median failed"]}]})
    ...     print(render(path))
    <!-- python benchmarks/demo.py --steps 5 -->
    <BLANKLINE>
    table 1:
    <BLANKLINE>
    | rule | ms |
    |---|---|
    | mean | 1.25 |
    <BLANKLINE>
    median failed

    Raises:
        ValueError: if the JSON has no table (or not that one), naming the
            command that makes one.
    """
    payload = json.loads(Path(path).read_text())
    command = payload.get("command", "(command not recorded)")
    tables = payload.get("tables") or []
    if not tables:
        raise ValueError(
            f"{path} records no table: it was written before the benchmarks "
            "recorded their tables, or by a script that prints none. Run it "
            f"again: {command}"
        )
    chosen = range(1, len(tables) + 1) if table is None else [table]
    if table is not None and not 1 <= table <= len(tables):
        raise ValueError(
            f"{path} has tables 1 to {len(tables)}. Received: --table {table}"
        )
    out = [f"<!-- {command} -->"]
    for number in chosen:
        columns, rows = tables[number - 1]["columns"], tables[number - 1]["rows"]
        notes = [r for r in rows if isinstance(r, str) and r.strip()]
        cells = [r for r in rows if not isinstance(r, str)]
        out += ["", f"table {number}:", "", _markdown(cells, columns)]
        out += ["", *notes] if notes else []
    return "\n".join(out)


def finish(
    args: argparse.Namespace,
    settings: tuple[str, ...],
    load_start: list[float] | None,
    wall_s: float,
    summary: dict,
    rounds: dict[str, list[dict]],
) -> int:
    """The end of a run, after its tables: prints the wall time and load,
    writes `args.json` (the `settings` of `args`, the machine, `summary` and
    `rounds`), and returns the exit code: 1 if any run failed."""
    load_end = loadavg()
    print(
        f"wall time {wall_s:.0f} s; load average (1/5/15 min) at start "
        f"{load_start}, at end {load_end} on {os.cpu_count()} CPUs"
    )
    out = write_results(
        args.json,
        {
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "settings": {k: getattr(args, k) for k in settings},
            "machine": {},
            "loadavg_start": load_start,
            "loadavg_end": load_end,
            "wall_s": wall_s,
            "summary": summary,
            **rounds,
        },
        env_key="machine",
        indent=1,
        end="",
    )
    print(f"wrote {out}")
    failed = any(
        "error" in v
        for entries in rounds.values()
        for e in entries
        for v in e.values()
        if isinstance(v, dict)
    )
    return 1 if failed else 0


def pyplot():
    """matplotlib's pyplot on the Agg backend (imported on first use)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@contextlib.contextmanager
def figure(path: str | Path, *subplots, tight_layout: dict | None = None, **kwargs):
    """A matplotlib figure saved to `path` (PNG, 120 dpi, its folder made)
    when the block ends; yields ``(fig, axes)`` of
    ``plt.subplots(*subplots, **kwargs)``; `tight_layout` are that call's
    arguments (e.g. ``{"rect": (0, 0.06, 1, 1)}``)."""
    plt = pyplot()
    fig, axes = plt.subplots(*subplots, **kwargs)
    try:
        yield fig, axes
        fig.tight_layout(**(tight_layout or {}))
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=120)
    finally:
        plt.close(fig)


# ------------------------------------------------ rule configurations
# (`robustness.py`, `sync_byzantine.py`): `[pre>...>]rule[+wm[BETA]]`.


def parse_config(name: str) -> tuple[str, object, float]:
    """`[pre>...>]rule[+wm[BETA]]` -> (rule id, aggregator for PSStrategy, worker momentum).

    The library's spelling (`keras_psdist.spelling.parse`), the one the
    strategies and the CLI take: `pre` is a pre-aggregation (`nnm`,
    `bucketing`, `arc`, `clipping`) before the rule, several in the order
    they run; `+wm` adds worker momentum 0.9, `+wmBETA` worker momentum
    BETA; any stage may take constructor arguments in parentheses,
    `;`-separated: `centered_clipping(radius=0.1)`,
    `bucketing(bucket_size=2;seed=0)`.

    >>> parse_config("arc>median+wm")
    ('median', {'class_name': 'arc', 'config': {'aggregator': 'median'}}, 0.9)
    >>> parse_config("krum")
    ('krum', 'krum', 0.0)
    >>> parse_config("nnm>arc>centered_clipping(radius=0.5)+wm0.99")[1]
    {'class_name': 'nnm', 'config': {'aggregator': {'class_name': 'arc', \
'config': {'aggregator': {'class_name': 'centered_clipping', 'config': {'radius': 0.5}}}}}}
    """
    from keras_psdist import spelling

    configuration = spelling.parse(name)
    return configuration.rule, configuration.aggregator, configuration.worker_momentum


# ------------------------------------- benchmarks that start local clusters
# (`cluster.py`, `sync_replicas.py`, `embeddings.py`): a run is a `launch` of
# processes that report through JSON files in a temporary folder and log to a
# file beside it.


class RunFailed(RuntimeError):
    """A run's processes failed; the message has their last lines."""


def run_dir(work: Path, prefix: str) -> tuple[Path, Path]:
    """A fresh folder under `work` for a run's reports, and its log file."""
    out_dir = Path(tempfile.mkdtemp(prefix=prefix, dir=work))
    return out_dir, out_dir.with_suffix(".log")


def run_process(
    command: list[str],
    log: Path,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
) -> int:
    """Runs `command` with its output in `log` (and `env` for environment,
    else this process's); its exit code, 124 on timeout."""
    with open(log, "w") as f:
        try:
            return subprocess.run(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
            ).returncode
        except subprocess.TimeoutExpired:
            return 124


def tail(path: Path, lines: int = 30) -> str:
    """The last `lines` lines of a log file."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def read_reports(
    out_dir: Path, expected: int, log: Path, code: int, pattern: str = "*.json"
) -> list[dict]:
    """The run's `expected` JSON reports (sorted by file name), or RunFailed."""
    found = sorted(out_dir.glob(pattern))
    if code != 0 or len(found) != expected:
        raise RunFailed(
            f"exit code {code}, {len(found)} of {expected} result files; last "
            f"lines of {log}:\n{tail(log)}"
        )
    return [json.loads(p.read_text()) for p in found]


def log_failure(name: str, round_: int, error: BaseException) -> None:
    """An `on_error` for `interleaved_rounds`: logs ``  failed: <error>``."""
    log(f"  failed: {error}")


def ok(entry: dict, key: str) -> bool:
    """Whether a round's `entry` has a result for `key` that did not fail.

    >>> ok({"a": {"x": 1}, "b": {"error": "..."}}, "a"), ok({}, "a")
    (True, False)
    """
    return key in entry and "error" not in entry[key]


# ------------------------------------------------------------ command line


def main(argv: list[str] | None = None) -> int:
    """``python benchmarks/harness.py render RESULT.json [--table N]``."""
    parser = argparse.ArgumentParser(
        prog="python benchmarks/harness.py",
        description="Print the tables a benchmark run recorded in its JSON "
        "as markdown, to put in (or check against) the docs.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    show = commands.add_parser("render", help="a result's tables as markdown")
    show.add_argument(
        "json", metavar="RESULT.json", help="e.g. benchmarks/results/faults.json"
    )
    show.add_argument("--table", type=positive, help="only table N (from 1)")
    args = parser.parse_args(argv)
    try:
        print(render(args.json, args.table))
    except (OSError, ValueError) as e:
        parser.exit(1, f"error: {e}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
