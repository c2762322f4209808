"""The gradient reduction of a step: aggregator, attack, state and report.

`PSExtended` hands every all-reduce of gradients to a `GradientReduction`,
which runs the gradient path (`keras_psdist.gradients.gradient_path`: worker
momentum, compression, attack, pre-aggregations, rule, as configured) on the
reduction device (a compressor's compress half on each replica's own
device) and keeps, between steps,

- the path's state (each replica's momentum and compression residuals,
  centered clipping's center) in
  variables created from the chain's `init` the first time a step is traced,
  one set per input signature, and
- the rule's per-replica report (Krum's `selected`, the trimmed fraction, ...)
  in variables that a callback or the user reads after each step
  (`keras_psdist.callbacks.AggregationReport`, `strategy.extended.report()`).

Both are plain `ResourceVariable`s on the reduction device, made outside any
strategy's variable creator: they are not model weights, so they are not
placed or mirrored. The state (with worker momentum, each replica's momentum)
is training state, though: `state` tracks it for checkpoints
(`strategy.extended.training_state`, which `BackupAndRestore` saves and
restores beside the model's weights).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from keras_psdist.aggregators.base import Aggregator, column_spec
from keras_psdist.devices import device_variable
from keras_psdist.distribute.packed_transfers import move_together
from keras_psdist.gradients import Replicas, gradient_path, is_plain_mean


class ReductionState(tf.Module):
    """The state variables of a reduction, in the order they were created.

    A trackable for `tf.train.Checkpoint`: the variables appear the first time
    a step is traced, and a checkpoint read before that restores them when
    they do (TensorFlow's restore-on-create).
    """

    def __init__(self):
        super().__init__(name="aggregation_state")
        self.kept = []


class GradientReduction:
    """Runs the gradient path's steps inside a strategy.

    Args:
        aggregator: The bound rule (see `Aggregator.bind`).
        attack: A `keras_psdist.attacks.Attack` or `None`.
        device: The reduction device.
        num_replicas: The replica count n.
        spread_devices: Devices to spread a per-variable rule's work over
            (see `Aggregator.per_variable`): each variable's values are
            combined on one of them, balanced by bytes, so that no one
            parameter server receives every replica's every gradient.
            Defaults to none: everything on `device`.
        worker_momentum: Each replica's momentum, or 0 for none (see
            `aggregators.momentum`): the rule (behind the attack) then
            aggregates momenta, kept with the rule's state.
        replica_devices: The compute devices, one per replica: each
            replica's momentum lives and is updated on its own. Defaults to
            none: on `device`.
        compression: A `keras_psdist.compression.Compressor`, or `None`.
        compute_devices: The compute devices, one per replica, where each
            replica compresses what it sends and keeps its residuals.
            Defaults to none: on `device`.
    """

    def __init__(
        self,
        aggregator: Aggregator,
        attack: Any,
        device: str,
        num_replicas: int,
        spread_devices: Sequence[str] = (),
        worker_momentum: float = 0.0,
        replica_devices: Sequence[str] | None = None,
        compression: Any = None,
        compute_devices: Sequence[str] | None = None,
    ):
        self.aggregator = aggregator
        self.attack = attack
        self.worker_momentum = worker_momentum
        self.compression = compression
        # What runs each step, as one chain of stages.
        self.path = gradient_path(
            aggregator,
            num_replicas=num_replicas,
            attack=attack,
            worker_momentum=worker_momentum,
            replica_devices=replica_devices,
            compression=compression,
            compute_devices=compute_devices,
        )
        self._device = device
        self._num_replicas = num_replicas
        spread = self.path.per_variable
        self._spread_devices = tuple(spread_devices) if spread else ()
        self._states: dict[tuple, Any] = {}
        # Each replica's gradients for one device travel as one tensor (see
        # `packed_transfers.py`), when nothing runs on the replicas' own
        # devices first (compression, worker momentum).
        self.pack_transfers = True
        self.state = ReductionState()
        names = tuple(aggregator.report_names)
        self._report = {
            name: _bookkeeping_variable(
                tf.zeros([num_replicas]), device, f"report_{name}"
            )
            for name in names
        }

    def __call__(
        self,
        reduce_op: tf.distribute.ReduceOp,
        per_replica: Sequence[Sequence[tf.Tensor | tf.IndexedSlices]],
        shares: Sequence[tf.Tensor] | None,
    ) -> list[tf.Tensor | tf.IndexedSlices]:
        """One step: aggregates, writes the state and report, returns the values."""
        if len(self._spread_devices) > 1:
            return self._spread(reduce_op, per_replica, shares)
        per_replica = self._moved(per_replica, self._device)
        with tf.device(self._device):
            state_vars = self._state_variables(per_replica)
            # Each stage reads its state and writes the next (worker
            # momentum in place); the writes gate nothing: a step function
            # runs every one of them anyway (automatic control dependencies,
            # which also order them against the next step's reads), so the
            # optimizer's update does not wait for the state and the report
            # to be stored.
            result = self.path.apply_in_place(
                Replicas(per_replica, reduce_op, shares), state_vars
            )
            for name, value in result.report.items():
                if name not in self._report:
                    raise ValueError(
                        f"{type(self.aggregator).__name__} reported {name!r}, which "
                        f"is not in its report_names {tuple(self._report)}. Add it "
                        "to `report_names`."
                    )
                self._report[name].assign(tf.cast(value, tf.float32))
            return [_identity(v) for v in result.values]

    def _spread(self, reduce_op, per_replica, shares):
        out = [None] * len(per_replica)
        groups = _balance_by_bytes(per_replica, self._spread_devices)
        for device, indices in groups.items():
            with tf.device(device):
                columns = self._moved([per_replica[i] for i in indices], device)
                specs = [column_spec(column) for column in columns]
                result, _ = self.path.apply(
                    Replicas(columns, reduce_op, shares), self.path.init(specs)
                )
                for i, value in zip(indices, result.values, strict=True):
                    out[i] = _identity(value)
        return out

    def _moved(self, columns, device):
        """`columns` (one per variable, a value per replica) with each
        replica's dense values moved to `device` as one tensor."""
        if not self.pack_transfers or self.compression or self.worker_momentum:
            return columns
        out = [list(column) for column in columns]
        for r in range(len(out[0]) if out else 0):
            moved = move_together([column[r] for column in columns], device)
            for column, value in zip(out, moved, strict=True):
                column[r] = value
        return out

    @property
    def is_plain_mean(self) -> bool:
        """Whether each step is the `mean` of the gradients as they are (no
        attack, no worker momentum): an all-reduce computes it anywhere."""
        return is_plain_mean(self.path)

    def report(self) -> dict[str, np.ndarray]:
        """The last step's per-replica report, `name -> array of shape [n]`."""
        return {name: var.numpy() for name, var in self._report.items()}

    @property
    def report_variables(self) -> dict[str, tf.Variable]:
        """The variables holding the report (for use inside `tf.function`)."""
        return dict(self._report)

    def _state_variables(self, per_replica):
        specs = tuple(column_spec(column) for column in per_replica)
        if specs not in self._states:
            with tf.init_scope():
                initial = self.path.init(list(specs))
            self._states[specs] = tf.nest.map_structure(
                lambda t, device: _bookkeeping_variable(
                    t, device or self._device, "aggregator_state"
                ),
                initial,
                self.path.state_devices(initial),
            )
            self.state.kept.extend(tf.nest.flatten(self._states[specs]))
        return self._states[specs]


def _balance_by_bytes(per_replica, devices):
    """`device -> column indices`: largest first, each to the least-loaded."""
    sizes = [_bytes(column[0]) for column in per_replica]
    load = dict.fromkeys(devices, 0)
    groups: dict[str, list[int]] = {}
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        device = min(devices, key=lambda d: load[d])
        load[device] += sizes[i]
        groups.setdefault(device, []).append(i)
    return {device: sorted(indices) for device, indices in groups.items()}


def _bytes(value):
    if isinstance(value, tf.IndexedSlices):
        value = value.values
    elements = value.shape.num_elements()
    return (elements or 0) * value.dtype.size


def _bookkeeping_variable(initial_value, device, name):
    return device_variable(initial_value, device, name)


def _identity(value):
    if isinstance(value, tf.IndexedSlices):
        return tf.IndexedSlices(
            tf.identity(value.values), value.indices, value.dense_shape
        )
    return tf.identity(value)
