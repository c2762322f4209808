"""How the replicas' values of a step become one: `PSExtended`'s reductions.

- `batch_reduce_to` (Keras's all-reduce of a step's gradients): under the
  plain mean, once some variable is replicated (`dense=`), TensorFlow's own
  all-reduce (`all_reduce.py`); otherwise the gradient reduction
  (`reduction.py`: one aggregator over every gradient of the step, on the
  reduction device). Sparse gradients always take the aggregator's path.
- `reduce_to` (reading a metric, reducing logs): plain arithmetic, never the
  aggregator.
- gathers and broadcasts: TensorFlow's reduction-to-one-device ops.
"""

from __future__ import annotations

import tensorflow as tf

from keras_psdist._tf import (
    cross_device_ops_lib,
    distribute_utils,
    resource_variable_ops,
    values,
)
from keras_psdist.distribute.replica_writes import (
    as_reduce_op,
    combine_column,
)

ReduceOp = tf.distribute.ReduceOp


class CrossReplicaReductions:
    """`PSExtended`'s reductions, gathers and broadcasts (a mixin).

    Uses the extended's `_num_replicas_in_sync`, `_reduction_device`,
    `_reduction` (the `GradientReduction`), `_all_reduce` (a
    `ReplicatedAllReduce` or None), `_creator` (for the placement),
    `_gather_ops`, `_compute_devices`, `_float_shares`, `_batches` (set while
    a step is traced) and `_reduced` (a set the reduced gradients' refs of
    that step are added to, see `as_reduced`).
    """

    def _reduce_to(self, reduce_op, value, destinations, options):
        # Cross-replica reductions (reading a metric, reducing logs) are plain
        # arithmetic; the aggregator is for all-reduces, i.e. gradients.
        if not isinstance(value, values.DistributedValues):
            return cross_device_ops_lib.reduce_non_distributed_value(
                reduce_op, value, destinations, self._num_replicas_in_sync
            )
        column = [tf.convert_to_tensor(v) for v in value.values]
        with tf.device(self._reduction_device):
            if as_reduce_op(reduce_op) == ReduceOp.SUM:
                result = combine_column(tf.VariableAggregation.SUM, column)
            else:
                result = tf.add_n(column) / tf.cast(len(column), column[0].dtype)
        return self._to_destinations(result, destinations)

    def _batch_reduce_to(self, reduce_op, value_destination_pairs, options):
        reduce_op = as_reduce_op(reduce_op)
        pairs = list(value_destination_pairs)
        results = [None] * len(pairs)
        dense, sparse, all_reduced = [], [], []
        for i, (value, destination) in enumerate(pairs):
            if not isinstance(value, values.DistributedValues):
                if self._num_replicas_in_sync > 1:
                    # The same value in every replica (a tensor made outside
                    # `strategy.run`): one value, as TensorFlow's
                    # `batch_reduce` takes it, so its sum and its mean are
                    # itself (as under MirroredStrategy and on one device);
                    # no rule combines it.
                    results[i] = self._to_destinations(
                        _on_device(value, self._reduction_device), destination
                    )
                    continue
                # One replica: TF hands its value unwrapped. It takes the
                # gradient path (compression, attack, the rule's state).
                value = values.PerReplica((value,))
            per_replica = list(value.values)
            if any(isinstance(v, tf.IndexedSlices) for v in per_replica):
                sparse.append((i, per_replica))
            elif self._all_reduces(destination):
                all_reduced.append((i, per_replica))
            else:
                dense.append((i, per_replica))
        if all_reduced:
            columns = [vs for _, vs in all_reduced]
            reduced = self._all_reduce(
                reduce_op,
                columns,
                [pairs[i][1] for i, _ in all_reduced],
                self._float_shares(columns),
            )
            for (i, _), r in zip(all_reduced, reduced, strict=True):
                results[i] = r
        if dense or sparse:
            columns = [vs for _, vs in dense] + [vs for _, vs in sparse]
            reduced = self._reduction(reduce_op, columns, self._float_shares(columns))
            for (i, _), r in zip(dense + sparse, reduced, strict=True):
                if isinstance(r, tf.Tensor) and self._batches is not None:
                    # In a step being traced (cleared at its end).
                    self._reduced.add(r.ref())
                results[i] = self._to_destinations(r, pairs[i][1])
        return results

    def as_reduced(self, value):
        """`value` as the reduction made it: TensorFlow's
        `ReplicaContext.all_reduce` hands each replica an `IdentityN` copy
        of the reduced value on its own device (its custom gradient's); an
        update on the parameter device takes the value it copied instead,
        which is there already, rather than a copy sent to a replica and
        back."""
        op = getattr(value, "op", None)
        if isinstance(value, tf.Tensor) and op is not None and op.type == "IdentityN":
            source = op.inputs[value.value_index]
            if source.ref() in self._reduced:
                return source
        return value

    def _all_reduces(self, destination) -> bool:
        """Whether a dense value for `destination` goes through TF's
        all-reduce: under the plain mean, once some variable is replicated,
        for an all-reduce among the replicas (Keras's gradients) or a
        replicated variable. A parameter-server variable's update then reads
        one replica's copy of the sum."""
        return (
            self._all_reduce is not None
            and bool(self._creator.placement.replicated())
            and isinstance(destination, values.DistributedValues)
        )

    def _to_destinations(self, tensor, destinations):
        """Packs one reduced tensor the way `destinations` expects it."""
        if isinstance(destinations, values.DistributedValues) or (
            isinstance(destinations, tf.Tensor) and not _is_variable(destinations)
        ):
            # An all-reduce: every replica gets the same tensor. It stays on
            # the parameter device; whoever reads it copies it once.
            return distribute_utils.regroup(
                (tensor,) * self._num_replicas_in_sync, wrap_class=values.Mirrored
            )
        return tensor

    def _gather_to_implementation(self, value, destinations, axis, options):
        if not isinstance(value, values.DistributedValues):
            return value
        return self._gather_ops._gather(
            value, destinations=destinations, axis=axis, options=options
        )

    def _broadcast_to(self, tensor, destinations):
        if isinstance(tensor, (float, int)):
            return tensor
        if not cross_device_ops_lib.check_destinations(destinations):
            destinations = self._compute_devices
        return self._gather_ops.broadcast(tensor, destinations)


def _is_variable(x):
    return isinstance(x, tf.Variable) or resource_variable_ops.is_resource_variable(x)


def _on_device(value, device):
    """`value` (a tensor, IndexedSlices or Python number) copied to `device`."""
    with tf.device(device):
        if isinstance(value, tf.IndexedSlices):
            return tf.IndexedSlices(
                tf.identity(value.values), tf.identity(value.indices), value.dense_shape
            )
        return tf.identity(value)
