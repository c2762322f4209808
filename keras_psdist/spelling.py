"""How a gradient path is written down: one string, everywhere.

The strategies (`aggregator=`), `aggregators.get`, the CLI's `--aggregator`,
the benchmarks and the docs' tables write a configuration the same way:

    [compressor>][pre-aggregation>...>]rule[+wm[BETA]]

- `rule` is an aggregation rule's id (`median`, `trimmed_mean`, ...), last.
- Each `pre-aggregation` (`nnm`, `bucketing`, `clipping`, `arc`) transforms
  the replicas' values for what follows it, in the order written:
  `nnm>arc>median` mixes, then clips, then takes the median.
- Any stage may take constructor arguments in parentheses, `;`-separated
  (a comma before the next `key=` is read as `;` too):
  `bucketing(bucket_size=4;seed=0)>centered_clipping(radius=0.5)`. Values
  are read as Python literals where they are one (`2`, `0.5`, `True`,
  `None`), else kept as text.
- `+wm` adds worker momentum 0.9 (`+wm0.99`: 0.99), which the strategy
  applies to each replica before the rest of the path (its
  `worker_momentum=`); it is not part of the aggregator.
- A `compressor` (`top_k`, `random_k`, `sign`, `power_sgd`, `fp16`,
  `bf16`, `none`; `keras_psdist.compression`) may stand first: what each
  replica sends, compressed on its own device and decompressed before the rest
  (`"top_k(ratio=0.01)>trimmed_mean"`). It is the strategy's
  `compression=`, not part of the aggregator. Written first because the
  chain reads in the order the stages run: the replica compresses, then the
  reduction device mixes and aggregates (worker momentum, the one stage
  before compression, keeps its suffix). Compressor and aggregator ids
  never collide, so the first stage says which it is.

`parse` turns a string into the config dict `aggregators.get` builds (the
rule innermost, as `serialize` writes it), `spell_config` writes a config dict
back. This module imports no TensorFlow, so the CLI checks a configuration
before TensorFlow loads.

Examples:

>>> parse("nnm>trimmed_mean").aggregator
{'class_name': 'nnm', 'config': {'aggregator': 'trimmed_mean'}}
>>> parse("arc>median+wm").worker_momentum
0.9
>>> parse("top_k(ratio=0.01)>trimmed_mean").compression
{'class_name': 'top_k', 'config': {'ratio': 0.01}}
>>> spell_config(parse("bucketing(bucket_size=4)>centered_clipping(radius=0.5)").aggregator)
'bucketing(bucket_size=4)>centered_clipping(radius=0.5)'
>>> parse("median>nnm")
Traceback (most recent call last):
...
ValueError: The rule goes last in 'median>nnm': 'nnm' is a pre-aggregation, which transforms the values for a rule after it. Write e.g. 'nnm>median'.
"""

from __future__ import annotations

import ast
import difflib
import re
import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

from keras_psdist.families import AGGREGATORS, COMPRESSORS, PRE_AGGREGATIONS, RULES

# The worker momentum `+wm` means, without a number.
WORKER_MOMENTUM = 0.9

# The argument through which a pre-aggregation holds what follows it.
INNER = "aggregator"

_STAGE = re.compile(r"([A-Za-z_]\w*)(?:\((.*)\))?")
_SUFFIX = re.compile(r"wm(\d*\.?\d*)")


class Configuration(NamedTuple):
    """A parsed configuration.

    Attributes:
        aggregator: What `aggregators.get` builds: the rule's id when it has
            neither pre-aggregation nor argument, else a config dict (the
            rule innermost, each pre-aggregation holding what follows it in
            its `aggregator` argument).
        worker_momentum: The `+wm` suffix's beta, 0.0 without one.
        rule: The rule's id (the last stage).
        stages: The aggregator's stages' ids, in the order written (the
            compressor, if any, is `compression`).
        compression: The compressor written first, as `parse_compression`
            gives it, or `None`.
    """

    aggregator: str | dict[str, Any]
    worker_momentum: float
    rule: str
    stages: tuple[str, ...]
    compression: str | dict[str, Any] | None = None


