"""How each variable is kept in sync: on a parameter device, or replicated.

A `PSStrategy` keeps every variable once, on a parameter device (`"ps"`):
replicas read it there each step and the optimizer updates that one copy.
With `PSStrategy(dense="all_reduce")` the *dense* trainable variables are
instead replicated, one copy per replica on its compute device, as
`MirroredStrategy` keeps them (`"all_reduce"`): replicas read their own copy,
the gradients are reduced across replicas, and every copy takes the same
update. Embedding tables (whose gradients are sparse rows) stay on the
parameter devices, partitioned if a partitioner splits them: the hybrid of
Parallax (Kim et al., EuroSys 2019), AutoDist's strongest strategy.

A chooser is a function `(name, shape, dtype) -> "ps" | "all_reduce"`,
asked once per trainable model variable that no partitioner splits.
Optimizer slots follow their variable; non-trainable variables
(BatchNormalization's moving statistics, the optimizer's `iterations`) and
`ON_READ` variables (metric totals) are never asked: they stay where the
strategy keeps them today.

Examples:

>>> import tensorflow as tf
>>> choose = get_chooser("all_reduce")
>>> choose("dense/kernel", tf.TensorShape([64, 10]), tf.float32)
'all_reduce'
>>> choose("embedding/embeddings", tf.TensorShape([1000, 8]), tf.float32)
'ps'
>>> get_chooser("ps")("dense/kernel", tf.TensorShape([64, 10]), tf.float32)
'ps'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

PS = "ps"
ALL_REDUCE = "all_reduce"
SYNCHRONIZERS = (PS, ALL_REDUCE)
DENSE_CHOICES = (PS, ALL_REDUCE)

ChooserFn = Callable[[str, tf.TensorShape, tf.DType], str]

# The weight names of Keras's `Embedding` layer and of layers built on it
# (keras_hub's token and position embeddings): read by row lookups, so their
# gradients are sparse rows.
EMBEDDING_NAMES = ("embeddings",)


def looks_like_embedding(name: str) -> bool:
    """Whether `name` is an embedding table's (its last path part is one of
    `EMBEDDING_NAMES`, optionally with a `:0` suffix)."""
    last = name.split(":")[0].rsplit("/", 1)[-1]
    return last in EMBEDDING_NAMES


def dense_all_reduce(name: str, shape: tf.TensorShape, dtype: tf.DType) -> str:
    """`"all_reduce"` for every variable but embedding tables (`"ps"`)."""
    return PS if looks_like_embedding(name) else ALL_REDUCE


def all_on_ps(name: str, shape: tf.TensorShape, dtype: tf.DType) -> str:
    """`"ps"` for every variable: the plain parameter-server strategy."""
    return PS


def get_chooser(dense: Any) -> ChooserFn:
    """The chooser for `PSStrategy(dense=...)`.

    Args:
        dense: `"ps"` (every variable on a parameter device; the default),
            `"all_reduce"` (dense trainable variables replicated, embedding
            tables on parameter devices), or a callable
            `(name, shape, dtype) -> "ps" | "all_reduce"`.

    Raises:
        ValueError: for anything else, naming the choices.
    """
    if callable(dense):
        return checked(dense)
    if dense == PS:
        return all_on_ps
    if dense == ALL_REDUCE:
        return dense_all_reduce
    raise ValueError(
        f"Unknown dense={dense!r}. Expected one of: "
        f"{', '.join(repr(c) for c in DENSE_CHOICES)}, or a callable "
        "(name, shape, dtype) -> 'ps' | 'all_reduce'."
    )


def checked(chooser: ChooserFn) -> ChooserFn:
    """`chooser`, with its answer checked."""

    def choose(name: str, shape: tf.TensorShape, dtype: tf.DType) -> str:
        choice = chooser(name, shape, dtype)
        if choice not in SYNCHRONIZERS:
            raise ValueError(
                f"The dense= chooser returned {choice!r} for variable {name!r}. "
                f"Expected one of: {', '.join(repr(s) for s in SYNCHRONIZERS)}."
            )
        return choice

    return choose
