"""Between-graph compression: what a worker process sends to the ps tasks.

In between-graph training (`PSStrategy(mode="between-graph")`) every worker
process combines its own replicas' gradients on the worker and applies the
result to the variables on the ps tasks itself, so what crosses the network
is that combined gradient, one per variable and step, on its way into the
variable's update. `WireCompression` compresses it there:

    on the worker:              x = g + e[v];  payload = C(x);  e[v] <- x - C(x)
    on the variable's ps task:  g' = decompress(payload)  ->  the update

so the payload (top-k's indices and values, packed signs, PowerSGD's
factors, a half-precision tensor) is what travels, and the residual `e[v]`
stays on the worker, one per variable: each worker keeps its own, as each
replica does in one process (`keras_psdist.gradients.compression`). The
residuals (and random-k's step, PowerSGD's warm-start factors) are training
state: `state` tracks them in `strategy.extended.training_state`.

A partitioned variable's gradient is decompressed on its first shard's ps
task, which sends the other shards their rows. What passes uncompressed is
what passes uncompressed between replicas: sparse gradients (embedding
lookups), values that are not floating-point, empty ones, and those the
compressor keeps no state for (PowerSGD's vectors).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.compression.base import Compressor
from keras_psdist.devices import device_variable
from keras_psdist.gradients.compression import _compressible, is_sparse


class Payload:
    """A compressed gradient on its way: `value` is the compressor's payload
    (a nest of tensors: top-k's indices and values, a half-precision
    tensor, ...), decompressed where the gradient is used."""

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return f"Payload({self.value!r})"


class WireState(tf.Module):
    """The residuals (and step) of a `WireCompression`, in the order they
    were created (a checkpoint read before the first step restores them when
    they appear)."""

    def __init__(self):
        super().__init__(name="wire_compression_state")
        self.kept = []


class WireCompression:
    """Compresses each (gradient, variable) pair on the way to the variable.

    Args:
        compressor: A `keras_psdist.compression.Compressor`.
        device: Where the worker combines its gradients: it compresses and
            keeps the residuals there.
        destination: `variable -> device` where its gradient is
            decompressed (the variable's ps task).

    Attributes:
        compressor: As given.
        state: The `WireState` holding the residuals.

    Examples:

    >>> import tensorflow as tf
    >>> from keras_psdist import compression
    >>> wire = WireCompression(
    ...     compression.get("top_k(ratio=0.5)"), "/cpu:0", lambda v: "/cpu:0"
    ... )
    >>> v = tf.Variable([0.0, 0.0])
    >>> [(g, _)] = wire([(tf.constant([3.0, 1.0]), v)])
    >>> g.numpy().tolist()  # 1 of 2 coordinates sent; 1.0 kept as residual
    [3.0, 0.0]
    >>> [(g, _)] = wire([(tf.constant([0.0, 0.5]), v)])
    >>> g.numpy().tolist()  # the residual added: 0.5 + 1.0
    [0.0, 1.5]
    """

    def __init__(
        self,
        compressor: Compressor,
        device: str,
        destination: Callable[[Any], str],
    ):
        self.compressor = compressor
        self._device = device
        self._destination = destination
        self.state = WireState()
        self._residuals: dict[Any, Any] = {}
        self._step = None

    def __call__(self, grads_and_vars: Sequence[tuple[Any, Any]]) -> list[tuple]:
        """`(gradient, variable)` pairs, each gradient now the decompressed
        payload, made on the variable's device."""
        sent = self.payloads(
            [g for g, _ in grads_and_vars], [v for _, v in grads_and_vars]
        )
        out = []
        for value, (_, var) in zip(sent, grads_and_vars, strict=True):
            if isinstance(value, Payload):
                # The payload crosses to the variable's task here.
                with tf.device(self._destination(var)):
                    value = self.decompress(value)
            out.append((value, var))
        return out

    def payloads(self, grads: Sequence[Any], variables: Sequence[Any]) -> list[Any]:
        """Each gradient compressed on this worker (its residual updated),
        as a `Payload`; a gradient that passes uncompressed (sparse, not
        floating-point, no state) as it is."""
        step = self._step_value()
        out = []
        for key, (grad, var) in enumerate(zip(grads, variables, strict=True)):
            kept = self._residual(var, grad) if self._compresses(grad) else None
            if kept is None:
                out.append(grad)
                continue
            with tf.device(self._device):
                state = tf.nest.map_structure(lambda v: v.read_value(), kept)
                payload, new = self.compressor.compress(grad, state, step, key=key)
                for variable, value in zip(
                    tf.nest.flatten(kept), tf.nest.flatten(new), strict=True
                ):
                    variable.assign(value)
            out.append(Payload(payload))
        if self._step is not None:
            self._step.assign_add(1)
        return out

    def decompress(self, payload: Payload) -> tf.Tensor:
        """The gradient `payload` carries (on the current device)."""
        return self.compressor.decompress(payload.value)

    def _compresses(self, grad) -> bool:
        if grad is None or is_sparse(grad):
            return False
        return _compressible(tf.TensorSpec(grad.shape, grad.dtype), residual=True)

    def _residual(self, var, grad):
        """The variables of this worker's state for `var` (`()` for a
        compressor without one), made the first time; None when the
        compressor keeps none for it (sent as it is)."""
        key = var.ref() if hasattr(var, "ref") else id(var)
        if key not in self._residuals:
            spec = tf.TensorSpec(grad.shape, grad.dtype)
            with tf.init_scope():
                initial = self.compressor.init(spec)
                if self.compressor.error_feedback and not tf.nest.flatten(initial):
                    self._residuals[key] = None
                else:
                    self._residuals[key] = tf.nest.map_structure(
                        lambda t: self._variable(t, "compression_residual"), initial
                    )
        return self._residuals[key]

    @property
    def steps(self) -> int | None:
        """The sends this worker has compressed so far (the step random-k
        draws its coordinates from, alike on every worker only if every
        worker counts the same), or `None` for a compressor that keeps no
        step."""
        return None if self._step is None else int(self._step.numpy())

    def _step_value(self):
        if not self.compressor.uses_step:
            return 0
        if self._step is None:
            with tf.init_scope():
                self._step = self._variable(tf.zeros([], tf.int64), "compression_step")
        return self._step.read_value()

    def _variable(self, initial_value, name):
        # Not a model weight: made outside any strategy's variable creator.
        variable = device_variable(initial_value, self._device, name)
        self.state.kept.append(variable)
        return variable

    def __repr__(self) -> str:
        return f"WireCompression({self.compressor!r})"