def is_spelled(identifier: Any) -> bool:
    """Whether `identifier` is a string that is more than a bare id (a chain,
    arguments or a suffix), which `parse` reads."""
    return isinstance(identifier, str) and bool(re.search(r"[>(+]", identifier))


def parse(text: str) -> Configuration:
    """Reads `[compressor>][pre>...>]rule[+wm[BETA]]` (see the module docstring).

    Args:
        text: The configuration, e.g. `"nnm>trimmed_mean"`.

    Returns:
        A `Configuration`.

    Raises:
        ValueError: for an unknown id (naming the valid ones where it stands:
            pre-aggregations before the last `>`, rules at the end), a rule
            before the last `>` or a pre-aggregation at the end of a chain
            (the rule goes last), a malformed stage or argument, or an
            unknown suffix, or a compressor anywhere but first or without
            a rule after it; each names the part and the whole string.
    """
    if not isinstance(text, str):
        raise ValueError(
            f"A configuration is a string like 'nnm>trimmed_mean'. Received: {text!r}"
        )
    body, plus, suffix = text.partition("+")
    beta = _worker_momentum(suffix, text) if plus else 0.0
    parts = [_stage(part, text) for part in body.split(">")]
    compression = None
    if parts[0][0] in COMPRESSORS.names():
        (name, arguments), parts = parts[0], parts[1:]
        compression = {"class_name": name, "config": arguments} if arguments else name
        if not parts:
            raise ValueError(
                f"{name!r} in {text!r} is a compressor (what each replica sends), "
                "and a configuration ends with a rule: write e.g. "
                f"'{body}>mean', or pass compression={body!r} beside the "
                "aggregator."
            )
    names = [name for name, _ in parts]
    for name in names:
        if name in COMPRESSORS.names():
            raise ValueError(
                f"The compressor {name!r} goes first in {text!r}: a replica "
                "compresses what it sends before the reduction device mixes or "
                f"aggregates it. Write e.g. '{name}>{names[-1]}'."
            )
    if len(parts) > 1:
        _check_order(names, text)
    for position, name in enumerate(names):
        _check_known(
            name, text, last=position == len(names) - 1, chained=len(parts) > 1
        )
    (rule, rule_args), pres = parts[-1], parts[:-1]
    aggregator: str | dict[str, Any] = (
        {"class_name": rule, "config": rule_args} if rule_args else rule
    )
    for name, arguments in reversed(pres):
        if INNER in arguments:
            raise ValueError(
                f"{name}'s {INNER!r} is what follows it in {text!r}: write the "
                f"rule after '>' instead of {INNER}={arguments[INNER]!r}."
            )
        aggregator = {"class_name": name, "config": {INNER: aggregator, **arguments}}
    return Configuration(aggregator, beta, rule, tuple(names), compression)


def parse_compression(text: str) -> str | dict[str, Any]:
    """Reads a compressor written alone: `top_k` or `top_k(ratio=0.05)`.

    Args:
        text: The compressor, as `compression=` or `--compression` take it.

    Returns:
        Its id, or a config dict when it has arguments (what
        `keras_psdist.compression.get` builds).

    Raises:
        ValueError: for an unknown id (naming the valid ones) or a malformed
            stage or argument.
    """
    if not isinstance(text, str):
        raise ValueError(
            f"A compressor is written like 'top_k(ratio=0.01)'. Received: {text!r}"
        )
    name, arguments = _stage(text, text)
    if name not in COMPRESSORS.names():
        raise ValueError(COMPRESSORS.unknown_message(name))
    return {"class_name": name, "config": arguments} if arguments else name


