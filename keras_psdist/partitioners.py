"""How many shards a variable is split into: variable partitioners.

A partitioner decides, for a new variable `(shape, dtype)`, into how many
shards along axis 0 a parameter-server strategy splits it
(`PSStrategy(partitioner=kpd.partitioners.MinSize(...))`). Each shard is an
ordinary variable holding a block of consecutive rows, placed on its own
parameter device.

The classes speak TF's partitioner protocol, `partitioner(shape, dtype,
axis=0) -> list[int]` (the number of partitions per axis, as
`tf.distribute.experimental.partitioners.Partitioner` does), and give the same
numbers as TF's `FixedShardsPartitioner`, `MinSizePartitioner` and
`MaxSizePartitioner`. On top of TF they never split a scalar, a variable whose
shape is not fully defined, or one smaller than `min_variable_bytes`.

They are looked up the Keras way: each id (`"fixed"`, `"min_size"`,
`"max_size"`) is written once, in `keras_psdist.families.PARTITIONERS`;
`get`, `serialize`, `deserialize`, `names` and `register` are that
registry's. A partitioner needs its shard count or sizes, so it is named by a
config dict (`{"class_name": "fixed", "config": {"num_shards": 2}}`) or an
instance, never by a bare id.

A partitioned variable's update runs shard by shard, on each shard's
device with the shard's rows of the gradient and of every optimizer slot,
when the optimizer's update is *row-separable*: each row of the new variable
and slots depends only on that row of the old ones and of the gradient (plus
scalars). That is true of SGD, Adam, AdamW, RMSprop, Adagrad, Adadelta,
Adamax, Nadam, Ftrl, Lion and ScheduleFreeAdamW. Adafactor (factored
moments), Lamb (whole-tensor trust ratio) and Muon (orthogonalises whole
matrices) are not: for them a partitioned variable is gathered and updated
whole, which is exact but moves the variable each step (a warning says so
once). A custom optimizer whose `update_step` is elementwise says so with
`register_row_separable`; `is_row_separable` answers for any optimizer.
(Row lookups, `ops.take(table, ids)` as `Embedding` calls it, gather on the
devices that hold the rows: only the touched rows travel.)

Examples:

>>> import keras
>>> is_row_separable(keras.optimizers.Adam()), is_row_separable(keras.optimizers.Lamb())
(True, False)
>>> import tensorflow as tf
>>> partitioner = MinSize(min_shard_bytes=1024, max_shards=4)
>>> partitioner(tf.TensorShape([1000, 8]), tf.float32)  # 32000 bytes
[4, 1]
>>> partitioner(tf.TensorShape([100, 8]), tf.float32)  # 3200 bytes
[4, 1]
>>> partitioner(tf.TensorShape([10, 8]), tf.float32)  # 320 bytes
[1, 1]
>>> num_shards(partitioner, tf.TensorShape([10, 8]), tf.float32)
1
>>> shard_rows(10, 4)
(3, 3, 2, 2)
>>> get({"class_name": "fixed", "config": {"num_shards": 2}})
Fixed(num_shards=2, min_variable_bytes=262144)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.families import PARTITIONERS as REGISTRY
from keras_psdist.registry import check_arguments

PartitionerFn = Callable[[tf.TensorShape, tf.DType], "Sequence[int] | int"]


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_int(name: str, value: Any, minimum: int, hint: str = "") -> int:
    """Returns `value` as an int, or raises if it is not an int >= `minimum`."""
    if not _is_int(value):
        raise ValueError(
            f"`{name}` must be an int >= {minimum}. Received: {name}={value!r} "
            f"of type {type(value).__name__}.{hint}"
        )
    if value < minimum:
        raise ValueError(
            f"`{name}` must be >= {minimum}. Received: {name}={value!r}.{hint}"
        )
    return int(value)


def _element_bytes(dtype: tf.DType, bytes_per_string: int) -> int:
    dtype = tf.as_dtype(dtype).base_dtype
    return bytes_per_string if dtype == tf.string else dtype.size


class Partitioner:
    """Base class: splits a variable along one axis, or leaves it whole.

    `__call__` implements TF's partitioner protocol and handles what every
    partitioner shares: scalars, shapes that are not fully defined, variables
    with no elements or with one row, and variables smaller than
    `min_variable_bytes` are never split (all 1s), and a partitioner never
    asks for more shards than `shape[axis]` rows. Subclasses implement
    `_num_shards(shape, dtype, axis) -> int` for the rest.

    Args:
        min_variable_bytes: Variables smaller than this many bytes are never
            split. Bytes are `num_elements * dtype.size`, with each string
            counted as `bytes_per_string` bytes. Defaults to 0.
        bytes_per_string: Estimated size of one string element. Defaults to 16.

    Examples:

    >>> class Halves(Partitioner):
    ...     def _num_shards(self, shape, dtype, axis):
    ...         return 2
    >>> Halves()(tf.TensorShape([10, 3]), tf.float32)
    [2, 1]
    >>> Halves(min_variable_bytes=1024)(tf.TensorShape([10, 3]), tf.float32)
    [1, 1]
    """

    name = REGISTRY.id_attribute(default="partitioner")

    def __init__(self, min_variable_bytes: int = 0, bytes_per_string: int = 16):
        self.min_variable_bytes = _check_int(
            "min_variable_bytes", min_variable_bytes, 0
        )
        self.bytes_per_string = _check_int("bytes_per_string", bytes_per_string, 1)

    def variable_bytes(self, shape: tf.TensorShape, dtype: tf.DType) -> int:
        """Bytes of a variable of fully defined `shape`, strings estimated."""
        num_elements = tf.TensorShape(shape).num_elements()
        return int(num_elements) * _element_bytes(dtype, self.bytes_per_string)

    def __call__(
        self, shape: tf.TensorShape, dtype: tf.DType, axis: int = 0
    ) -> list[int]:
        """Partitions `shape`: the number of partitions on each axis.

        Args:
            shape: The shape of the variable, a `tf.TensorShape` or a list.
            dtype: The dtype of the variable.
            axis: The axis to split along. Defaults to 0.

        Returns:
            A list with one int per axis, 1 everywhere except at `axis`.

        Raises:
            ValueError: for a shape of unknown rank or an `axis` out of range.
        """
        shape = tf.TensorShape(shape)
        if shape.rank is None:
            raise ValueError(
                f"{type(self).__name__} cannot partition a shape of unknown "
                f"rank. Received: shape={shape}. Give the variable a known "
                "rank, or call `num_shards()`, which does not split it."
            )
        if shape.rank == 0:
            return []
        if not _is_int(axis):
            raise ValueError(f"`axis` must be an int. Received: axis={axis!r}.")
        if not -shape.rank <= axis < shape.rank:
            raise ValueError(
                f"`axis` must be in [{-shape.rank}, {shape.rank}) for a shape "
                f"of rank {shape.rank}. Received: axis={axis}, shape={shape}."
            )
        axis = int(axis) % shape.rank
        partitions = [1] * shape.rank
        if (
            not shape.is_fully_defined()
            or shape[axis] <= 1
            or shape.num_elements() == 0
            or self.variable_bytes(shape, dtype) < self.min_variable_bytes
        ):
            return partitions
        shards = self._num_shards(shape, tf.as_dtype(dtype), axis)
        if not _is_int(shards) or shards < 1:
            raise ValueError(
                f"{type(self).__name__}._num_shards must return an int >= 1. "
                f"Received: {shards!r} for shape={shape}."
            )
        partitions[axis] = min(int(shards), shape[axis])
        return partitions

    def _num_shards(self, shape: tf.TensorShape, dtype: tf.DType, axis: int) -> int:
        """Shards along `axis` for a fully defined shape with >= 2 rows there."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement "
            "`_num_shards(shape, dtype, axis) -> int`."
        )

    # The constructor arguments, in order, for `get_config` and `__repr__`.
    _config_keys: tuple[str, ...] = ("min_variable_bytes", "bytes_per_string")

    def get_config(self) -> dict[str, Any]:
        """The constructor arguments, such that `cls(**config)` rebuilds it."""
        return {key: getattr(self, key) for key in self._config_keys}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Partitioner:
        """Rebuilds a partitioner from `get_config()`.

        Raises:
            ValueError: for a key the class does not take or an argument it
                needs, listing the ones it accepts.
        """
        check_arguments(cls, config)
        return cls(**config)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


