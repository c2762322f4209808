"""Which devices run replicas and which hold parameters, on one host; and the
variables keras_psdist keeps for itself on a device (`device_variable`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_psdist._tf import device_util, resource_variable_ops


def split_host_cpu(count: int) -> list[str]:
    """Splits this process's CPU into `count` logical devices; returns the
    logical CPUs' names.

    Without a GPU, that is how one machine gets several replicas
    (`PSStrategy()` then uses every logical CPU). TensorFlow fixes its devices
    when it initialises (at the first op, or the first strategy), so call this
    first; called again with the same count, it only returns the names.

    Args:
        count: Logical CPU devices, >= 1.

    Raises:
        ValueError: if `count` is not an int >= 1.
        RuntimeError: if TensorFlow has already initialised with another
            number of logical CPUs (both are named, with the fix).

    Examples:

    >>> names = split_host_cpu(len(tf.config.list_logical_devices("CPU")))
    >>> names[0]
    '/device:CPU:0'
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"`count` must be an int >= 1. Received: count={count!r}")
    try:
        tf.config.set_logical_device_configuration(
            tf.config.list_physical_devices("CPU")[0],
            [tf.config.LogicalDeviceConfiguration()] * count,
        )
    except RuntimeError as e:
        existing = tf.config.list_logical_devices("CPU")
        if len(existing) != count:
            raise RuntimeError(
                f"Cannot split the CPU into {count} logical devices: TensorFlow "
                f"has already initialised with {len(existing)}. Split it at the "
                "top of the script, before any TensorFlow op or strategy."
            ) from e
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def local_devices() -> list[str]:
    """Canonical names of every logical device of this process."""
    return [device_util.canonicalize(d.name) for d in tf.config.list_logical_devices()]


def default_compute_devices() -> list[str]:
    """Every local GPU; with none, every logical CPU device (one by default)."""
    gpus = tf.config.list_logical_devices("GPU")
    chosen = gpus or tf.config.list_logical_devices("CPU")
    return [device_util.canonicalize(d.name) for d in chosen]


def default_parameter_devices(compute_devices: Sequence[str]) -> list[str]:
    """The host CPU, or the only GPU when there is exactly one compute GPU.

    This is `CentralStorageStrategy`'s rule: one GPU reads its variables
    fastest from its own memory.
    """
    if len(compute_devices) == 1 and "GPU" in compute_devices[0].upper():
        return [compute_devices[0]]
    return [device_util.canonicalize("/device:CPU:0")]


def canonical_names(devices: Sequence[str] | None, what: str) -> list[str] | None:
    """Canonicalizes user-given device names, without looking them up.

    The strategies call it before connecting to a cluster, whose devices
    this process cannot list yet: a malformed argument is refused at once.

    Args:
        devices: Device names such as `"/gpu:0"`, or `None`.
        what: The argument name, for error messages.

    Returns:
        The canonical names, or `None` when `devices` is `None`.

    Raises:
        ValueError: if `devices` is not a list of non-empty strings, is
            empty, has an unparsable name or names a device twice.

    Examples:

    >>> canonical_names(["/cpu:0"], "devices")
    ['/job:localhost/replica:0/task:0/device:CPU:0']
    >>> canonical_names([0], "devices")
    Traceback (most recent call last):
    ...
    ValueError: `devices` must be a list of device names (strings such as '/gpu:0' or '/cpu:0'). Received: devices=[0], whose item 0 is an int. Pass names, e.g. devices=['/gpu:0'].
    """
    if devices is None:
        return None
    return _checked(devices, what)[1]


def resolve(devices: Sequence[str] | None, what: str) -> list[str] | None:
    """Canonicalizes and checks user-given device names.

    Args:
        devices: Device names such as `"/gpu:0"`, or `None`.
        what: The argument name, for error messages.

    Returns:
        The canonical names, or `None` when `devices` is `None`.

    Raises:
        ValueError: as `canonical_names`, or if a name is of a device this
            process does not have.
    """
    if devices is None:
        return None
    devices, canonical = _checked(devices, what)
    available = local_devices()
    unknown = [d for d, c in zip(devices, canonical, strict=True) if c not in available]
    if unknown:
        raise ValueError(
            f"`{what}` names devices this process does not have: {unknown}. "
            f"Available: {available}. To get several CPU replicas without a GPU, "
            "call tf.config.set_logical_device_configuration before TensorFlow "
            "initializes."
        )
    return canonical