def aggregator_only(text: str) -> str | dict[str, Any]:
    """The aggregator of a configuration that must be an aggregator alone
    (`aggregators.get`, a pre-aggregation's inner rule): what `parse` reads,
    refusing worker momentum and compression, which are the strategy's.

    Raises:
        ValueError: as `parse`, or for a `+wm` suffix or a compressor first,
            saying where they go instead.
    """
    configuration = parse(text)
    if configuration.worker_momentum:
        raise ValueError(
            f"{text!r} ends with worker momentum, which the strategy "
            "keeps for each replica, not the aggregator: pass the whole "
            "string as a strategy's `aggregator=`, or "
            f"aggregator={spell_config(configuration.aggregator)!r}, "
            f"worker_momentum={configuration.worker_momentum}."
        )
    if configuration.compression is not None:
        raise ValueError(
            f"{text!r} starts with compression, which each replica "
            "applies to what it sends, not the aggregator: pass the whole "
            "string as a strategy's `aggregator=`, or "
            f"aggregator={spell_config(configuration.aggregator)!r}, "
            f"compression={spell_config(configuration.compression)!r}."
        )
    return configuration.aggregator


def spell(
    config: str | Mapping[str, Any],
    worker_momentum: float = 0.0,
    compression: str | Mapping[str, Any] | None = None,
) -> str:
    """Deprecated (removed in 0.5): `spell_config`, or `aggregators.spell` for
    an aggregator object. Two public functions named `spell` took different
    things; this one takes a config dict."""
    warnings.warn(
        "`keras_psdist.spelling.spell` is deprecated and will be removed in "
        "0.5: use `keras_psdist.spelling.spell_config` (a config dict, as "
        "here) or `keras_psdist.aggregators.spell` (an aggregator object).",
        DeprecationWarning,
        stacklevel=2,
    )
    return spell_config(config, worker_momentum, compression)


def spell_config(
    config: str | Mapping[str, Any],
    worker_momentum: float = 0.0,
    compression: str | Mapping[str, Any] | None = None,
) -> str:
    """Writes a config dict (as `parse` or `aggregators.serialize` give) as a string.

    Arguments that are `None` are left out (every built-in takes `None` as
    "the default"); `aggregators.spell` also leaves out those equal to the
    class's defaults.

    Args:
        config: A rule's id or config dict, pre-aggregations holding what
            follows them in `aggregator`.
        worker_momentum: Adds `+wm[BETA]` when not 0.
        compression: A compressor's id or config dict, written first.

    Returns:
        The string `parse` reads back to the same configuration.
    """
    stages = []
    while True:
        if isinstance(config, str):
            stages.append(config)
            break
        if not isinstance(config, Mapping) or "class_name" not in config:
            raise ValueError(
                "`spell_config` takes an aggregator id or config dict, e.g. "
                f"{{'class_name': 'nnm', 'config': {{'aggregator': 'median'}}}}. "
                f"Received: {config!r}"
            )
        arguments = dict(config.get("config") or {})
        inner = arguments.pop(INNER, None)
        shown = [f"{k}={v!r}" for k, v in arguments.items() if v is not None]
        name = config["class_name"]
        stages.append(f"{name}({';'.join(shown)})" if shown else name)
        if inner is None:
            break
        config = inner
    if compression is not None:
        stages.insert(0, _spell_stage(compression))
    text = ">".join(stages)
    if worker_momentum:
        text += "+wm" if worker_momentum == WORKER_MOMENTUM else f"+wm{worker_momentum}"
    return text


def _spell_stage(config: str | Mapping[str, Any]) -> str:
    """One stage without an inner one: `id` or `id(key=value;...)`."""
    if isinstance(config, str):
        return config
    arguments = dict(config.get("config") or {})
    shown = [f"{k}={v!r}" for k, v in arguments.items() if v is not None]
    name = config["class_name"]
    return f"{name}({';'.join(shown)})" if shown else name


def is_pre_aggregation(name: str) -> bool:
    """Whether `name` is a registered pre-aggregation's id (a built-in one,
    or a user's class with `pre_aggregation = True`)."""
    if name in PRE_AGGREGATIONS:
        return True
    if name in RULES or name not in AGGREGATORS.names():
        return False
    # A user's registration: its class is already imported.
    return bool(getattr(AGGREGATORS.lookup(name), "pre_aggregation", False))