class Fixed(Partitioner):
    """Splits every large enough variable into `num_shards` shards.

    The numbers of TF's `FixedShardsPartitioner`: `min(num_shards, rows)`
    shards, plus the `min_variable_bytes` threshold, which TF lacks, so that
    biases and other small variables stay whole.

    Args:
        num_shards: Number of shards. Variables with fewer rows get one shard
            per row.
        min_variable_bytes: Variables smaller than this are not split.
            Defaults to 256 KiB. Pass 0 to split every variable, as TF does.

    Examples:

    >>> Fixed(4)(tf.TensorShape([100000, 8]), tf.float32)
    [4, 1]
    >>> Fixed(4)(tf.TensorShape([8]), tf.float32)  # 32 bytes < 256 KiB
    [1]
    >>> Fixed(4, min_variable_bytes=0)(tf.TensorShape([3]), tf.float32)
    [3]
    """

    _config_keys = ("num_shards", "min_variable_bytes")

    def __init__(self, num_shards: int, min_variable_bytes: int = 256 << 10):
        super().__init__(min_variable_bytes=min_variable_bytes)
        self.num_shards = _check_int("num_shards", num_shards, 1)

    def _num_shards(self, shape: tf.TensorShape, dtype: tf.DType, axis: int) -> int:
        return self.num_shards


