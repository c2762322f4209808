"""Where variables live: placement policies and the placement report.

A policy maps a new variable `(name, shape, dtype)` to one of the parameter
devices. Optimizer slots do not go through the policy: they follow their
variable (`colocate_vars_with`), so a variable's update never crosses devices.

The policies are looked up the Keras way: each id (`"greedy"`,
`"round_robin"`) is written once, in `keras_psdist.families.PLACEMENTS`;
`get`, `serialize`, `deserialize`, `names` and `register` are that
registry's. A policy is built from its config, then bound to the strategy's
parameter devices (`PlacementPolicy.bind`; `get_policy` does both).

Examples:

>>> import tensorflow as tf
>>> policy = get_policy("greedy", ["/cpu:0", "/cpu:1"])
>>> policy("a", tf.TensorShape([1000]), tf.float32)
'/cpu:0'
>>> policy("b", tf.TensorShape([10]), tf.float32)
'/cpu:1'
>>> policy("c", tf.TensorShape([10]), tf.float32)  # cpu:1 holds fewer bytes
'/cpu:1'
>>> serialize(get("round_robin"))
{'class_name': 'round_robin', 'config': {}}
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.families import PLACEMENTS as REGISTRY

PlacementFn = Callable[[str, tf.TensorShape, tf.DType], str]

# The built-in ids `placement=` takes (those of `families.PLACEMENTS`).
POLICIES = tuple(REGISTRY.names())


def variable_bytes(shape: tf.TensorShape, dtype: tf.DType) -> int:
    """Bytes a dense variable of this shape and dtype occupies (0 if unknown)."""
    shape = tf.TensorShape(shape)
    if not shape.is_fully_defined():
        return 0
    return int(shape.num_elements()) * tf.as_dtype(dtype).size


class PlacementPolicy:
    """Base class: a placement function `(name, shape, dtype) -> device` over
    the parameter devices.

    A policy is built from its config without devices (`GreedyPlacement()`,
    `get("greedy")`); the strategy binds it to its parameter devices
    (`bind`), so one policy object can serve several strategies, each with
    its own state. Built with `devices`, it is bound already.

    A subclass takes `devices` as its first constructor argument, then its
    config's (returned by `get_config`), and implements `__call__`. Register
    it (`placement.register("my_policy", MyPolicy)`) to pass it as
    `placement="my_policy"` or as a config dict.

    Args:
        devices: The parameter devices, canonical names. Defaults to `None`:
            the strategy's, when it binds the policy.

    Examples:

    >>> class Last(PlacementPolicy):
    ...     def __call__(self, name, shape, dtype):
    ...         return self.require_devices()[-1]
    >>> Last().bind(["/cpu:0", "/cpu:1"])("v", tf.TensorShape([2]), tf.float32)
    '/cpu:1'
    """

    name = REGISTRY.id_attribute(default="placement")

    def __init__(self, devices: Sequence[str] | None = None):
        self.devices = None if devices is None else tuple(devices)

    def bind(self, devices: Sequence[str]) -> PlacementPolicy:
        """A new policy of this config over `devices`; this one if it was
        built with its devices."""
        if self.devices is not None:
            return self
        return type(self)(devices, **self.get_config())

    def require_devices(self) -> tuple[str, ...]:
        """The devices; raises `ValueError` if the policy is not bound."""
        if self.devices is None:
            raise ValueError(
                f"{type(self).__name__} has no devices to place on. Pass it to a "
                "strategy (placement=...), which binds it to the parameter "
                f"devices, or bind it: {type(self).__name__}().bind(devices). "
                "Received: devices=None."
            )
        return self.devices

    def __call__(self, name: str, shape: tf.TensorShape, dtype: tf.DType) -> str:
        """The device for the new variable `name`."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement "
            "`__call__(name, shape, dtype) -> device`."
        )

    def get_config(self) -> dict[str, Any]:
        """The constructor arguments but `devices` (none for the built-ins)."""
        return {}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


class GreedyPlacement(PlacementPolicy):
    """Puts each variable on the parameter device holding the fewest bytes.

    The load balancer of AutoDist's PS strategy and TF1's
    `GreedyLoadBalancingStrategy`: it keeps the bytes per device even without
    knowing the model in advance. Ties go to the first device in order.

    Args:
        devices: The parameter devices. Defaults to `None`: the strategy's.
    """

    def __init__(self, devices: Sequence[str] | None = None):
        super().__init__(devices)
        self._load = dict.fromkeys(self.devices or (), 0)

    def __call__(self, name: str, shape: tf.TensorShape, dtype: tf.DType) -> str:
        self.require_devices()
        device = min(self._load, key=self._load.__getitem__)
        self._load[device] += max(variable_bytes(shape, dtype), 1)
        return device


