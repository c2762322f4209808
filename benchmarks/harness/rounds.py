"""Running the compared configurations in interleaved rounds
(`interleaved_rounds`), and what that measured (`Rounds`, `ok`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .stats import median_or_none, paired_ratios


def _value(sample: Any, key: str | Callable | None) -> Any:
    if key is None:
        return sample
    if callable(key):
        return key(sample)
    return sample.get(key) if isinstance(sample, Mapping) else getattr(sample, key)


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


def ok(entry: dict, key: str) -> bool:
    """Whether a round's `entry` has a result for `key` that did not fail.

    >>> ok({"a": {"x": 1}, "b": {"error": "..."}}, "a"), ok({}, "a")
    (True, False)
    """
    return key in entry and "error" not in entry[key]