class MinSize(Partitioner):
    """Splits a variable into as many shards as its size allows.

    The numbers of TF's `MinSizePartitioner`:
    `max(1, min(rows, max_shards, ceil(variable_bytes / min_shard_bytes)))`.
    Because the count is rounded up, a shard can hold less than
    `min_shard_bytes`: 20 bytes with `min_shard_bytes=8` make 3 shards.

    Args:
        min_shard_bytes: Target minimum bytes per shard. Defaults to 256 KiB.
        max_shards: Upper bound on the number of shards. Defaults to 1, as in
            TF, which never splits: set it to the number of parameter devices.
        bytes_per_string: Estimated size of one string element. Defaults to 16.
        min_variable_bytes: Variables smaller than this are not split.
            Defaults to 0.

    Examples:

    >>> MinSize(min_shard_bytes=4, max_shards=2)(tf.TensorShape([6, 1]), tf.float32)
    [2, 1]
    >>> MinSize(min_shard_bytes=4, max_shards=10)(tf.TensorShape([6, 1]), tf.float32)
    [6, 1]
    >>> MinSize(min_shard_bytes=8, max_shards=10)(tf.TensorShape([5]), tf.float32)
    [3]
    """

    _config_keys = (
        "min_shard_bytes",
        "max_shards",
        "bytes_per_string",
        "min_variable_bytes",
    )

    def __init__(
        self,
        min_shard_bytes: int = 256 << 10,
        max_shards: int = 1,
        bytes_per_string: int = 16,
        min_variable_bytes: int = 0,
    ):
        super().__init__(
            min_variable_bytes=min_variable_bytes, bytes_per_string=bytes_per_string
        )
        self.min_shard_bytes = _check_int("min_shard_bytes", min_shard_bytes, 1)
        self.max_shards = _check_int("max_shards", max_shards, 1)

    def _num_shards(self, shape: tf.TensorShape, dtype: tf.DType, axis: int) -> int:
        # Float division and ceil, as TF's `min_max_variable_partitioner`, so
        # the counts agree even where float rounding matters (huge shapes).
        partitions = self.variable_bytes(shape, dtype) / self.min_shard_bytes
        return max(1, min(shape[axis], self.max_shards, int(math.ceil(partitions))))