def pre_aggregation_names() -> list[str]:
    """The pre-aggregations' ids, in registration order."""
    return [name for name in AGGREGATORS.names() if is_pre_aggregation(name)]


def rule_names() -> list[str]:
    """The rules' ids (every aggregator id that is not a pre-aggregation)."""
    return [name for name in AGGREGATORS.names() if not is_pre_aggregation(name)]


# ------------------------------------------------------------------ private


def _worker_momentum(suffix: str, text: str) -> float:
    match = _SUFFIX.fullmatch(suffix)
    if not match or match.group(1) in (".",):
        raise ValueError(
            f"Unknown suffix '+{suffix}' in {text!r}. The one suffix is worker "
            "momentum, '+wm' (beta 0.9) or '+wmBETA', e.g. '+wm0.99'."
        )
    beta = float(match.group(1)) if match.group(1) else WORKER_MOMENTUM
    if not 0 <= beta < 1:
        raise ValueError(
            f"Worker momentum '+{suffix}' in {text!r} must be in [0, 1), e.g. "
            f"'+wm0.9'. Received: {beta}"
        )
    return beta


def _stage(part: str, text: str) -> tuple[str, dict[str, Any]]:
    """`id` or `id(key=value;...)` -> (id, {key: value})."""
    match = _STAGE.fullmatch(part.strip())
    if not match:
        what = "an empty stage" if not part.strip() else f"{part.strip()!r}"
        raise ValueError(
            f"Cannot read {what} in {text!r}: each stage between '>' is an id, "
            "optionally with arguments, e.g. 'bucketing(bucket_size=2;seed=0)'."
        )
    arguments: dict[str, Any] = {}
    # `;` separates arguments; a comma does too where a `key=` follows it
    # (a comma inside a value, `(1, 2)`, stays).
    items = re.split(r"[;,](?=\s*[A-Za-z_]\w*\s*=)", match.group(2) or "")
    for item in filter(str.strip, items):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key.isidentifier():
            raise ValueError(
                f"Cannot read the argument {item.strip()!r} of {match.group(1)!r} in "
                f"{text!r}: arguments are key=value, separated by ';', e.g. "
                "'bucketing(bucket_size=2;seed=0)'."
            )
        arguments[key] = _literal(value.strip())
    return match.group(1), arguments


def _literal(value: str) -> Any:
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


def _check_order(names: list[str], text: str) -> None:
    last = names[-1]
    if is_pre_aggregation(last):
        rules = [n for n in names[:-1] if not is_pre_aggregation(n)]
        example = ">".join([last, *(rules[:1] or ["trimmed_mean"])])
        raise ValueError(
            f"The rule goes last in {text!r}: {last!r} is a pre-aggregation, "
            f"which transforms the values for a rule after it. Write e.g. "
            f"{example!r}."
        )
    for name in names[:-1]:
        if name in AGGREGATORS.names() and not is_pre_aggregation(name):
            raise ValueError(
                f"{name!r} in {text!r} is a rule, and a configuration has one "
                "rule, last; before it stand only pre-aggregations ("
                f"{', '.join(pre_aggregation_names())}). Write e.g. "
                f"'nnm>{name}'."
            )


def _check_known(name: str, text: str, *, last: bool, chained: bool) -> None:
    if name in AGGREGATORS.names():
        return
    if not chained:
        raise ValueError(AGGREGATORS.unknown_message(name))
    family, valid = (
        ("rule", rule_names()) if last else ("pre-aggregation", pre_aggregation_names())
    )
    message = (
        f"Unknown {family} {name!r} in {text!r}. Expected one of: {', '.join(valid)}."
    )
    close = difflib.get_close_matches(name, valid, n=1)
    if close:
        message += f" Did you mean {close[0]!r}?"
    raise ValueError(message)
