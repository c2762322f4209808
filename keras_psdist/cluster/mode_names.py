"""The words that name an execution mode, and the one rule that reads them.

Every place that takes a mode's name reads it through `canonical`:
`PSStrategy(mode=...)`, `keras_psdist.modes.get`, `launch(mode=...)` and
`keras-psdist launch --mode`. The rule is the same everywhere:

- underscores read as hyphens (`in_graph` is `in-graph`);
- the names of before 0.2 (`sync`, `async`) still work, with a
  `DeprecationWarning` naming the current word;
- anything else is a `ValueError` that lists the names expected.

`LAUNCH_MODES` are the two ways `keras-psdist launch` lays out a cluster's
processes; each execution mode (`keras_psdist.modes.MODES`) runs in one of
them, or in one process. Pure Python: the launcher and the command line read
it without TensorFlow.

Examples:

>>> canonical("in_graph", LAUNCH_MODES, "launch")
'in-graph'
>>> canonical("ring", LAUNCH_MODES, "launch")
Traceback (most recent call last):
...
ValueError: Unknown mode 'ring'. Expected one of: in-graph, between-graph.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection

LOCAL = "local"
IN_GRAPH = "in-graph"
BETWEEN_GRAPH = "between-graph"

# How `keras-psdist launch` starts a cluster: in-graph, the script runs once,
# on the chief, and every other task serves; between-graph, it runs on every
# worker task and only the ps tasks serve.
LAUNCH_MODES = (IN_GRAPH, BETWEEN_GRAPH)

# The names before 0.2, still read with a DeprecationWarning.
DEPRECATED = {"sync": IN_GRAPH, "async": BETWEEN_GRAPH}


def normalise(name: object) -> str:
    """`name` with underscores read as hyphens (no other change)."""
    return str(name).replace("_", "-")


def canonical(
    name: object,
    expected: Collection[str],
    owner: str,
    explain: str = "",
    stacklevel: int = 3,
) -> str:
    """The current spelling of the mode `name`, one of `expected`.

    Args:
        name: The name as given.
        expected: The modes the caller takes, in their current spelling.
        owner: Who reads it, for the deprecation warning (`"PSStrategy"`,
            `"launch"`).
        explain: Appended to the error, e.g. what each expected mode does.
        stacklevel: Passed to `warnings.warn`: the frame the warning names.

    Raises:
        ValueError: for a name that is not one of `expected`.
    """
    word = normalise(name)
    if word in DEPRECATED and DEPRECATED[word] in expected:
        new = DEPRECATED[word]
        warnings.warn(
            f"mode={name!r} ({owner}) is now spelled mode={new!r}, the word "
            "`keras-psdist launch --mode` and `PSStrategy(mode=...)` share; the "
            "old spelling will be removed.",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
        return new
    if word not in expected:
        raise ValueError(
            f"Unknown mode {name!r}. Expected one of: {', '.join(expected)}."
            + (f" {explain}" if explain else "")
        )
    return word


def spellings(name: str) -> tuple[str, ...]:
    """Every spelling `canonical` reads as `name`, the current one first."""
    words = [name, name.replace("-", "_")]
    words += [old for old, new in DEPRECATED.items() if new == name]
    return tuple(dict.fromkeys(words))
