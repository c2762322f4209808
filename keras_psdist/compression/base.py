"""The compressor interface: what a replica sends instead of its gradient.

A `Compressor` has two halves that run on different devices:

- `compress(value, state, step, key) -> (payload, new_state)` runs on the
  replica's own device. The payload is what travels to the reduction
  device (indices and values, a half-precision tensor, packed signs and a
  scale); `state` is the replica's error-feedback residual for this
  variable, `()` for a compressor without one.
- `decompress(payload) -> value` runs on the reduction device and gives the
  dense value, of the gradient's shape and dtype, that the rest of the
  gradient path sees.

Error feedback (Seide et al. 2014; Karimireddy et al., "Error Feedback
Fixes SignSGD and other Gradient Compression Schemes", ICML 2019): a
replica adds what it has not sent yet to its next gradient and keeps what
it does not send this time,

    x = g + e;   send C(x);   e <- x - C(x)

so over the steps every coordinate is sent eventually: the sum of what was
sent plus the residual is the sum of the gradients.

A compressor is built from its config alone (`get_config`, as every family
of `keras_psdist.families`); `init(spec)` makes one replica's state for one
variable.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import tensorflow as tf

from keras_psdist.families import COMPRESSORS


class Compressor:
    """Base class of the compressors (see the module docstring).

    A subclass implements `encode` (what is sent for a value, on the
    replica's device) and `decompress`; with `error_feedback = True` the
    base class keeps the residual: `compress` adds it before `encode` and
    returns the new one, `x - decompress(payload)` unless the subclass has
    a cheaper `residual`.

    Attributes:
        name: The compressor's id in `keras_psdist.families.COMPRESSORS`.
        error_feedback: Whether each replica keeps a residual per variable.
        uses_step: Whether what is sent depends on the step (random-k's
            coordinates): the gradient path then keeps a step counter.
    """

    name = COMPRESSORS.id_attribute("compressor")
    error_feedback: bool = False
    uses_step: bool = False

    @property
    def stateful(self) -> bool:
        """Whether the compressor keeps state between steps (a residual or
        the step)."""
        return self.error_feedback or self.uses_step

    def init(self, spec: tf.TensorSpec) -> Any:
        """One replica's state for one variable: a zero residual, or `()`
        (a nest of tensors for a compressor that keeps more, as PowerSGD).

        Args:
            spec: The spec of a replica's value for the variable (fully
                defined: a residual needs a shape).
        """
        if not self.error_feedback:
            return ()
        return tf.zeros(spec.shape, spec.dtype)

    def compress(
        self,
        value: tf.Tensor,
        state: Any = (),
        step: tf.Tensor | int = 0,
        key: int = 0,
    ) -> tuple[Any, Any]:
        """What a replica sends for `value`, and its next state.

        Args:
            value: A replica's dense floating-point gradient (true scale).
            state: Its residual for this variable (`init`'s, or the previous
                step's), `()` without error feedback.
            step: The training step (an int64 scalar), for compressors whose
                choice changes every step.
            key: The variable's index in the step, so that each variable
                gets its own choice.

        Returns:
            `(payload, new_state)`.

        Raises:
            ValueError: for a value that is not floating-point.
        """
        value = tf.convert_to_tensor(value)
        check_floating(self, value)
        if not self.error_feedback:
            return self.encode(value, step, key), state
        x = value + tf.cast(state, value.dtype)
        payload = self.encode(x, step, key)
        return payload, self.residual(x, payload)

    def encode(self, value: tf.Tensor, step: tf.Tensor | int, key: int) -> Any:
        """The payload for `value` (with the residual added, under error
        feedback). See `compress` for the arguments."""
        raise NotImplementedError(f"{type(self).__name__} must implement `encode`.")

    def decompress(self, payload: Any) -> tf.Tensor:
        """The dense value a payload stands for, on the reduction device."""
        raise NotImplementedError(f"{type(self).__name__} must implement `decompress`.")

    def residual(self, value: tf.Tensor, payload: Any) -> tf.Tensor:
        """What was not sent of `value`: `value - decompress(payload)`."""
        return value - self.decompress(payload)

    def get_config(self) -> dict[str, Any]:
        """The constructor arguments: `type(self)(**get_config())` is an equal
        compressor."""
        return {}

    def __repr__(self) -> str:
        arguments = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({arguments})"


def check_floating(compressor: Compressor, value: tf.Tensor) -> None:
    """Raises `ValueError` unless `value` is floating-point."""
    if not value.dtype.is_floating:
        raise ValueError(
            f"The compressor {compressor.name!r} compresses floating-point "
            f"gradients. Received: a value of dtype {value.dtype.name} and shape "
            f"{value.shape}. Integer values are not gradients: reduce them "
            "without compression (the strategy passes them through as they are)."
        )


def check_ratio(ratio: Any, compressor: str) -> float:
    """`ratio` as a float in `(0, 1]`, else a `ValueError` naming the fix."""
    if (
        isinstance(ratio, bool)
        or not isinstance(ratio, numbers.Real)
        or not math.isfinite(ratio)
        or not 0 < ratio <= 1
    ):
        raise ValueError(
            f"The `ratio` of {compressor} must be a number in (0, 1]: the "
            "fraction of each gradient's coordinates a replica sends (0.01 "
            f"sends 1%). Received: ratio={ratio!r}"
        )
    return float(ratio)


def check_seed(seed: Any, compressor: str) -> int:
    """`seed` as an int >= 0, else a `ValueError` naming the fix."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(
            f"The `seed` of {compressor} must be an int >= 0 (every replica "
            f"derives its coordinates from it). Received: seed={seed!r}"
        )
    return int(seed)


def kept_count(ratio: float, value: tf.Tensor) -> int | tf.Tensor:
    """How many of `value`'s coordinates a ratio keeps: `max(1, ceil(ratio *
    size))`, a Python int when the size is known."""
    size = value.shape.num_elements()
    if size is not None:
        return max(1, min(size, math.ceil(ratio * size)))
    size = tf.size(value, out_type=tf.int64)
    k = tf.cast(tf.math.ceil(ratio * tf.cast(size, tf.float64)), tf.int64)
    return tf.cast(tf.clip_by_value(k, 1, tf.maximum(size, 1)), tf.int32)


def scatter(indices: tf.Tensor, values: tf.Tensor, shape: tf.Tensor) -> tf.Tensor:
    """A dense tensor of `shape`, `values` at the flat `indices`, zeros
    elsewhere."""
    size = tf.reduce_prod(tf.cast(shape, tf.int64))
    flat = tf.scatter_nd(
        tf.cast(indices, tf.int64)[:, None], values, tf.reshape(size, [1])
    )
    return tf.reshape(flat, shape)


def zero_at(value: tf.Tensor, indices: tf.Tensor) -> tf.Tensor:
    """`value` with its flat `indices` zeroed (what a sparsifier keeps)."""
    flat = tf.reshape(value, [-1])
    indices = tf.cast(indices, tf.int64)[:, None]
    kept = tf.tensor_scatter_nd_update(
        flat, indices, tf.zeros(tf.shape(indices)[:1], value.dtype)
    )
    return tf.reshape(kept, tf.shape(value))
