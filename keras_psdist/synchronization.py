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

`dense="auto"` chooses per variable from what each would move per step
(`AutoChoice`) and logs why.

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

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf
from absl import logging

PS = "ps"
ALL_REDUCE = "all_reduce"
AUTO = "auto"
SYNCHRONIZERS = (PS, ALL_REDUCE)
DENSE_CHOICES = (PS, ALL_REDUCE, AUTO)

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


def get_chooser(
    dense: Any,
    compute_devices: Sequence[str] = (),
    parameter_devices: Sequence[str] = (),
    plain_mean: bool = True,
    between_graph: bool = False,
) -> ChooserFn:
    """The chooser for `PSStrategy(dense=...)`.

    Args:
        dense: `"ps"` (every variable on a parameter device; the default),
            `"all_reduce"` (dense trainable variables replicated, embedding
            tables on parameter devices), `"auto"` (`AutoChoice`), or a
            callable `(name, shape, dtype) -> "ps" | "all_reduce" | "auto"`
            (`UserChoice`: `"auto"` leaves that variable to `AutoChoice`).
        compute_devices: The replicas' devices (for `"auto"`).
        parameter_devices: The parameter devices (for `"auto"`).
        plain_mean: Whether the strategy's gradients are plainly averaged
            (the `mean` aggregator, no attack, no worker momentum; for
            `"auto"`).
        between_graph: Whether each worker process is its own client (for
            `"auto"`, which then keeps every variable on the ps tasks).

    Raises:
        ValueError: for anything else, naming the choices.
    """
    if callable(dense) and not isinstance(dense, str):
        return UserChoice(
            dense,
            AutoChoice(compute_devices, parameter_devices, plain_mean, between_graph),
        )
    if dense == PS:
        return all_on_ps
    if dense == ALL_REDUCE:
        return dense_all_reduce
    if dense == AUTO:
        return AutoChoice(compute_devices, parameter_devices, plain_mean, between_graph)
    raise ValueError(
        f"Unknown dense={dense!r}. Expected one of: "
        f"{', '.join(repr(c) for c in DENSE_CHOICES)}, or a callable "
        "(name, shape, dtype) -> 'ps' | 'all_reduce' | 'auto'."
    )


def num_tasks(devices: Sequence[str]) -> int:
    """How many tasks (job, replica, task) `devices` belong to."""
    specs = [tf.DeviceSpec.from_string(d) for d in devices]
    return len({(s.job, s.replica, s.task) for s in specs})


def share_memory(devices: Sequence[str]) -> bool:
    """Whether `devices` are all CPUs of one task: one memory, the same cores."""
    return num_tasks(devices) <= 1 and all(
        (tf.DeviceSpec.from_string(d).device_type or "CPU").upper() == "CPU"
        for d in devices
    )


@dataclasses.dataclass(frozen=True)
class Decision:
    """What `AutoChoice` chose for one variable, and why."""

    name: str
    choice: str
    reason: str


