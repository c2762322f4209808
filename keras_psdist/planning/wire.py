"""What crosses the links per worker step, for each compression spelling.

A compression is written as `benchmarks/scaling.py --compression` writes it:
`GRADIENT[@READ_DTYPE[@READ_CHANGE]]`, e.g. `"none"`, `"fp16"`,
`"top_k(ratio=0.01)"`, `"none@bfloat16"`,
`"top_k(ratio=0.01)@bfloat16@top_k(ratio=0.05)"`:

- `GRADIENT` (`PSStrategy(compression=...)`): `none`; `fp16` or `bf16`
  (also `float16`, `bfloat16`): half the bytes; `top_k(ratio=r)`: about `2 r`
  of the bytes (each kept value with its int32 index).
- `READ_DTYPE` (`read_dtype=`): `bfloat16` or `float16` (also `bf16`,
  `fp16`): the variables are read at half the bytes.
- `READ_CHANGE` (`read_compression=`): `top_k(ratio=r)`: only each
  variable's `r` largest changes since the worker's last read, each value
  (in the read dtype) with its int32 index.

Examples:

>>> wire = parse("top_k(ratio=0.01)@bfloat16")
>>> wire.read_factor, wire.gradient_factor
(0.5, 0.02)
"""

from __future__ import annotations

import dataclasses
import re

from keras_psdist.families import COMPRESSORS

# `top_k`'s default ratio (`keras_psdist.compression.TopK`; not imported
# here: it imports TensorFlow).
TOP_K_DEFAULT_RATIO = 0.01

_HALF = {"fp16": "fp16", "float16": "fp16", "bf16": "bf16", "bfloat16": "bf16"}
_TOP_K = re.compile(r"top_k(?:\(\s*ratio\s*=\s*([0-9.eE+-]+)\s*\))?")
SUPPORTED = "none, fp16, bf16, top_k(ratio=R)"


@dataclasses.dataclass(frozen=True)
class Wire:
    """Bytes per worker step, as fractions of the variables' bytes.

    Attributes:
        name: The spelling it was read from.
        read_factor: Bytes a worker reads per step / the variables' bytes.
        gradient_factor: Bytes a worker sends per step / the variables' bytes.
        gradient_top_k: The worker selects its gradient's top-k (CPU).
        read_top_k: The ps selects each read's largest changes (CPU).
    """

    name: str
    read_factor: float
    gradient_factor: float
    gradient_top_k: bool = False
    read_top_k: bool = False


def _ratio(text: str, spelling: str) -> float | None:
    match = _TOP_K.fullmatch(text.strip())
    if not match:
        return None
    try:
        ratio = float(match.group(1) or TOP_K_DEFAULT_RATIO)
    except ValueError:
        ratio = -1.0
    if not 0 < ratio <= 1:
        raise ValueError(
            f"top_k's ratio must be in (0, 1]. Received: {spelling!r}. Write it "
            "like top_k(ratio=0.01)."
        )
    return ratio


def _unknown(spelling: str, part: str, what: str) -> ValueError:
    said = f"Unknown {what} {part!r} in compression {spelling!r}."
    name = part.split("(")[0].strip()
    if what == "gradient compression" and name in COMPRESSORS.names():
        said = (
            f"The planner does not model compression {name!r} (in "
            f"{spelling!r}): it models {SUPPORTED}."
        )
    return ValueError(
        f"{said} Expected GRADIENT[@READ_DTYPE[@READ_CHANGE]]: GRADIENT one of "
        f"{SUPPORTED}; READ_DTYPE bfloat16 or float16; READ_CHANGE "
        "top_k(ratio=R). E.g. 'top_k(ratio=0.01)@bfloat16'."
    )


def parse(spelling: str) -> Wire:
    """The `Wire` of a compression spelling (see the module's docstring).

    Raises:
        ValueError: for a spelling the planner does not model, naming it
            and the spellings it does.
    """
    if not isinstance(spelling, str) or not spelling.strip():
        raise ValueError(
            f"A compression is a string like 'none' or 'top_k(ratio=0.01)'. "
            f"Received: {spelling!r}"
        )
    gradient, _, reads = spelling.partition("@")
    read_dtype, _, read_change = reads.partition("@")
    gradient = gradient.strip()
    top_k = _ratio(gradient, spelling)
    if gradient == "none":
        gradient_factor = 1.0
    elif gradient in _HALF:
        gradient_factor = 0.5
    elif top_k is not None:
        gradient_factor = 2 * top_k  # float32 value + int32 index per kept one
    else:
        raise _unknown(spelling, gradient, "gradient compression")
    read_dtype = read_dtype.strip()
    if read_dtype in ("", "none", "float32"):
        value_bytes = 4
    elif read_dtype in _HALF:
        value_bytes = 2
    else:
        raise _unknown(spelling, read_dtype, "read dtype")
    read_factor = value_bytes / 4
    change = _ratio(read_change, spelling) if read_change.strip() else None
    if read_change.strip() and change is None:
        raise _unknown(spelling, read_change, "read change")
    if change is not None:
        read_factor = change * (value_bytes + 4) / 4  # value + int32 index
    return Wire(
        name=spelling,
        read_factor=read_factor,
        gradient_factor=gradient_factor,
        gradient_top_k=top_k is not None,
        read_top_k=change is not None,
    )


# `read_dtype=`'s names of the 16-bit dtypes.
_READ_DTYPE = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16",
               "float16": "float16"}  # fmt: skip


def strategy_arguments(spelling: str) -> dict[str, str]:
    """The strategy's arguments that send what `spelling` says (`compression`,
    `read_dtype`, `read_compression`; none for `"none"`).

    >>> strategy_arguments("top_k(ratio=0.01)@bfloat16@top_k(ratio=0.05)")
    {'compression': 'top_k(ratio=0.01)', 'read_dtype': 'bfloat16', \
'read_compression': 'top_k(ratio=0.05)'}
    >>> strategy_arguments("none")
    {}
    """
    parse(spelling)  # a ValueError for a spelling the planner does not model
    gradient, _, reads = spelling.partition("@")
    read_dtype, _, read_change = (part.strip() for part in reads.partition("@"))
    arguments = {}
    gradient = gradient.strip()
    if gradient in _HALF:
        arguments["compression"] = _HALF[gradient]
    elif gradient != "none":
        arguments["compression"] = f"top_k(ratio={_ratio(gradient, spelling):g})"
    if read_dtype in _READ_DTYPE:
        arguments["read_dtype"] = _READ_DTYPE[read_dtype]
    if read_change:
        arguments["read_compression"] = (
            f"top_k(ratio={_ratio(read_change, spelling):g})"
        )
    return arguments
