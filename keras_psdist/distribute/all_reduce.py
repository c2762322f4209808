"""The all-reduce of replicated variables' gradients, by TensorFlow's own
cross-device ops.

With `dense="all_reduce"` and the plain `mean` aggregator (no attack, no
worker momentum), the gradients need no central rule: each replica needs the
sum, which TensorFlow's `CrossDeviceOps` compute where they are. Among the
worker tasks of an in-graph cluster of three or more: TensorFlow's collective
all-reduce over its gRPC runtime (`CollectiveAllReduce`, as
`MultiWorkerMirroredStrategy` uses, here driven by the one client), whose ring
moves 2 (k - 1) / k of the bytes through each task's link where a reduction
to one task moves 2 (k - 1) through that task's. Otherwise
`select_cross_device_ops`'s choice: NCCL's all-reduce among local GPUs, else a
reduction to one device and a broadcast, as `MirroredStrategy` does. Between
two tasks both move the same bytes and the reduction was 2.2 times as fast
on a localhost cluster (8.9 MB in 8 tensors: 24 ms against 53 ms, the
collective packed or not), so it is used there too. Keras
all-reduces a step's gradients before it knows which update each is for, so
every dense gradient of the step takes this path; a parameter-server
variable's update then reads one replica's copy of the sum. Every other rule
needs every replica's value in one place and goes through
`GradientReduction` instead.

A partial last batch weighs each replica's gradient by its share of the
global batch, as `aggregators.Mean` does; a replica without data (its values
possibly NaN) adds zeros. Full batches are summed as they are, so the result
is the `mean` aggregator's, to the summation order.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from keras_psdist._tf import (
    collective_util,
    cross_device_ops_lib,
    cross_device_utils,
    values,
)
from keras_psdist.dense_choice import num_tasks

ReduceOp = tf.distribute.ReduceOp
# From this many worker tasks on, the ring of the collective all-reduce moves
# fewer bytes per link than a reduction to one task (see the module doc).
COLLECTIVE_MIN_TASKS = 3


class ReplicatedAllReduce:
    """Sums the replicas' values of replicated variables onto every replica.

    Build it eagerly, outside any strategy scope: across tasks, TensorFlow's
    collective all-reduce makes a small ordering variable on each device.
    The collective is used from `COLLECTIVE_MIN_TASKS` tasks on.

    Args:
        devices: The compute devices, one per replica.
    """

    def __init__(self, devices: Sequence[str]):
        self._devices = tuple(devices)
        self._ops = None
        if num_tasks(self._devices) >= COLLECTIVE_MIN_TASKS:
            self._ops = cross_device_ops_lib.CollectiveAllReduce(
                devices=self._devices,
                group_size=len(self._devices),
                options=collective_util.Options(),
                collective_keys=cross_device_utils.CollectiveKeys(),
            )

    @property
    def cross_device_ops(self) -> tf.distribute.CrossDeviceOps:
        """TensorFlow's all-reduce for these devices: collective across tasks,
        else `select_cross_device_ops`'s choice (made on first use)."""
        if self._ops is None:
            self._ops = cross_device_ops_lib.select_cross_device_ops(self._devices)
        return self._ops

    def __call__(
        self,
        reduce_op: tf.distribute.ReduceOp,
        columns: Sequence[Sequence[tf.Tensor]],
        destinations: Sequence[object],
        shares: Sequence[tf.Tensor] | None,
    ) -> list[values.Mirrored]:
        """One `Mirrored` (a value per replica) per column, with the meaning
        `reduce_op` asks for (see `Aggregator.step`)."""
        n = len(self._devices)
        if shares is not None:
            columns = [_weighted(column, shares, n) for column in columns]
        pairs = [
            (values.PerReplica(tuple(column)), destination)
            for column, destination in zip(columns, destinations, strict=True)
        ]
        reduced = self.cross_device_ops.batch_reduce(ReduceOp.SUM, pairs)
        if reduce_op == ReduceOp.MEAN:
            reduced = [
                values.Mirrored(tuple(v / n for v in mirrored.values))
                for mirrored in reduced
            ]
        return reduced


def _weighted(column, shares, n):
    """Each replica's value times `n * share` (1 when every share is 1/n), on
    its own device; zeros for a replica without data."""
    even = tf.reduce_all(tf.abs(tf.stack(shares) - 1.0 / n) < 1e-6 / n)
    out = []
    for value, share in zip(column, shares, strict=True):
        with tf.device(value.device):
            share = tf.cast(share, value.dtype)
            weight = tf.where(even, tf.ones_like(share), share * n)
            out.append(tf.where(share > 0, value * weight, tf.zeros_like(value)))
    return out