class AutoChoice:
    """`dense="auto"`: per variable, the synchronizer that moves fewer bytes
    per step through the busiest link, counted, not timed.

    For a dense variable of B bytes and n replicas:

    - on a parameter device, every replica reads it and sends its gradient:
      2 n B through that device's link each step, one optimizer update;
    - replicated, the gradients are all-reduced: a reduction to one replica
      and a broadcast move 2 (n - 1) B through that replica's link (a ring,
      NCCL's among local GPUs or TensorFlow's collective across 3 or more
      worker tasks, 2 (n - 1) / n B through each), and every replica runs
      the update.

    Hence, in order:

    0. between-graph training (asynchronous workers, sync replicas): `"ps"`.
       Each worker process is its own client; no graph spans the replicas of
       different processes;
    1. a robust rule, an attack or worker momentum: `"ps"`. The aggregator
       needs every replica's gradient on its reduction device either way, so
       replication moves the same bytes and adds n - 1 updates;
    2. an embedding table: `"ps"`. Its replicas read only the rows they look
       up, and send only those rows' gradients;
    3. replicas that share memory with the parameter devices (CPUs of one
       task, no GPU): `"ps"`. No byte crosses a bus or a network, so there is
       nothing to save;
    4. else `"all_reduce"`: fewer bytes, by the counts above.

    Every decision is logged once with its reason and kept in `decisions`.

    Args:
        compute_devices: The replicas' devices.
        parameter_devices: The parameter devices.
        plain_mean: Whether the gradients are plainly averaged.
        between_graph: Whether each worker process is its own client.

    Examples:

    >>> import tensorflow as tf
    >>> workers = ["/job:worker/task:0/cpu:0", "/job:worker/task:1/cpu:0"]
    >>> choose = AutoChoice(workers, ["/job:ps/task:0/cpu:0"], plain_mean=True)
    >>> choose("dense/kernel", tf.TensorShape([1024, 1024]), tf.float32)
    'all_reduce'
    >>> choose("embedding/embeddings", tf.TensorShape([10**6, 64]), tf.float32)
    'ps'
    >>> print(choose.decisions[0].reason)
    fewer bytes through the busiest link (4,194,304 bytes: 16,777,216 per step through a parameter device, 8,388,608 all-reduced among 2 replicas)
    >>> AutoChoice(["/cpu:0", "/cpu:1"], ["/cpu:0"], True)(
    ...     "dense/kernel", tf.TensorShape([8, 8]), tf.float32)
    'ps'
    """

    def __init__(
        self,
        compute_devices: Sequence[str],
        parameter_devices: Sequence[str],
        plain_mean: bool,
        between_graph: bool = False,
    ):
        self.compute_devices = tuple(compute_devices)
        self.parameter_devices = tuple(parameter_devices)
        self.plain_mean = plain_mean
        self.between_graph = between_graph
        self.decisions: list[Decision] = []

    @property
    def shared_memory(self) -> bool:
        """Whether every replica and parameter device is a CPU of one task."""
        return share_memory(self.compute_devices + self.parameter_devices)

    def __call__(self, name: str, shape: tf.TensorShape, dtype: tf.DType) -> str:
        choice, reason = self._choose(name, shape, dtype)
        self.decisions.append(Decision(name, choice, reason))
        logging.info("dense='auto': %s -> %s: %s", name, choice, reason)
        return choice

    def _choose(self, name, shape, dtype) -> tuple[str, str]:
        n = len(self.compute_devices)
        size = (tf.TensorShape(shape).num_elements() or 0) * tf.as_dtype(dtype).size
        counts = (
            f"{size:,} bytes: {2 * n * size:,} per step through a parameter "
            f"device, {2 * max(n - 1, 0) * size:,} all-reduced among {n} replicas"
        )
        if self.between_graph:
            return PS, (
                "between-graph: each worker process is its own client, and no "
                "graph spans the replicas of different processes"
            )
        if not self.plain_mean:
            return PS, (
                "the aggregator is not the plain mean (a robust rule, an attack "
                "or worker momentum): it needs every replica's gradient on its "
                "reduction device either way, so replicating saves no transfer "
                "and adds an update per replica"
            )
        if looks_like_embedding(name):
            return PS, "an embedding table: replicas read only the rows they look up"
        if n <= 1:
            return PS, "one replica: nothing to all-reduce"
        if self.shared_memory:
            return PS, (
                "the replicas share memory with the parameter devices (CPUs of "
                "one task): no transfer to save, and replication would add an "
                f"update per replica ({counts})"
            )
        return ALL_REDUCE, f"fewer bytes through the busiest link ({counts})"


class UserChoice:
    """A user's `dense=` callable, its answers checked; `"auto"` hands the
    variable to `AutoChoice`.

    Args:
        chooser: `(name, shape, dtype) -> "ps" | "all_reduce" | "auto"`.
        auto: The `AutoChoice` for the variables it hands on.

    Examples:

    >>> import tensorflow as tf
    >>> auto = AutoChoice(["/gpu:0", "/gpu:1"], ["/cpu:0"], plain_mean=True)
    >>> choose = UserChoice(
    ...     lambda name, shape, dtype: "ps" if name.startswith("tower") else "auto",
    ...     auto,
    ... )
    >>> choose("tower/kernel", tf.TensorShape([8, 8]), tf.float32)
    'ps'
    >>> choose("head/kernel", tf.TensorShape([8, 8]), tf.float32)
    'all_reduce'
    >>> [d.name for d in choose.decisions]
    ['head/kernel']
    """

    def __init__(self, chooser: ChooserFn, auto: AutoChoice):
        self.chooser = chooser
        self.auto = auto

    @property
    def decisions(self) -> list[Decision]:
        """The decisions of the variables handed to `AutoChoice`."""
        return self.auto.decisions

    def __call__(self, name: str, shape: tf.TensorShape, dtype: tf.DType) -> str:
        choice = self.chooser(name, shape, dtype)
        if choice == AUTO:
            return self.auto(name, shape, dtype)
        if choice not in SYNCHRONIZERS:
            raise ValueError(
                f"The dense= chooser returned {choice!r} for variable {name!r}. "
                f"Expected one of: {', '.join(repr(s) for s in DENSE_CHOICES)}."
            )
        return choice
