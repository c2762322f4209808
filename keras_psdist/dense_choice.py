"""Which trainable variables are replicated: `PSStrategy(dense=...)`.

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

A dense choice is a `DenseChoice`, or any function
`(name, shape, dtype) -> "ps" | "all_reduce" | "auto"`, asked once per
trainable model variable that no partitioner splits. Optimizer slots follow
their variable; non-trainable variables (BatchNormalization's moving
statistics, the optimizer's `iterations`) and `ON_READ` variables (metric
totals) are never asked: they stay where the strategy keeps them today.

The family is looked up the Keras way: each id (`"ps"`, `"all_reduce"`,
`"auto"`) is written once, in `keras_psdist.families.DENSE_CHOICES`; `get`,
`serialize`, `deserialize`, `names` and `register` are that registry's. A
choice is built from its config, then bound to the run's devices
(`bind`), as an aggregator is bound to its replica count.

This module was `keras_psdist.synchronization` before 0.2 (that name still
works, with a `DeprecationWarning`).

Examples:

>>> import tensorflow as tf
>>> choose = get_chooser("all_reduce")
>>> choose("dense/kernel", tf.TensorShape([64, 10]), tf.float32)
'all_reduce'
>>> choose("embedding/embeddings", tf.TensorShape([1000, 8]), tf.float32)
'ps'
>>> get_chooser("ps")("dense/kernel", tf.TensorShape([64, 10]), tf.float32)
'ps'
>>> serialize(get("auto"))
{'class_name': 'auto', 'config': {}}
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tensorflow as tf
from absl import logging

from keras_psdist.families import DENSE_CHOICES as REGISTRY

# What a chooser answers for one variable: its synchronizer, or (a user's
# chooser) "auto" to hand the variable to `AutoChoice`.
PS = "ps"
ALL_REDUCE = "all_reduce"
AUTO = "auto"
SYNCHRONIZERS = (PS, ALL_REDUCE)
ANSWERS = (PS, ALL_REDUCE, AUTO)
# The built-in ids `dense=` takes (those of `families.DENSE_CHOICES`).
DENSE_CHOICES = tuple(REGISTRY.names())

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


class DenseChoice:
    """Base class: decides per variable `"ps"` or `"all_reduce"`.

    A subclass implements `__call__(name, shape, dtype)`; one that needs the
    run's devices overrides `bind`. Register it
    (`dense_choice.register("my_choice", MyChoice)`) to pass it as
    `dense="my_choice"` or as a config dict.

    Examples:

    >>> class TowersOnPS(DenseChoice):
    ...     def __call__(self, name, shape, dtype):
    ...         return "ps" if name.startswith("tower") else "all_reduce"
    >>> TowersOnPS()("tower/kernel", tf.TensorShape([2]), tf.float32)
    'ps'
    """

    name = REGISTRY.id_attribute(default="dense_choice")

    def __call__(self, name: str, shape: tf.TensorShape, dtype: tf.DType) -> str:
        """`"ps"` or `"all_reduce"` for the variable `name`."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement "
            "`__call__(name, shape, dtype) -> 'ps' | 'all_reduce'`."
        )

    def bind(
        self,
        compute_devices: Sequence[str] = (),
        parameter_devices: Sequence[str] = (),
        plain_mean: bool = True,
        between_graph: bool = False,
    ) -> DenseChoice:
        """The choice for one run; this one, unless it needs the run.

        Args:
            compute_devices: The replicas' devices.
            parameter_devices: The parameter devices.
            plain_mean: Whether the gradients are plainly averaged (the
                `mean` aggregator, no attack, no worker momentum).
            between_graph: Whether each worker process is its own client.
        """
        return self

    def get_config(self) -> dict[str, Any]:
        """The constructor arguments (none for the built-ins)."""
        return {}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


class AllOnPS(DenseChoice):
    """`dense="ps"`: every variable on a parameter device, the plain
    parameter-server strategy."""

    def __call__(self, name: str, shape: tf.TensorShape, dtype: tf.DType) -> str:
        return PS


