"""The worker-momentum stage: each replica's momentum replaces its gradient.

`m_r <- beta * m_r + (1 - beta) * g_r` for every replica r (the math, the
fused passes and why: `keras_psdist.aggregators.momentum`). It runs first,
on the gradients as Keras sends them, and hands on the momenta at true
scale; sparse gradients pass without momentum.

Its state is per replica: `state[v][r]`, replica r's buffer for variable v,
on replica r's device when the strategy passes `devices` (GPUs, other
tasks), else where the rule runs. The strategy runs `apply_in_place`: the
buffers are updated in the variables that hold them, without a new buffer
per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_psdist.aggregators.momentum import (
    check_beta,
    initial_momenta,
    momentum_step,
    momentum_step_in_place,
)
from keras_psdist.gradients.stage import Downstream, Replicas, Stage

ReduceOp = tf.distribute.ReduceOp


class Momentum(Stage):
    """Every replica's momentum of its gradients, in place of the gradients.

    Args:
        beta: The momentum, in `[0, 1)`.
        num_replicas: The replica count n (one buffer per replica).
        devices: Replica r's buffers live and are updated on `devices[r]`.
            Defaults to none: where the rule runs.

    Attributes:
        beta: The momentum.
        devices: As given.
    """

    def __init__(
        self, beta: float, num_replicas: int, devices: Sequence[str] | None = None
    ):
        self.beta = check_beta(beta)
        self.num_replicas = num_replicas
        self.devices = None if devices is None else tuple(devices)

    def init(self, specs: Sequence[tf.TensorSpec]) -> tuple:
        return initial_momenta(specs, self.num_replicas)

    def state_devices(self, state: Any) -> tuple:
        return tuple(
            tuple(
                None if self.devices is None else self.devices[r] for r in range(len(b))
            )
            for b in state
        )

    def apply(
        self, replicas: Replicas, state: Any, *, downstream: Downstream | None = None
    ) -> tuple[Replicas, Any]:
        self._check(replicas)
        out, momenta = momentum_step(
            replicas.reduce_op,
            replicas.values,
            replicas.shares,
            state,
            self.beta,
            self.devices,
        )
        return replicas._replace(values=out, reduce_op=ReduceOp.MEAN), momenta

    def apply_in_place(
        self,
        replicas: Replicas,
        variables: Any,
        *,
        downstream: Downstream | None = None,
    ) -> Replicas:
        self._check(replicas)
        out = momentum_step_in_place(
            replicas.reduce_op,
            replicas.values,
            replicas.shares,
            variables,
            self.beta,
            self.devices,
        )
        return replicas._replace(values=out, reduce_op=ReduceOp.MEAN)

    def _check(self, replicas: Replicas) -> None:
        if replicas.is_dense:
            raise ValueError(
                "Worker momentum runs on the gradients as sent, first in the "
                "path; a stage before it made them dense. Put it first."
            )

    def __repr__(self) -> str:
        return f"Momentum(beta={self.beta})"
