"""A run's results: its JSON (`write_results`, `finish`) with the command
line, the tables it printed and the machine, and those tables as markdown
again (`render`; ``python benchmarks/harness render RESULT.json``)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
from pathlib import Path

from .arguments import positive
from .machine import environment, loadavg
from .tables import markdown, take_tables


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
    tables = take_tables()
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
        out += ["", f"table {number}:", "", markdown(cells, columns)]
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


def main(argv: list[str] | None = None) -> int:
    """``python benchmarks/harness render RESULT.json [--table N]``."""
    parser = argparse.ArgumentParser(
        prog="python benchmarks/harness",
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
