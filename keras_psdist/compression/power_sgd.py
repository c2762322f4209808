"""PowerSGD: a rank-r approximation of each replica's gradient, with error
feedback and a warm start.

Each matrix-shaped gradient (a kernel: its first axis by the rest) is sent
as two thin factors, `P` (`rows x r`, orthonormal columns) and `Q`
(`columns x r`), from one step of power iteration started at the previous
step's `Q`; vectors (biases) and matrices too small to gain are sent as they
are.

This is the per-replica form: each replica computes its own factors and the
reduction device multiplies them back, so every rule sees each replica's
own (low-rank) value and PowerSGD composes with every rule. (The form of
Vogels et al. and PyTorch's communication hook all-reduces `P` and `Q`
across the workers instead, which gives only the low-rank mean, never a
replica's value.)

Examples:

>>> import tensorflow as tf
>>> power_sgd = PowerSGD(rank=1)
>>> state = power_sgd.init(tf.TensorSpec([4, 3]))
>>> g = tf.constant([[1.0, 2.0, 3.0]]) * tf.constant([[1.0], [2.0], [0.0], [-1.0]])
>>> payload, state = power_sgd.compress(g, state)
>>> payload.p.shape, payload.q.shape
(TensorShape([4, 1]), TensorShape([3, 1]))
>>> bool(tf.reduce_all(tf.abs(power_sgd.decompress(payload) - g) < 1e-5))  # rank 1
True
"""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import tensorflow as tf

from keras_psdist.compression.base import Compressor, check_floating, check_seed


class LowRank(NamedTuple):
    """What PowerSGD sends for a matrix: `p @ transpose(q)`, reshaped to
    `shape` (int32)."""

    p: tf.Tensor
    q: tf.Tensor
    shape: tf.Tensor


class PowerState(NamedTuple):
    """One replica's PowerSGD state for one variable.

    Attributes:
        residual: What was not sent yet (error feedback), the gradient's shape.
        q: The last step's `Q` factor (`columns x rank`), the warm start.
    """

    residual: tf.Tensor
    q: tf.Tensor


class PowerSGD(Compressor):
    """A rank-`rank` approximation by one power iteration, with error feedback
    and a warm start (`"power_sgd"`).

    For a gradient of shape `[a, b, ...]` seen as the matrix `M` (`a` rows,
    `b * ...` columns), with `x = M + e` and the previous `Q`:
    `P = orthonormalize(x Q)`, `Q <- transpose(x) P`, send `P` and `Q`
    (`(rows + columns) * rank` values), `e <- x - P transpose(Q)`. Variables
    with fewer than two axes, or where `(rows + columns) * rank` is not
    below `rows * columns`, are sent uncompressed (and keep no state).

    Args:
        rank: The approximation's rank r, an int >= 1. Defaults to 1.
        seed: Seeds the first `Q` (standard normal), an int >= 0. Defaults
            to 0.

    Raises:
        ValueError: for a rank below 1 or a negative seed.

    References:
        Vogels, Karimireddy, Jaggi, "PowerSGD: Practical Low-Rank Gradient
        Compression for Distributed Optimization", NeurIPS 2019 (Algorithm
        1: one power iteration, the orthogonalized `P`, warm start and error
        feedback), here per replica instead of over the all-reduced factors
        (see the module docstring); the orthogonalization is a QR
        decomposition.
    """

    error_feedback = True

    def __init__(self, rank: int = 1, seed: int = 0):
        if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or rank < 1:
            raise ValueError(
                "The `rank` of power_sgd must be an int >= 1: the rank of each "
                f"replica's approximation (1 to 4 is usual). Received: rank={rank!r}"
            )
        self.rank = int(rank)
        self.seed = check_seed(seed, "power_sgd")

    def compresses(self, spec: tf.TensorSpec) -> bool:
        """Whether a variable of `spec` is sent as factors."""
        if spec.shape.rank is None or spec.shape.rank < 2:
            return False
        if not spec.shape.is_fully_defined():
            return False
        rows, columns = _matrix_shape(spec.shape)
        return (rows + columns) * self.rank < rows * columns

    def init(self, spec: tf.TensorSpec) -> Any:
        if not self.compresses(spec):
            return ()
        _, columns = _matrix_shape(spec.shape)
        q = tf.random.stateless_normal(
            [columns, self.rank], seed=[self.seed, columns], dtype=spec.dtype
        )
        return PowerState(tf.zeros(spec.shape, spec.dtype), q)

    def compress(
        self,
        value: tf.Tensor,
        state: Any = (),
        step: tf.Tensor | int = 0,
        key: int = 0,
    ) -> tuple[Any, Any]:
        value = tf.convert_to_tensor(value)
        check_floating(self, value)
        if not state:
            raise ValueError(
                f"PowerSGD sends a variable of shape {value.shape} as it is (see "
                "`compresses`): it has no state to compress it with. The "
                "strategy passes such variables through."
            )
        state = PowerState(*state)
        x = value + tf.cast(state.residual, value.dtype)
        rows, columns = _matrix_shape(value.shape)
        matrix = tf.reshape(x, [rows, columns])
        p, _ = tf.linalg.qr(tf.matmul(matrix, tf.cast(state.q, value.dtype)))
        q = tf.matmul(matrix, p, transpose_a=True)
        payload = LowRank(p, q, tf.shape(value))
        return payload, PowerState(x - self.decompress(payload), q)

    def encode(self, value: tf.Tensor, step: Any, key: int) -> LowRank:
        state = self.init(tf.TensorSpec(value.shape, value.dtype))
        return self.compress(value, state, step, key)[0]

    def decompress(self, payload: LowRank) -> tf.Tensor:
        return tf.reshape(
            tf.matmul(payload.p, payload.q, transpose_b=True), payload.shape
        )

    def get_config(self) -> dict[str, Any]:
        return {"rank": self.rank, "seed": self.seed}


def _matrix_shape(shape: tf.TensorShape) -> tuple[int, int]:
    """`(rows, columns)` of a tensor seen as a matrix: its first axis by the
    rest."""
    rows = int(shape[0])
    return rows, int(shape.num_elements() // max(rows, 1))
