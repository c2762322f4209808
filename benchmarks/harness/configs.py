"""The rule configurations of the robustness benchmarks
(`robustness.py`, `sync_byzantine.py`): ``[pre>...>]rule[+wm[BETA]]``.

`parse_config` turns one into (rule id, aggregator for `PSStrategy`, worker
momentum); `config_names` is the argparse type of a comma-separated list of
them. The parsing is the library's own (`keras_psdist.spelling`), the
spelling the strategies and the CLI take.
"""

from __future__ import annotations

import argparse
import re


def parse_config(
    name: str, allow_compression: bool = False
) -> tuple[str, object, float]:
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
    if configuration.compression is not None and not allow_compression:
        raise ValueError(
            f"{name!r} starts with a compressor; this benchmark does not compress "
            "(robustness.py does): leave it out."
        )
    return configuration.rule, configuration.aggregator, configuration.worker_momentum


def compression_of(name: str) -> object:
    """The compressor a configuration starts with (`PSStrategy`'s
    `compression=`), or None.

    >>> compression_of("top_k(ratio=0.1)>arc>median+wm")
    {'class_name': 'top_k', 'config': {'ratio': 0.1}}
    >>> compression_of("median") is None
    True
    """
    from keras_psdist import spelling

    return spelling.parse(name).compression


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

    parts = re.split(r",(?![^()]*\))", text)  # not the commas inside (...)
    names = list(dict.fromkeys(s.strip() for s in parts if s.strip()))
    valid = kpd.aggregators.names()
    for name in names:
        try:
            rule, aggregator, _ = parse_config(name, allow_compression=True)
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
