"""Command-line arguments: the argparse types and `BenchmarkParser`, the
flags every benchmark shares (``--json``, ``--plot``, ``--quick``,
``--seed``, ``--rounds`` / ``--repeats``, a child process's ``--role``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path  # noqa: F401 - the examples use it

from .checkout import RESULTS


def given(argv: Sequence[str], flag: str) -> bool:
    """Whether the command line `argv` sets `flag` (`--flag V` or
    `--flag=V`), for a default that depends on what else was asked.

    >>> given(["--ops", "--json=out.json"], "--json"), given(["--ops"], "--json")
    (True, False)
    """
    return any(a == flag or a.startswith(flag + "=") for a in argv)


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