class DenseAllReduce(DenseChoice):
    """`dense="all_reduce"`: every variable replicated but embedding tables
    (`looks_like_embedding`), which stay on the parameter devices."""

    def __call__(self, name: str, shape: tf.TensorShape, dtype: tf.DType) -> str:
        return PS if looks_like_embedding(name) else ALL_REDUCE


# The two fixed choices as functions `(name, shape, dtype) -> str`.
all_on_ps = AllOnPS()
dense_all_reduce = DenseAllReduce()


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


class AutoChoice(DenseChoice):
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
        compute_devices: The replicas' devices. Defaults to `None`: the
            strategy's, when it binds the choice (`bind`).
        parameter_devices: The parameter devices. Defaults to `None`, as
            `compute_devices`.
        plain_mean: Whether the gradients are plainly averaged. Defaults to
            True.
        between_graph: Whether each worker process is its own client.
            Defaults to False.

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
        compute_devices: Sequence[str] | None = None,
        parameter_devices: Sequence[str] | None = None,
        plain_mean: bool = True,
        between_graph: bool = False,
    ):
        self.compute_devices = (
            None if compute_devices is None else tuple(compute_devices)
        )
        self.parameter_devices = (
            None if parameter_devices is None else tuple(parameter_devices)
        )
        self.plain_mean = plain_mean
        self.between_graph = between_graph
        self.decisions: list[Decision] = []

    def bind(
        self,
        compute_devices: Sequence[str] = (),
        parameter_devices: Sequence[str] = (),
        plain_mean: bool = True,
        between_graph: bool = False,
    ) -> AutoChoice:
        """A new `AutoChoice` over the run's devices; this one if it was
        built with its devices."""
        if self.compute_devices is not None:
            return self
        return AutoChoice(compute_devices, parameter_devices, plain_mean, between_graph)

    @property
    def shared_memory(self) -> bool:
        """Whether every replica and parameter device is a CPU of one task."""
        return share_memory(self._devices("compute") + self._devices("parameter"))

    def __call__(self, name: str, shape: tf.TensorShape, dtype: tf.DType) -> str:
        choice, reason = self._choose(name, shape, dtype)
        self.decisions.append(Decision(name, choice, reason))
        logging.info("dense='auto': %s -> %s: %s", name, choice, reason)
        return choice

    def _devices(self, kind: str) -> tuple[str, ...]:
        devices = getattr(self, f"{kind}_devices")
        if devices is None:
            raise ValueError(
                "This AutoChoice has no devices to count bytes over. Pass it "
                "to a strategy (dense=AutoChoice() or dense='auto'), which "
                "binds it to the run's devices, or build it with them: "
                "AutoChoice(compute_devices, parameter_devices). Received: "
                f"{kind}_devices=None."
            )
        return devices

    def _choose(self, name, shape, dtype) -> tuple[str, str]:
        n = len(self._devices("compute"))
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