class MaxSize(Partitioner):
    """Splits a variable into as few shards as keep each below a size.

    The numbers of TF's `MaxSizePartitioner`: a shard holds
    `max(1, floor(max_shard_bytes / row_bytes))` rows, so the count is
    `ceil(rows / rows_per_shard)`, capped at `max_shards`. A shard exceeds
    `max_shard_bytes` when one row alone does (every row becomes a shard) or
    when the cap is hit.

    Args:
        max_shard_bytes: Maximum bytes per shard, e.g. `(64 << 20) - 1` to stay
            below the protobuf limit.
        max_shards: Upper bound on the number of shards, taking precedence over
            `max_shard_bytes`. Defaults to None: no bound.
        bytes_per_string: Estimated size of one string element. Defaults to 16.
        min_variable_bytes: Variables smaller than this are not split.
            Defaults to 0.

    Examples:

    >>> MaxSize(max_shard_bytes=4)(tf.TensorShape([6, 1]), tf.float32)
    [6, 1]
    >>> MaxSize(max_shard_bytes=4, max_shards=2)(tf.TensorShape([6, 1]), tf.float32)
    [2, 1]
    >>> MaxSize(max_shard_bytes=1024)(tf.TensorShape([6, 1]), tf.float32)
    [1, 1]
    """

    _config_keys = (
        "max_shard_bytes",
        "max_shards",
        "bytes_per_string",
        "min_variable_bytes",
    )

    def __init__(
        self,
        max_shard_bytes: int,
        max_shards: int | None = None,
        bytes_per_string: int = 16,
        min_variable_bytes: int = 0,
    ):
        super().__init__(
            min_variable_bytes=min_variable_bytes, bytes_per_string=bytes_per_string
        )
        self.max_shard_bytes = _check_int("max_shard_bytes", max_shard_bytes, 1)
        self.max_shards = (
            None
            if max_shards is None
            else _check_int("max_shards", max_shards, 1, " Pass None for no bound.")
        )

    def _num_shards(self, shape: tf.TensorShape, dtype: tf.DType, axis: int) -> int:
        rows = shape[axis]
        element_bytes = _element_bytes(dtype, self.bytes_per_string)
        if element_bytes == 0:  # resource, variant: nothing to bound
            return 1
        # The float expressions of TF's `variable_axis_size_partitioner`.
        bytes_per_slice = 1.0 * (shape.num_elements() / rows) * element_bytes
        slices_per_shard = max(1, math.floor(self.max_shard_bytes / bytes_per_slice))
        shards = int(math.ceil(1.0 * rows / slices_per_shard))
        if self.max_shards is not None:
            shards = min(self.max_shards, shards)
        return shards


class CallablePartitioner(Partitioner):
    """Wraps a function `(shape, dtype) -> list[int] | int` as a `Partitioner`.

    `get()` wraps any callable that is not a `Partitioner` in one of these:
    a TF partitioner (`tf.distribute.experimental.partitioners.*`) or a
    function. The function gets a fully defined `tf.TensorShape` of rank >= 1
    and a `tf.DType`, and returns the partitions per axis, or an int for the
    number of shards along `axis`. Scalars, shapes not fully defined and
    variables with a single row are never passed to it.

    Args:
        fn: The partitioning function.

    Examples:

    >>> p = CallablePartitioner(lambda shape, dtype: 2 if shape[0] >= 100 else 1)
    >>> p(tf.TensorShape([1000, 4]), tf.float32)
    [2, 1]
    >>> p(tf.TensorShape([10, 4]), tf.float32)
    [1, 1]
    """

    _config_keys = ("fn",)

    def __init__(self, fn: PartitionerFn):
        super().__init__()
        if not callable(fn):
            raise ValueError(
                "CallablePartitioner needs a callable (shape, dtype) -> "
                f"list[int] | int. Received: fn={fn!r}."
            )
        self.fn = fn

    def _num_shards(self, shape: tf.TensorShape, dtype: tf.DType, axis: int) -> int:
        result = self.fn(shape, dtype)
        if _is_int(result):
            partitions = [1] * shape.rank
            partitions[axis] = result
            result = partitions
        return _check_partitions(self.fn, result, shape, axis)


def _check_partitions(
    partitioner: Any, result: Any, shape: tf.TensorShape, axis: int = 0
) -> int:
    """Returns `result[axis]`, or raises if `result` is not a valid partition."""
    where = f"Partitioner {partitioner!r} returned {result!r} for shape={shape}"
    fix = (
        "A partitioner must return one positive int per axis, all 1 except "
        f"the number of shards at axis {axis}, which must be at most "
        f"shape[{axis}]; e.g. [2] + [1] * (rank - 1)."
    )
    if not isinstance(result, (list, tuple)):
        raise ValueError(f"{where}: expected a list or tuple. {fix}")
    if len(result) != shape.rank:
        raise ValueError(
            f"{where}: {len(result)} entries for a shape of rank {shape.rank}. {fix}"
        )
    for value in result:
        if not _is_int(value):
            raise ValueError(f"{where}: {value!r} is not an int. {fix}")
        if value < 1:
            raise ValueError(f"{where}: {value} is not positive. {fix}")
    others = [i for i, v in enumerate(result) if v != 1 and i != axis]
    if others:
        raise ValueError(
            f"{where}: it splits axis {others[0]}, but variables are split along "
            f"axis {axis} only. {fix}"
        )
    shards = int(result[axis])
    rows = shape[axis]
    if rows is not None and shards > max(rows, 1):
        raise ValueError(
            f"{where}: {shards} shards for {rows} rows. {fix} Clip it with "
            f"min(shards, shape[{axis}])."
        )
    return shards


