"""The rule configurations of the robustness benchmarks
(`robustness.py`, `sync_byzantine.py`): ``[pre>...>]rule[+wm[BETA]]``.

`parse_config` turns one into (rule id, aggregator for `PSStrategy`, worker
momentum); `config_names` is the argparse type of a comma-separated list of
them. One parser of these strings for the benchmarks, in one module, so that
it can give way to the library's own (`keras_psdist.aggregators.get`) when
that takes them.
"""

from __future__ import annotations

import argparse
import re

# The worker momentum `+wm` means.
WORKER_MOMENTUM = 0.9


def parse_config(name: str) -> tuple[str, object, float]:
    """`[pre>...>]rule[+wm[BETA]]` -> (rule id, aggregator for PSStrategy, worker momentum).

    `pre` is a pre-aggregation wrapped around what follows it (`nnm`,
    `bucketing`, `arc`, `clipping`); several chain, the leftmost outermost
    (`nnm>arc>rule` is NNM(ARC(rule))). `+wm` adds worker momentum 0.9,
    `+wmBETA` worker momentum BETA. Any stage may take constructor
    arguments in parentheses, `;`-separated: `centered_clipping(radius=0.1)`,
    `bucketing(bucket_size=2;seed=0)`.

    >>> parse_config("arc>median+wm")
    ('median', {'class_name': 'arc', 'config': {'aggregator': 'median'}}, 0.9)
    >>> parse_config("krum")
    ('krum', 'krum', 0.0)
    >>> parse_config("nnm>arc>centered_clipping(radius=0.5)+wm0.99")[1]
    {'class_name': 'nnm', 'config': {'aggregator': {'class_name': 'arc', \
'config': {'aggregator': {'class_name': 'centered_clipping', 'config': {'radius': 0.5}}}}}}
    """
    body, plus, suffix = name.partition("+")
    if plus and not re.fullmatch(r"wm(0?\.\d+)?", suffix):
        raise ValueError(
            f"unknown suffix +{suffix} in {name!r}; the one suffix is +wm[BETA]"
        )
    beta = (float(suffix[2:]) if suffix[2:] else WORKER_MOMENTUM) if plus else 0.0
    stages = [_stage(s, name) for s in body.split(">")]
    (rule, rule_args), pres = stages[-1], stages[:-1]
    aggregator: object = (
        {"class_name": rule, "config": rule_args} if rule_args else rule
    )
    for pre, pre_args in reversed(pres):
        aggregator = {
            "class_name": pre,
            "config": {"aggregator": aggregator, **pre_args},
        }
    return rule, aggregator, beta


def _stage(text: str, name: str) -> tuple[str, dict[str, object]]:
    """`id` or `id(key=value;...)` -> (id, {key: value}); ints and floats parsed."""
    match = re.fullmatch(r"(\w+)(?:\((.*)\))?", text.strip())
    if not match:
        raise ValueError(f"cannot parse {text!r} in {name!r}")
    kwargs: dict[str, object] = {}
    for item in filter(None, (match.group(2) or "").split(";")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"expected key=value, got {item!r} in {name!r}")
        for convert in (int, float):
            try:
                kwargs[key.strip()] = convert(value)
                break
            except ValueError:
                continue
        else:
            kwargs[key.strip()] = value.strip()
    return match.group(1), kwargs


PRE_AGGREGATIONS = ("nnm", "bucketing", "arc", "clipping")


def _pre_stages(aggregator: object) -> list[str]:
    """The pre-aggregations' ids of a parsed configuration, outermost first."""
    out = []
    while isinstance(aggregator, dict) and "aggregator" in aggregator["config"]:
        out.append(aggregator["class_name"])
        aggregator = aggregator["config"]["aggregator"]
    return out


def config_names(text: str) -> list[str]:
    """argparse type: comma-separated `[pre>...>]rule[+wm[BETA]]` configurations."""
    import keras_psdist as kpd  # imports TensorFlow: only when a flag is parsed

    names = list(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    valid = kpd.aggregators.names()
    for name in names:
        try:
            rule, aggregator, _ = parse_config(name)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        pres = _pre_stages(aggregator)
        if rule not in valid or any(p not in PRE_AGGREGATIONS for p in pres):
            raise argparse.ArgumentTypeError(
                f"unknown configuration {name!r}: [pre>...>]rule[+wm[BETA]] with rule one of "
                f"{','.join(valid)} and pre one of {','.join(PRE_AGGREGATIONS)}"
            )
    if not names:
        raise argparse.ArgumentTypeError("no configuration given")
    return names
