"""`plan`'s arguments, checked before anything is predicted, and a model's
variable sizes (a `keras.Model`, or a `.keras` file loaded on demand)."""

from __future__ import annotations

import math
import numbers
import os
import re
from collections.abc import Sequence
from typing import Any

from keras_psdist.cluster import mode_names
from keras_psdist.planning import wire as wire_lib
from keras_psdist.planning.model import BETWEEN_GRAPH, IN_GRAPH, MODES, SYNC_REPLICAS

# The strategy each mode stands for, for the error that lists them.
MODE_STRATEGIES = {
    BETWEEN_GRAPH: 'PSStrategy(mode="between-graph")',
    SYNC_REPLICAS: "SyncReplicaStrategy(replicas_to_aggregate=workers)",
    IN_GRAPH: "PSStrategy()",
}
# The words that named a mode before 0.2 name other modes than a reader of
# async and sync training may think (`keras_psdist.cluster.mode_names`).
_OLD_WORDS = {"async": BETWEEN_GRAPH, "sync": SYNC_REPLICAS}


def integer(name: str, value: Any, minimum: int = 1) -> int:
    """`value` as an int >= `minimum`, or a `ValueError` naming `name`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(
            f"`{name}` must be an integer >= {minimum}. Received: {name}={value!r}"
        )
    if value < minimum:
        raise ValueError(f"`{name}` must be >= {minimum}. Received: {name}={value}")
    return int(value)


def positive(name: str, value: Any, none: str | None = None) -> float | None:
    """`value` as a finite float > 0; None passes when `none` says what it means."""
    if value is None and none is not None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not 0 < value < math.inf
    ):
        also = f", or None ({none})" if none else ""
        raise ValueError(
            f"`{name}` must be a finite number > 0{also}. Received: {name}={value!r}"
        )
    return float(value)


def names(name: str, value: Any) -> tuple[str, ...]:
    """A non-empty sequence of strings (one string is one name)."""
    items = (value,) if isinstance(value, str) else value
    if not isinstance(items, Sequence) or not items:
        raise ValueError(
            f"`{name}` must be a non-empty sequence of strings. Received: "
            f"{name}={value!r}"
        )
    for item in items:
        if not isinstance(item, str):
            raise ValueError(
                f"`{name}` must hold strings. Received: {name}={value!r} "
                f"(holding {item!r})"
            )
    return tuple(dict.fromkeys(items))


def modes(value: Any) -> tuple[str, ...]:
    """The modes' names as `PSStrategy(mode=...)` spells them (underscores
    read as hyphens), or a `ValueError` that lists them with their strategies."""
    chosen = tuple(
        dict.fromkeys(mode_names.normalise(m) for m in names("modes", value))
    )
    for mode in chosen:
        if mode not in MODES:
            listed = "; ".join(f"{m}: {s}" for m, s in MODE_STRATEGIES.items())
            hint = (
                f" For {mode} training, write {_OLD_WORDS[mode]!r}."
                if mode in _OLD_WORDS
                else ""
            )
            raise ValueError(
                f"Unknown mode {mode!r}. Expected one of: {', '.join(MODES)} "
                f"({listed}).{hint} Received: modes={value!r}"
            )
    return chosen


def wires(value: Any) -> tuple[wire_lib.Wire, ...]:
    parsed = []
    for spelling in names("compressions", value):
        try:
            parsed.append(wire_lib.parse(spelling))
        except ValueError as e:
            raise ValueError(f"{e} Received: compressions={value!r}") from None
    return tuple(parsed)


def variable_bytes(model: Any, sizes: Any) -> tuple[int, ...]:
    """The bytes of each variable, from exactly one of `model` and `sizes`."""
    if (model is None) == (sizes is None):
        said = "both" if model is not None else "neither"
        raise ValueError(
            "Pass exactly one of `model` (a keras.Model or a .keras file) and "
            f"`variable_bytes` (one int per variable). Received: {said}."
        )
    if sizes is not None:
        if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
            raise ValueError(
                "`variable_bytes` must be a list of ints, one per variable. "
                f"Received: variable_bytes={sizes!r}"
            )
        if not sizes:
            raise ValueError(
                "`variable_bytes` must name at least one variable. Received: "
                "variable_bytes=[]"
            )
        return tuple(integer("variable_bytes[i]", size) for size in sizes)
    if isinstance(model, (str, os.PathLike)):
        model = _load(os.fspath(model))
    weights = getattr(model, "trainable_weights", None)
    if weights is None:
        raise ValueError(
            "`model` must be a keras.Model or the path of a .keras file. "
            f"Received: model={model!r}"
        )
    if not weights:
        raise ValueError(
            "The model has no trainable variables yet: build it first (give it "
            "a keras.Input, or call it on a batch). Received: model with 0 "
            "trainable variables."
        )
    return tuple(_bytes_of(v) for v in weights)


def _load(path: str) -> Any:
    if not path.endswith(".keras"):
        raise ValueError(
            "`model` as a path must be a .keras file (model.save('m.keras')). "
            f"Received: model={path!r}"
        )
    if not os.path.isfile(path):
        raise ValueError(f"No .keras file at {path!r}. Received: model={path!r}")
    import keras  # Only here: the planner itself imports no TensorFlow.

    return keras.saving.load_model(path, compile=False)


def _bytes_of(variable: Any) -> int:
    count = math.prod(int(d) for d in variable.shape)
    dtype = str(getattr(variable.dtype, "name", variable.dtype))
    bits = re.search(r"(\d+)$", dtype)
    return count * (int(bits.group(1)) // 8 if bits else 1)
