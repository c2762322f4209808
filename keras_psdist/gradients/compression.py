"""The compression stage: each replica's value, compressed on its own device,
decompressed where the path runs.

It stands after worker momentum (a replica compresses the momentum it
sends) and before the attack (which acts on what a faulty replica sends:
it replaces the decompressed value by anything it likes, the strongest
attacker, as it replaces momenta).

For replica r and variable v, on `devices[r]`:

    x = value + residual[v][r];  payload = C(x);  residual[v][r] <- x - C(x)

then, on the reduction device (where the path runs), `decompress(payload)`.
So what travels from a replica's device to the reduction device is the
payload; the residuals live and are updated on the replicas' devices
(`state_devices`), and are training state (checkpointed with the rest of
`strategy.extended.training_state`).

What passes uncompressed: sparse gradients (`IndexedSlices`, from embedding
lookups: their rows are already what a replica touched), values that are not
floating-point, empty ones, for a compressor with error feedback values
whose shape is known only at run time (a residual needs a shape), and those
a compressor keeps no state for (PowerSGD's vectors).
A replica without data in a step (a partial last batch) keeps its residual;
what it sends is masked by the rule, as without compression.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import tensorflow as tf
from absl import logging

from keras_psdist.aggregators import sparse as sparse_lib
from keras_psdist.aggregators.base import mask_replicas_without_data
from keras_psdist.compression.base import Compressor, scatter
from keras_psdist.compression.random_k import RandomK
from keras_psdist.gradients.stage import Downstream, Replicas, Stage

ReduceOp = tf.distribute.ReduceOp


class CompressionState(NamedTuple):
    """The stage's state.

    Attributes:
        step: The step counter (int64 scalar) of a compressor whose choice
            changes every step (random-k), else `()`.
        residuals: `residuals[v][r]`, replica r's state for variable v
            (its residual; with PowerSGD, a `PowerState`); `()` for a
            variable without one.
    """

    step: Any
    residuals: tuple


class Compression(Stage):
    """`compressor` applied to every replica's value (see the module docstring).

    Args:
        compressor: A `keras_psdist.compression.Compressor`.
        num_replicas: The replica count n (one residual per replica).
        devices: The replicas' devices: replica r compresses, and keeps its
            residuals, on `devices[r]`. Defaults to none: where the path
            runs (no bytes saved; for tests and simulations).
        kept_only: With random-k, hand the stages after this one each
            replica's values at the kept coordinates only (`k` of them, the
            same on every replica) instead of the decompressed tensor; the
            rule's result is put back at them. For stages that keep no
            state per coordinate (`gradient_path` decides); with any other
            compressor it does nothing.

    Attributes:
        compressor: The compressor.
        devices: As given.
    """

    def __init__(
        self,
        compressor: Compressor,
        num_replicas: int,
        devices: Sequence[str] | None = None,
        kept_only: bool = False,
        shared_coordinates: bool = False,
    ):
        self.compressor = compressor
        self.num_replicas = num_replicas
        self.devices = None if devices is None else tuple(devices)
        # Top-k with the leader's coordinates: every replica sends those the
        # leader of the step chose (its turn comes with the step counter).
        self.leader_chooses = shared_coordinates and num_replicas > 1
        # Random-k, or top-k with the leader's coordinates: hand the stages
        # after this one the kept coordinates only (see `KeptCoordinates`).
        self.kept_only = kept_only and (
            isinstance(compressor, RandomK) or self.leader_chooses
        )
        # The step counter: random-k's draw, top-k's leader.
        self.counts_steps = compressor.uses_step or self.leader_chooses
        # A stateless compressor's result per variable depends on that
        # variable alone.
        self.per_variable = not compressor.stateful

    def init(self, specs: Sequence[tf.TensorSpec]) -> CompressionState:
        step = tf.zeros([], tf.int64) if self.counts_steps else ()
        residuals = []
        for spec in specs:
            column = ()
            if self.compressor.error_feedback and _compressible(spec, residual=True):
                column = tuple(
                    self.compressor.init(spec) for _ in range(self.num_replicas)
                )
            # A compressor may keep no state for a variable it sends as it
            # is (PowerSGD's vectors).
            residuals.append(column if tf.nest.flatten(column) else ())
        return CompressionState(step, tuple(residuals))

    def state_devices(self, state: Any) -> CompressionState:
        state = CompressionState(*state)
        return CompressionState(
            tf.nest.map_structure(lambda _: None, state.step),
            tuple(
                tuple(
                    tf.nest.map_structure(lambda _, r=r: self._device(r), kept)
                    for r, kept in enumerate(column)
                )
                for column in state.residuals
            ),
        )

    def apply(
        self, replicas: Replicas, state: Any, *, downstream: Downstream | None = None
    ) -> tuple[Replicas, CompressionState]:
        state = CompressionState(*state)
        out, residuals = self._compress(replicas, state.step, state.residuals)
        step = state.step
        if self.counts_steps:
            step = step + 1
        return out, CompressionState(step, residuals)

    def apply_in_place(
        self,
        replicas: Replicas,
        variables: Any,
        *,
        downstream: Downstream | None = None,
    ) -> Replicas:
        variables = CompressionState(*variables)
        step = variables.step
        if self.counts_steps:
            step = step.read_value()
        # Each residual read and written on its replica's device.
        residuals = []
        for column in variables.residuals:
            values = []
            for r, kept in enumerate(column):
                with self._on(r):
                    values.append(tf.nest.map_structure(lambda v: v.read_value(), kept))
            residuals.append(tuple(values))
        out, new = self._compress(replicas, step, tuple(residuals))
        for column_vars, column_new in zip(variables.residuals, new, strict=True):
            for r, (kept, value) in enumerate(
                zip(column_vars, column_new, strict=True)
            ):
                with self._on(r):
                    for var, part in zip(
                        tf.nest.flatten(kept), tf.nest.flatten(value), strict=True
                    ):
                        var.assign(part)
        if self.counts_steps:
            variables.step.assign_add(1)
        return out

    def _compress(self, replicas, step, residuals):
        """`(replicas with decompressed values at true scale, new residuals)`;
        `kept_only`: dense replicas, random-k's values at the kept
        coordinates."""
        n = replicas.num_replicas
        scale = float(n) if replicas.reduce_op == ReduceOp.SUM else 1.0
        out, new, blocks = [], [], []
        for v, column in enumerate(replicas.values):
            kept = residuals[v] if v < len(residuals) else ()
            if not self._compresses(column[0], bool(kept)):
                out.append([_times(value, scale) for value in column])
                new.append(kept)
                blocks.append(None)
                continue
            sent, column_new = [], []
            encode = self._leaders_coordinates(column, scale, kept, step)
            for r, value in enumerate(column):
                with self._on(r):
                    if encode is not None:
                        payload, residual = encode(r)
                    else:
                        payload, residual = self.compressor.compress(
                            _times(value, scale), kept[r] if kept else (), step, key=v
                        )
                    if kept and replicas.shares is not None:
                        # A replica without data keeps its state.
                        has_data = replicas.shares[r] > 0
                        residual = tf.nest.map_structure(
                            lambda new, old, has_data=has_data: tf.where(
                                has_data, new, old
                            ),
                            residual,
                            kept[r],
                        )
                # Where the path runs: the payload crossed over.
                if self.kept_only:
                    sent.append(payload.values)
                else:
                    sent.append(self.compressor.decompress(payload))
                column_new.append(residual)
            out.append(sent)
            new.append(tuple(column_new) if kept else ())
            blocks.append(
                KeptCoordinates(self.compressor.indices(payload), payload.shape)
                if self.kept_only
                else None
            )
        replicas = replicas._replace(values=out, reduce_op=ReduceOp.MEAN)
        if self.kept_only:
            replicas = _dense_with_kept(replicas, blocks)
        return replicas, tuple(new)

    def _leaders_coordinates(self, column, scale, kept, step):
        """With the leader's coordinates: `encode(r) -> (payload, residual)`
        of replica r at the coordinates the step's leader (replica `step mod
        n`) chose from its own `g + e`; else None.

        Each replica proposes its top-k on its own device; only the k
        indices cross (n * k int32), the leader's are picked by the step
        counter, and each replica sends its values at them."""
        if not self.leader_chooses:
            return None
        xs, proposals = [], []
        for r, value in enumerate(column):
            with self._on(r):
                x = _times(value, scale)
                x = x + tf.cast(kept[r], x.dtype)
                xs.append(x)
                proposals.append(self.compressor.choose(x))
        leader = tf.cast(step % self.num_replicas, tf.int32)
        indices = tf.gather(tf.stack(proposals), leader)

        def encode(r):
            payload = self.compressor.encode_at(xs[r], indices)
            return payload, self.compressor.residual(xs[r], payload)

        return encode

    def _compresses(self, value, has_residual):
        if is_sparse(value):
            return False
        if not value.dtype.is_floating:
            return False
        if self.compressor.error_feedback and not has_residual:
            if not value.shape.is_fully_defined():
                _say_once(
                    "unknown_shape",
                    "compression: a gradient of shape %s, known only at run "
                    "time, is sent uncompressed (its residual needs a shape).",
                    value.shape,
                )
            return False
        return value.shape.num_elements() != 0

    def _device(self, r):
        return None if self.devices is None else self.devices[r]

    def _on(self, r):
        device = self._device(r)
        return contextlib.nullcontext() if device is None else tf.device(device)

    def __repr__(self) -> str:
        return f"Compression({self.compressor!r})"


class KeptCoordinates(NamedTuple):
    """How a rule's result over random-k's kept coordinates (a `[k]` vector)
    goes back into its variable's shape: zeros where nothing was sent.

    Random-k keeps the same coordinates on every replica, so at any other
    coordinate every replica sends 0, and any rule's result there is 0: a
    coordinate-wise rule (median, trimmed mean) gives there what it gives
    on the whole tensor, and so does a rule of distances between replicas
    (Krum, the geometric median: the zeros add nothing to a distance). An
    attack, too, can only send values at the kept coordinates, as on the
    wire.

    Attributes:
        indices: The flat coordinates (int64 `[k]`).
        shape: The variable's shape (int32, from `tf.shape`).
    """

    indices: tf.Tensor
    shape: tf.Tensor

    def restore(self, value: tf.Tensor) -> tf.Tensor:
        return scatter(self.indices, value, self.shape)


def _dense_with_kept(replicas: Replicas, kept: list) -> Replicas:
    """`replicas.dense()` (values at true scale), with random-k's columns as
    their kept values and `KeptCoordinates` to put the result back."""
    blocks, values = [], []
    for column, block in zip(replicas.values, kept, strict=True):
        if block is None:
            block = sparse_lib.to_dense_rows(column)
            column = block.values
        blocks.append(block)
        values.append(list(column))
    if replicas.shares is not None:
        has_data = tf.stack([tf.convert_to_tensor(s) > 0 for s in replicas.shares])
        values = mask_replicas_without_data(values, has_data)
    return replicas._replace(values=values, blocks=tuple(blocks), scale=None)


def is_sparse(value) -> bool:
    """Whether `value` is a sparse gradient (`IndexedSlices`), which is sent
    as it is (said once in the log)."""
    if not isinstance(value, tf.IndexedSlices):
        return False
    _say_once(
        "sparse",
        "compression: sparse gradients (rows of shape %s, from an "
        "embedding lookup) are sent as they are, uncompressed.",
        value.values.shape[1:],
    )
    return True


def _compressible(spec: tf.TensorSpec, *, residual: bool) -> bool:
    """Whether a variable of `spec` is compressed: floating-point, not empty,
    and (for a residual) of a known shape."""
    if not spec.dtype.is_floating:
        return False
    if residual and not spec.shape.is_fully_defined():
        return False
    return spec.shape.num_elements() != 0


def _times(value, scale):
    if scale == 1.0:
        return value
    if isinstance(value, tf.IndexedSlices):
        return tf.IndexedSlices(
            value.values * tf.cast(scale, value.values.dtype),
            value.indices,
            value.dense_shape,
        )
    return value * tf.cast(scale, value.dtype)


_said: set[str] = set()


def _say_once(key: str, message: str, *args: Any) -> None:
    if key not in _said:
        _said.add(key)
        logging.info(message, *args)