def get(
    partitioner: str | dict[str, Any] | Partitioner | PartitionerFn | None,
) -> Partitioner | None:
    """Returns the `Partitioner` for `partitioner`.

    Args:
        partitioner: None (no partitioning), a config dict as `serialize`
            makes (`{"class_name": "fixed", "config": {"num_shards": 2}}`), a
            `Partitioner`, or any other callable
            `(shape, dtype) -> list[int] | int`, such as a TF
            `tf.distribute.experimental.partitioners.*` instance, which is
            wrapped in a `CallablePartitioner`.

    Returns:
        None for None, else a `Partitioner`.

    Raises:
        ValueError: for a bare string id (a partitioner needs its sizes: the
            message shows a config dict), an unknown id (naming the valid
            ones), a config dict the class cannot be built from, or anything
            else.

    Examples:

    >>> get(None) is None
    True
    >>> get(Fixed(2))
    Fixed(num_shards=2, min_variable_bytes=262144)
    >>> get({"class_name": "max_size", "config": {"max_shard_bytes": 1024}})
    MaxSize(max_shard_bytes=1024, max_shards=None, bytes_per_string=16, min_variable_bytes=0)
    >>> tfp = tf.distribute.experimental.partitioners
    >>> get(tfp.FixedShardsPartitioner(2))(tf.TensorShape([10, 3]), tf.float32)
    [2, 1]
    """
    if partitioner is None:
        return None
    if isinstance(partitioner, (str, Mapping, Partitioner)) or (
        isinstance(partitioner, type) and issubclass(partitioner, Partitioner)
    ):
        return REGISTRY.get(partitioner)
    if callable(partitioner):
        return CallablePartitioner(partitioner)
    raise ValueError(
        f"Unknown partitioner {partitioner!r} of type "
        f"{type(partitioner).__name__}. Expected one of: None, a config dict "
        "such as {'class_name': 'fixed', 'config': {'num_shards': 2}} (ids: "
        f"{', '.join(REGISTRY.names())}), a keras_psdist.partitioners."
        "Partitioner (Fixed, MinSize, MaxSize), a TF "
        "tf.distribute.experimental.partitioners.* instance, or a callable "
        "(shape, dtype) -> list[int] | int."
    )


def serialize(partitioner: Partitioner) -> dict[str, Any]:
    """Returns `{"class_name": id, "config": {...}}` for `partitioner`.

    Raises:
        ValueError: if its class is not registered (a `CallablePartitioner`
            is not: a function has no config).

    Examples:

    >>> serialize(Fixed(2))
    {'class_name': 'fixed', 'config': {'num_shards': 2, 'min_variable_bytes': 262144}}
    """
    return REGISTRY.serialize(partitioner)


def deserialize(config: dict[str, Any]) -> Partitioner:
    """Inverse of `serialize`.

    Raises:
        ValueError: for a malformed config, an unknown `class_name` (naming
            the valid ones) or an argument the class does not take (naming
            the ones it does).
    """
    return REGISTRY.deserialize(config)


def names() -> list[str]:
    """The registered string ids."""
    return REGISTRY.names()


def register(name: str, cls: type[Partitioner]) -> type[Partitioner]:
    """Registers a user `Partitioner` class under `name`, so a config dict
    with `"class_name": name` finds it.

    Args:
        name: The string id, snake_case.
        cls: A `Partitioner` subclass.

    Returns:
        `cls`, so this can be used as `register("x", MyPartitioner)` inline.

    Raises:
        ValueError: if `name` is taken or not snake_case.
        TypeError: if `cls` is not a `Partitioner` subclass.
    """
    return REGISTRY.register(name, cls)