def _checked(devices: Sequence[str], what: str) -> tuple[list, list[str]]:
    """`(devices as a list, their canonical names)`, checked (see
    `canonical_names`)."""
    if isinstance(devices, str):
        raise ValueError(
            f"`{what}` must be a list of device names. Received: {what}={devices!r}."
            f" Did you mean {what}=[{devices!r}]?"
        )
    try:
        devices = list(devices)
    except TypeError:
        raise ValueError(
            f"`{what}` must be a list of device names (strings such as '/gpu:0' "
            f"or '/cpu:0'). Received: {what}={devices!r} ({_kind(devices)}). "
            f"Pass a list, e.g. {what}=['/gpu:0']."
        ) from None
    if not devices:
        raise ValueError(f"`{what}` must name at least one device. Received: {what}=[]")
    for d in devices:
        # TF reads a falsy name (0, "", None) as the default device: refuse it.
        if not isinstance(d, str) or not d.strip():
            index = isinstance(d, int) and not isinstance(d, bool) and d >= 0
            example = f"'/gpu:{d}'" if index else "'/gpu:0'"
            raise ValueError(
                f"`{what}` must be a list of device names (strings such as "
                f"'/gpu:0' or '/cpu:0'). Received: {what}={devices!r}, whose item "
                f"{d!r} is {_kind(d)}. Pass names, e.g. {what}=[{example}]."
            )
    canonical = []
    for d in devices:
        try:
            canonical.append(device_util.canonicalize(d))
        except (ValueError, TypeError, AttributeError) as e:
            raise ValueError(
                f"`{what}` has an unparsable device name {d!r}: {e}. Received: "
                f"{what}={devices!r}. Use names such as '/gpu:0' or "
                "'/job:worker/replica:0/task:1/device:CPU:0'."
            ) from None
    duplicates = sorted({d for d in canonical if canonical.count(d) > 1})
    if duplicates:
        raise ValueError(
            f"`{what}` names a device twice: {duplicates}. Received: {devices}"
        )
    return devices, canonical


def _kind(value) -> str:
    """`"an int"`, `"an empty string"`, `"None"`: what a received value is."""
    if value is None:
        return "None"
    if isinstance(value, str):
        return "an empty string"
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def device_variable(
    initial_value: Any, device: str | None, name: str, **kwargs: Any
) -> tf.Variable:
    """A non-trainable resource variable on `device`, its initial value
    written there before this returns.

    For staging slots on a ps task, a rule's state, compression residuals:
    variables keras_psdist keeps for itself, built as plain resource variables
    (no strategy's creator, ours included, turns them into placed model
    variables).

    One TensorFlow hazard decides how: a variable created eagerly on a *remote*
    device has its initial value written by an op with no outputs, which the
    client sends without waiting for it, while a `tf.function` that writes the
    variable next travels as another request. With other threads of the process
    talking to the same task, the function's write can land first and the
    initial value then overwrites it. Measured on TF 2.21 with
    `tests/scripts/remote_init_race.py` (two threads running remote functions
    alongside, new `[256, 64]` variables written by a function right after they
    are made, then read): 13 of 1,700 reads saw the initial zeros; after a wait
    for the initial value (`VarIsInitializedOp`, a scalar answer, ordered after
    the write), as here: 0 of 1,700. The sync update service met
    it as an update that applied 2/3 of a step: a staging slot made at a join
    kept its zeros although a gradient had been written into it.

    Args:
        initial_value: The initial value, or a function that makes it. From
            inside a `tf.function`'s trace, pass an eager tensor or a
            function: it runs outside the trace, as the variable is made
            (a tensor made in the trace cannot leave it).
        device: Where it lives; `None`: the current device.
        name: Its name.
        **kwargs: More `ResourceVariable` arguments (`shape=`).

    Examples:

    >>> import tensorflow as tf
    >>> v = device_variable(tf.zeros([2]), "/cpu:0", "example")
    >>> v.numpy().tolist()
    [0.0, 0.0]
    """
    with tf.init_scope(), tf.device(device):
        if callable(initial_value):
            initial_value = initial_value()
        variable = resource_variable_ops.ResourceVariable(
            tf.convert_to_tensor(initial_value), trainable=False, name=name, **kwargs
        )
        tf.raw_ops.VarIsInitializedOp(resource=variable.handle).numpy()
    return variable