class UserChoice(DenseChoice):
    """A user's `dense=` callable, its answers checked; `"auto"` hands the
    variable to `AutoChoice`.

    Args:
        chooser: `(name, shape, dtype) -> "ps" | "all_reduce" | "auto"`.
        auto: The `AutoChoice` for the variables it hands on. Defaults to
            `None`: the strategy's, when it binds the choice.

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

    def __init__(self, chooser: ChooserFn, auto: AutoChoice | None = None):
        self.chooser = chooser
        self.auto = AutoChoice() if auto is None else auto

    def bind(
        self,
        compute_devices: Sequence[str] = (),
        parameter_devices: Sequence[str] = (),
        plain_mean: bool = True,
        between_graph: bool = False,
    ) -> UserChoice:
        """The same chooser, its `"auto"` answers bound to the run."""
        auto = self.auto.bind(
            compute_devices, parameter_devices, plain_mean, between_graph
        )
        return self if auto is self.auto else UserChoice(self.chooser, auto)

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
                f"Expected one of: {', '.join(repr(s) for s in ANSWERS)}."
            )
        return choice

    def __repr__(self) -> str:
        return f"UserChoice({self.chooser!r})"


def get(identifier: str | dict[str, Any] | DenseChoice | ChooserFn) -> DenseChoice:
    """Returns a dense choice from a string id, a config dict, an instance
    or a callable.

    Args:
        identifier: `"ps"`, `"all_reduce"`, `"auto"` (or a registered id), a
            config dict as `serialize` makes, a `DenseChoice`, or a callable
            `(name, shape, dtype) -> "ps" | "all_reduce" | "auto"` (wrapped
            in a `UserChoice`).

    Raises:
        ValueError: for an unknown id (naming the valid ones), a config dict
            the class cannot be built from, a class instead of an instance,
            or anything else.

    Examples:

    >>> get("all_reduce")
    DenseAllReduce()
    >>> get({"class_name": "auto"})
    AutoChoice()
    """
    if isinstance(identifier, (DenseChoice, Mapping)) or (
        isinstance(identifier, type) and issubclass(identifier, DenseChoice)
    ):
        return REGISTRY.get(identifier)
    if isinstance(identifier, str) and identifier in REGISTRY.names():
        return REGISTRY.get(identifier)
    if callable(identifier) and not isinstance(identifier, str):
        return UserChoice(identifier)
    # Worded as the strategy's argument reads: `dense=...`.
    close = difflib.get_close_matches(str(identifier), REGISTRY.names(), n=1)
    raise ValueError(
        f"Unknown dense={identifier!r}. Expected one of: "
        f"{', '.join(repr(c) for c in REGISTRY.names())}, a config dict such "
        "as {'class_name': 'auto'}, or a callable "
        "(name, shape, dtype) -> 'ps' | 'all_reduce' | 'auto'."
        + (f" Did you mean {close[0]!r}?" if close else "")
    )


def get_chooser(
    dense: Any,
    compute_devices: Sequence[str] = (),
    parameter_devices: Sequence[str] = (),
    plain_mean: bool = True,
    between_graph: bool = False,
) -> DenseChoice:
    """The chooser for `PSStrategy(dense=...)`: `get(dense)`, bound to the run.

    Args:
        dense: `"ps"` (every variable on a parameter device; the default),
            `"all_reduce"` (dense trainable variables replicated, embedding
            tables on parameter devices), `"auto"` (`AutoChoice`), a config
            dict, a `DenseChoice`, or a callable
            `(name, shape, dtype) -> "ps" | "all_reduce" | "auto"`
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
    return get(dense).bind(
        compute_devices, parameter_devices, plain_mean, between_graph
    )


def serialize(choice: DenseChoice) -> dict[str, Any]:
    """Returns `{"class_name": id, "config": {...}}` for `choice`.

    Raises:
        ValueError: if its class is not registered (a `UserChoice` is not:
            a function has no config).
    """
    return REGISTRY.serialize(choice)


def deserialize(config: dict[str, Any]) -> DenseChoice:
    """Inverse of `serialize`.

    Raises:
        ValueError: for a malformed config, an unknown `class_name` (naming
            the valid ones) or an argument the class does not take.
    """
    return REGISTRY.deserialize(config)


def names() -> list[str]:
    """The registered string ids."""
    return REGISTRY.names()


def register(name: str, cls: type[DenseChoice]) -> type[DenseChoice]:
    """Registers a user `DenseChoice` class under `name`, so `dense=name`
    finds it.

    Args:
        name: The string id, snake_case.
        cls: A `DenseChoice` subclass.

    Returns:
        `cls`, so this can be used as `register("x", MyChoice)` inline.

    Raises:
        ValueError: if `name` is taken or not snake_case.
        TypeError: if `cls` is not a `DenseChoice` subclass.
    """
    return REGISTRY.register(name, cls)
