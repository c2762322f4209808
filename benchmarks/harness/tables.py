"""Tables a run prints: fixed-width (`text_table`, `format_row`,
`median_table`), markdown (`markdown_table`) and what attacks cost
(`attack_costs`); cells (`times`, `fmt`, `value_range`).

Every table printed through them is also kept (`keep_table`) until
`results.write_results` stores it in the run's JSON.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .stats import points_below


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


def take_tables() -> list[dict[str, list]]:
    """The tables kept since the last call, and no more kept: the run's JSON
    takes them (`results.write_results`)."""
    tables = list(_printed_tables)
    _printed_tables.clear()
    return tables


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
    return markdown(rows, columns)


def markdown(rows: Iterable[Sequence[Any]], columns: Sequence[str]) -> str:
    """`markdown_table`'s text, the table not kept; short rows are padded
    and a ``|`` in a cell escaped."""

    def line(cells):
        cells = [str(c).replace("|", "\\|") for c in cells]
        cells += [""] * (len(columns) - len(cells))
        return "| " + " | ".join(cells) + " |"

    return "\n".join(
        [line(columns), "|" + "---|" * len(columns), *(line(r) for r in rows)]
    )


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