class RoundRobinPlacement(PlacementPolicy):
    """Cycles through the parameter devices, as `replica_device_setter` did.

    Args:
        devices: The parameter devices. Defaults to `None`: the strategy's.
    """

    def __init__(self, devices: Sequence[str] | None = None):
        super().__init__(devices)
        self._cycle = itertools.cycle(self.devices or ())

    def __call__(self, name: str, shape: tf.TensorShape, dtype: tf.DType) -> str:
        self.require_devices()
        return next(self._cycle)


def get(
    identifier: str | dict[str, Any] | PlacementPolicy | PlacementFn,
) -> PlacementPolicy | PlacementFn:
    """Returns a policy from a string id, a config dict, an instance or a
    callable (returned as it is).

    Args:
        identifier: `"greedy"`, `"round_robin"` (or a registered id), a
            config dict as `serialize` makes, a `PlacementPolicy`, or a
            callable `(name, shape, dtype) -> device`.

    Raises:
        ValueError: for an unknown id (naming the valid ones), a config dict
            the class cannot be built from, a class instead of an instance,
            or anything else.

    Examples:

    >>> get("greedy")
    GreedyPlacement()
    >>> get({"class_name": "round_robin"})
    RoundRobinPlacement()
    """
    if isinstance(identifier, str) and identifier not in REGISTRY.names():
        raise ValueError(
            f"{REGISTRY.unknown_message(identifier)} Or pass a callable "
            "(name, shape, dtype) -> device."
        )
    if isinstance(identifier, (str, Mapping, PlacementPolicy)) or (
        isinstance(identifier, type) and issubclass(identifier, PlacementPolicy)
    ):
        return REGISTRY.get(identifier)
    if callable(identifier):
        return identifier
    raise ValueError(
        f"Could not interpret placement {identifier!r}. Expected one of: "
        f"{', '.join(REGISTRY.names())} (a string id), a config dict such as "
        "{'class_name': 'greedy'}, a PlacementPolicy, or a callable "
        "(name, shape, dtype) -> device."
    )


def get_policy(
    placement: str | dict[str, Any] | PlacementPolicy | PlacementFn,
    devices: Sequence[str],
) -> PlacementFn:
    """Returns a placement function over `devices`: `get(placement)`, bound.

    Args:
        placement: `"greedy"`, `"round_robin"`, a config dict, a
            `PlacementPolicy`, or a callable `(name, shape, dtype) -> device`
            returning one of `devices` (used as it is).
        devices: The parameter devices, canonical names.

    Raises:
        ValueError: for an unknown policy name, naming the valid ones.
    """
    policy = get(placement)
    if isinstance(policy, PlacementPolicy):
        return policy.bind(devices)
    return policy


def serialize(policy: PlacementPolicy) -> dict[str, Any]:
    """Returns `{"class_name": id, "config": {...}}` for `policy` (its
    devices are the strategy's, not part of the config).

    Raises:
        ValueError: if its class is not registered.
    """
    return REGISTRY.serialize(policy)


def deserialize(config: dict[str, Any]) -> PlacementPolicy:
    """Inverse of `serialize`: an unbound policy.

    Raises:
        ValueError: for a malformed config, an unknown `class_name` (naming
            the valid ones) or an argument the class does not take.
    """
    return REGISTRY.deserialize(config)


def names() -> list[str]:
    """The registered string ids."""
    return REGISTRY.names()


def register(name: str, cls: type[PlacementPolicy]) -> type[PlacementPolicy]:
    """Registers a user `PlacementPolicy` class under `name`, so
    `placement=name` finds it.

    Args:
        name: The string id, snake_case.
        cls: A `PlacementPolicy` subclass.

    Returns:
        `cls`, so this can be used as `register("x", MyPolicy)` inline.

    Raises:
        ValueError: if `name` is taken or not snake_case.
        TypeError: if `cls` is not a `PlacementPolicy` subclass.
    """
    return REGISTRY.register(name, cls)


@dataclasses.dataclass(frozen=True)
class Shard:
    """Which part of a partitioned variable a placed variable holds."""

    variable: str
    index: int
    num_shards: int
    first_row: int


@dataclasses.dataclass(frozen=True)
class PlacedVariable:
    """One row of the placement report: a variable, or one shard of one.

    Attributes:
        name: The variable's name (a shard's ends in `/part_<i>`).
        device: Its parameter device.
        shape: Its shape (a shard's: its rows only).
        dtype: Its dtype name.
        bytes: Its size.
        slot_of: For an optimizer slot, the name of its variable.
        shard: For a shard of a partitioned variable, which one.
        synchronizer: `"ps"` (one copy, on `device`) or `"all_reduce"`
            (one copy per replica; `device` is the first replica's).
        replicas: For a replicated variable, the device of each copy.
    """

    name: str
    device: str
    shape: tuple[int | None, ...]
    dtype: str
    bytes: int
    slot_of: str | None = None
    shard: Shard | None = None
    synchronizer: str = "ps"
    replicas: tuple[str, ...] = ()

    @property
    def devices(self) -> tuple[str, ...]:
        """Every device holding a copy."""
        return self.replicas or (self.device,)