def num_shards(
    partitioner: Partitioner | PartitionerFn | None,
    shape: tf.TensorShape,
    dtype: tf.DType,
) -> int:
    """The number of shards along axis 0 that `partitioner` asks for.

    Calls the partitioner and checks its answer: one positive int per axis,
    only axis 0 above 1, and no more shards than rows. Scalars and shapes of
    unknown rank are never split.

    Args:
        partitioner: Anything `get()` accepts; None means 1 shard.
        shape: The shape of the variable.
        dtype: The dtype of the variable.

    Returns:
        The number of shards, >= 1.

    Raises:
        ValueError: if the partitioner's answer is not a valid partition.

    Examples:

    >>> num_shards(Fixed(3, min_variable_bytes=0), [10, 4], tf.float32)
    3
    >>> num_shards(None, [10, 4], tf.float32)
    1
    >>> splits_columns = lambda shape, dtype: [1, 2]
    >>> num_shards(splits_columns, [10, 4], tf.float32)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: Partitioner ... returned [1, 2] for shape=(10, 4): it splits axis 1, ...
    """
    partitioner = get(partitioner)
    shape = tf.TensorShape(shape)
    if partitioner is None or shape.rank is None or shape.rank == 0:
        return 1
    return _check_partitions(partitioner, partitioner(shape, dtype), shape)


def shard_rows(num_rows: int, num_shards: int) -> tuple[int, ...]:
    """Rows in each shard when `num_rows` rows are split into `num_shards`.

    TF's `ShardedVariable` convention ("div" partitioning): consecutive
    blocks, the first `num_rows % num_shards` shards one row longer.

    Args:
        num_rows: Rows of the variable (its `shape[0]`), >= 0.
        num_shards: Number of shards, between 1 and `max(num_rows, 1)`.

    Returns:
        A tuple of `num_shards` ints summing to `num_rows`.

    Raises:
        ValueError: for a negative `num_rows`, or a `num_shards` out of range.

    Examples:

    >>> shard_rows(10, 4)
    (3, 3, 2, 2)
    >>> shard_rows(6, 3)
    (2, 2, 2)
    """
    num_rows = _check_int("num_rows", num_rows, 0)
    num_shards = _check_int("num_shards", num_shards, 1)
    if num_shards > max(num_rows, 1):
        raise ValueError(
            f"Cannot split {num_rows} rows into {num_shards} shards: every shard "
            f"needs a row. Received: num_rows={num_rows}, num_shards={num_shards}. "
            "Use at most max(num_rows, 1) shards."
        )
    base, extra = divmod(num_rows, num_shards)
    return tuple(base + 1 if i < extra else base for i in range(num_shards))


# ---------------------------------------------- row-separable optimizers

_row_separable_updates: set = set()
_builtins_registered = False


def register_row_separable(optimizer_class: type) -> type:
    """Declares `optimizer_class.update_step` row-separable (see module doc).

    Partitioned variables are then updated shard by shard, where each shard
    lives, by this optimizer. Usable as a class decorator.

    Args:
        optimizer_class: A `keras.optimizers.Optimizer` subclass.

    Returns:
        `optimizer_class`.

    Raises:
        ValueError: if it is not a Keras optimizer class.

    Examples:

    >>> import keras
    >>> @register_row_separable
    ... class SignSGD(keras.optimizers.Optimizer):
    ...     def update_step(self, gradient, variable, learning_rate):
    ...         variable.assign_sub(learning_rate * keras.ops.sign(gradient))
    >>> is_row_separable(SignSGD(learning_rate=0.1))
    True
    """
    import keras

    if not (
        isinstance(optimizer_class, type)
        and issubclass(optimizer_class, keras.optimizers.Optimizer)
    ):
        raise ValueError(
            "register_row_separable expects a keras.optimizers.Optimizer "
            f"subclass. Received: {optimizer_class!r}."
        )
    _row_separable_updates.add(optimizer_class.update_step)
    return optimizer_class


def _register_keras_builtins() -> None:
    global _builtins_registered
    import keras

    _builtins_registered = True
    for name in (
        "SGD",
        "Adam",
        "AdamW",
        "RMSprop",
        "Adagrad",
        "Adadelta",
        "Adamax",
        "Nadam",
        "Ftrl",
        "Lion",
        "ScheduleFreeAdamW",
    ):
        optimizer_class = getattr(keras.optimizers, name, None)
        if optimizer_class is not None:
            register_row_separable(optimizer_class)


def is_row_separable(optimizer) -> bool:
    """Whether `optimizer`'s `update_step` may run shard by shard.

    Decided by the function, not the class name: a subclass that keeps a
    registered `update_step` (a new learning-rate schedule, say) is
    separable; one that overrides it is not, until registered.
    """
    # Not "while the set is empty": a user's class registered first (before
    # any optimizer was asked about) must not keep Keras's own out.
    if not _builtins_registered:
        _register_keras_builtins()
    return type(optimizer).update_step in _row_separable_updates
