"""Synchronisation points inside control flow, without `merge_call`.

Keras puts cross-replica steps inside `ops.cond` in replica context:
`gradient_accumulation_steps` (all-reduce and update in one branch,
accumulator writes in the other), `ema_overwrite_frequency`, and
`LossScaleOptimizer`'s scale bookkeeping. `merge_call` cannot run there (each
replica's branch is its own graph), which is why `MirroredStrategy` and
`CentralStorageStrategy` fail these features.

A PS strategy has a way out: every replica can reach the parameter device.
At the k-th synchronisation point of a branch, replica `i` writes its values to
staging slots `slot[k][i]` on the reduction device. The *last* replica then
reads every slot, combines them and applies the update once. The ordering is
TensorFlow's own: replica threads trace in replica order, and automatic
control dependencies run the ops that touch a slot in the order they were
traced, so the last replica's read follows every other replica's write.

This requires every replica to take the same branch, which holds for Keras's
conditions (they depend only on shared variables and all-reduced values).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import tensorflow as tf

from keras_psdist._tf import (
    distribute_lib,
    mirrored_run,
    resource_variable_ops,
)
from keras_psdist.devices import device_variable


def in_replica_control_flow() -> bool:
    """True when tracing a replica's branch, where `merge_call` cannot run."""
    thread = threading.current_thread()
    if not isinstance(thread, mirrored_run._MirroredReplicaThread):
        return False
    if tf.executing_eagerly():
        return False
    return tf.compat.v1.get_default_graph() is not thread.graph


def replica_position() -> tuple[int, int]:
    """`(replica_id, num_replicas)` of the replica being traced."""
    ctx = distribute_lib.get_replica_context()
    return ctx._replica_id_in_sync_group, ctx.num_replicas_in_sync


class StagedMerge:
    """Staging slots on one device, reused across traces.

    Args:
        device: Where slots live and values are combined.
    """

    def __init__(self, device: str):
        self._device = device
        self._slots: dict[tuple, tf.Variable] = {}
        self._lock = threading.Lock()
        # Tensors that already hold a cross-replica result (see `agreed`).
        self._agreed: set = set()

    def _next_site(self) -> tuple[int, int]:
        thread = threading.current_thread()
        graph = tf.compat.v1.get_default_graph()
        counters = thread.__dict__.setdefault("_kpd_sites", {})
        site = counters.get(id(graph), 0)
        counters[id(graph)] = site + 1
        return (id(thread.graph), site)

    def _slot(self, key: tuple, like: tf.Tensor) -> tf.Variable:
        # Sites are numbered per branch, so two different `cond`s can share a
        # site number; the dtype and shape keep their values apart.
        shape = like.shape
        key = (
            *key,
            like.dtype.name,
            tuple(shape) if shape.is_fully_defined() else None,
        )
        with self._lock:
            slot = self._slots.get(key)
            if slot is None:
                shape = like.shape
                if shape.is_fully_defined():
                    slot = device_variable(
                        lambda: tf.zeros(shape, like.dtype), self._device, "kpd_stage"
                    )
                else:
                    slot = device_variable(
                        lambda: tf.zeros([0] * max(shape.rank or 1, 1), like.dtype),
                        self._device,
                        "kpd_stage",
                        shape=tf.TensorShape(None),
                    )
                self._slots[key] = slot
            return slot

    def combine(
        self,
        flat_values: Sequence[tf.Tensor],
        combine_fn: Callable[[list[list[tf.Tensor]]], list[tf.Tensor]],
    ) -> list[tf.Tensor] | None:
        """Stages this replica's values; returns the combination in the last.

        Args:
            flat_values: This replica's tensors.
            combine_fn: Maps `per_value[j][r]` to one tensor per value.

        Returns:
            In the last replica, `combine_fn`'s result; `None` elsewhere.
        """
        replica, n = replica_position()
        site = self._next_site()
        flat_values = [tf.convert_to_tensor(v) for v in flat_values]
        if n == 1:
            with tf.device(self._device):
                return combine_fn([[v] for v in flat_values])
        writes = []
        for j, v in enumerate(flat_values):
            if replica < n - 1:
                slot = self._slot((site, replica, j), v)
                writes.append(slot.assign(v, read_value=False))
        if replica < n - 1:
            return None
        per_value = []
        for j, v in enumerate(flat_values):
            column = [self._slot((site, r, j), v).read_value() for r in range(n - 1)]
            per_value.append(column + [v])
        with tf.device(self._device):
            return combine_fn(per_value)

    def mark_agreed(self, tensors: Sequence[tf.Tensor]) -> None:
        """Records tensors that already hold a cross-replica result."""
        for t in tensors:
            if isinstance(t, tf.Tensor):
                self._agreed.add(t.ref())

    def is_agreed(self, x) -> bool:
        """Whether `x` needs no combining: not a tensor, a variable, or the
        output (possibly through `Identity` ops, as `custom_gradient` adds) of
        a staged all-reduce."""
        if isinstance(x, tf.Variable) or resource_variable_ops.is_resource_variable(x):
            return True
        if not isinstance(x, tf.Tensor):
            return not tf.is_tensor(x)
        for _ in range(8):
            if x.ref() in self._agreed:
                return True
            op = getattr(x, "op", None)
            if op is None or op.type not in ("Identity", "IdentityN"):
                return False
            x = op.inputs[x.value_index if op.type == "IdentityN" else 0]
        return False
