"""Casts: a replica sends its gradient in half precision (`fp16`, `bf16`), or
as it is (`none`).

Stateless, as Horovod's `Compression.fp16`: no error feedback, the rounding
error of each step is dropped. `fp16` keeps 11 significant bits over a range
of about 6e-8 to 65504 (a larger coordinate becomes `inf`, a smaller one
0); `bf16` keeps float32's range with 8 significant bits. Half the bytes of
float32 either way.

Examples:

>>> import tensorflow as tf
>>> fp16 = FP16()
>>> payload, _ = fp16.compress(tf.constant([1.0, 1e-3, 3.14159]))
>>> payload.value.dtype.name
'float16'
>>> [round(v, 4) for v in fp16.decompress(payload).numpy().tolist()]
[1.0, 0.001, 3.1406]
"""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from keras_psdist.compression.base import Compressor


class Cast(NamedTuple):
    """What a cast sends.

    Attributes:
        value: The value, in the sent dtype.
        dtype: The gradient's dtype, which `decompress` restores.
    """

    value: tf.Tensor
    dtype: tf.DType


class NoCompression(Compressor):
    """The gradient as it is (`"none"`): the same as no `compression=`."""

    # The dtype sent, or None: the gradient's own.
    sent_dtype: tf.DType | None = None

    def encode(self, value: tf.Tensor, step: Any, key: int) -> Cast:
        sent = value if self.sent_dtype is None else tf.cast(value, self.sent_dtype)
        return Cast(sent, value.dtype)

    def decompress(self, payload: Cast) -> tf.Tensor:
        return tf.cast(payload.value, payload.dtype)


class FP16(NoCompression):
    """The gradient in IEEE half precision (`"fp16"`), as Horovod's
    `Compression.fp16`.

    A coordinate beyond 65504 in magnitude arrives as `inf`; with gradients
    that large (no gradient clipping, a loss not averaged), use `BF16`.

    References:
        Horovod, `horovod.tensorflow.compression.FP16Compressor`: cast to
        float16 before the all-reduce, back after; no error feedback.
    """

    sent_dtype = tf.float16


class BF16(NoCompression):
    """The gradient in bfloat16 (`"bf16"`): float32's range, 8 significant bits.

    References:
        As `FP16`, with the bfloat16 format (Kalamkar et al., "A Study of
        BFLOAT16 for Deep Learning Training", 2019).
    """

    sent_dtype = tf.bfloat16