class Placement:
    """The record of where every variable of a strategy was put.

    `strategy.extended.placement` is one of these; `str()` (and `repr()`)
    is a table of the variables, or, while none has been placed, says so and
    how to build the model under the strategy's scope.
    """

    def __init__(self, devices: Sequence[str]):
        self._devices = list(devices)
        self._rows: list[PlacedVariable] = []

    def record(self, row: PlacedVariable) -> None:
        self._rows.append(row)

    @property
    def devices(self) -> list[str]:
        """The parameter devices, in order."""
        return list(self._devices)

    @property
    def variables(self) -> list[PlacedVariable]:
        """Every placed variable, in creation order."""
        return list(self._rows)

    def device_of(self, name: str) -> str:
        """The device of the variable named `name` (first match).

        Raises:
            KeyError: if no variable of that name was placed, or if it is
                partitioned (its shards have devices: see `shards_of`).
        """
        name = _without_output_index(name)
        for row in self._rows:
            if row.name == name:
                return row.device
        shards = self.shards_of(name)
        if shards:
            raise KeyError(
                f"Variable {name!r} is partitioned into {len(shards)} shards, "
                f"on {[r.device for r in shards]}. Use `shards_of({name!r})` "
                "for each shard's device."
            )
        raise KeyError(
            f"No variable named {name!r} was placed. Known: "
            f"{', '.join(r.name for r in self._rows[:20])}"
        )

    def synchronizer_of(self, name: str) -> str:
        """`"ps"` or `"all_reduce"`: how the variable named `name` is kept in
        sync (see `keras_psdist.dense_choice`).

        Raises:
            KeyError: if no variable of that name was placed.
        """
        name = _without_output_index(name)
        for row in self._rows:
            if row.name == name or (
                row.shard is not None and row.shard.variable == name
            ):
                return row.synchronizer
        raise KeyError(
            f"No variable named {name!r} was placed. Known: "
            f"{', '.join(r.name for r in self._rows[:20])}"
        )

    def replicated(self) -> list[PlacedVariable]:
        """The variables (slots included) kept on every replica."""
        return [r for r in self._rows if r.synchronizer != "ps"]

    def shards_of(self, name: str) -> list[PlacedVariable]:
        """The shards of partitioned variable `name`, in row order ([] if it
        is not partitioned)."""
        name = _without_output_index(name)
        return [
            r for r in self._rows if r.shard is not None and r.shard.variable == name
        ]

    def bytes_per_device(self) -> dict[str, int]:
        """Total bytes of variables (slots included) on each device; a
        replicated variable counts on each replica's device."""
        load = dict.fromkeys(self._devices, 0)
        for row in self._rows:
            for device in row.devices:
                load[device] = load.get(device, 0) + row.bytes
        return load

    def __len__(self) -> int:
        return len(self._rows)

    def __str__(self) -> str:
        if not self._rows:
            return _NOTHING_PLACED.format(devices=", ".join(self._devices))
        rows = [r for r in self._rows if r.slot_of is None]
        slots = len(self._rows) - len(rows)
        width = max([len(r.name) for r in rows] + [8])
        lines = [f"{'variable':<{width}}  {'shape':<16} {'bytes':>10}  device"]
        for r in rows:
            shape = "x".join("?" if d is None else str(d) for d in r.shape) or "()"
            device = r.device
            if r.replicas:
                count = len(r.replicas)
                device = (
                    f"all-reduced, one copy on each of {count} replicas"
                    if count != 1
                    else "all-reduced, one copy on the one replica"
                )
            if r.shard is not None:
                device += (
                    f"  (shard {r.shard.index + 1}/{r.shard.num_shards}, rows "
                    f"{r.shard.first_row}..{r.shard.first_row + r.shape[0] - 1})"
                )
            lines.append(f"{r.name:<{width}}  {shape:<16} {r.bytes:>10}  {device}")
        lines.append(
            f"({slots} optimizer slot variables colocated with their variables)"
        )
        kind = "" if self.replicated() else " parameter"
        lines.append(f"bytes per{kind} device (slots included):")
        for device, nbytes in self.bytes_per_device().items():
            lines.append(f"  {device}: {nbytes}")
        return "\n".join(lines)

    __repr__ = __str__  # The table, also where a REPL echoes the object.


# Empty is never what the user meant to see: the model went elsewhere.
_NOTHING_PLACED = """\
No variable has been created under this strategy's scope, so nothing is placed
on its parameter devices ({devices}). A model built outside
`with strategy.scope():` belongs to no strategy: `fit` trains it on one device.
Build and compile the model inside the scope:
    with strategy.scope():
        model = build_model()
        model.compile(...)"""


def _without_output_index(name: str) -> str:
    """`"dense/kernel"` for `"dense/kernel:0"` (a TF variable's `name`)."""
    base, _, index = name.rpartition(":")
    return base if base and index.isdigit() else name
