"""How writes made in replica context reach the one copy of a variable.

Metric totals, BatchNormalization's moving statistics, the optimizer's
`iterations`: Keras writes them from every replica. `ReplicaWrites` is the
part of `PSExtended` that combines those writes by the variable's
aggregation (plain arithmetic, weighted by each replica's share of the batch,
never the gradient aggregator) and applies them once, also inside a
replica's control flow, where `merge_call` cannot run and the staged
protocol of `variables/staged_merge.py` takes over.
"""

from __future__ import annotations

import tensorflow as tf

from keras_psdist._tf import distribute_lib, values
from keras_psdist.aggregators import Mean
from keras_psdist.aggregators.base import weighted_sum
from keras_psdist.variables.staged_merge import in_replica_control_flow
from keras_psdist.variables.values import effective_aggregation

ReduceOp = tf.distribute.ReduceOp
# Replica-context writes (metric totals, statistics) are combined with plain
# arithmetic, never with the strategy's gradient aggregator.
_PLAIN_MEAN = Mean()


class ReplicaWrites:
    """`PSExtended`'s replica-context writes (a mixin).

    Uses the extended's `_batches` (the step's `ReplicaBatches`), `_staged`
    (its `StagedMerge`), `_reduction` (the gradient reduction, for
    all-reduces inside control flow) and `_update`.
    """

    @property
    def _shares(self):
        """Each replica's share of the step's global batch, or None."""
        return None if self._batches is None else self._batches.shares

    def _float_shares(self, columns):
        """The step's shares, for columns of float values only (an integer
        all-reduce is not a gradient to weigh)."""
        if self._shares is None or not columns:
            return None
        if not all(v.dtype.is_floating for vs in columns for v in vs):
            return None
        return self._shares

    def replica_without_data(self, replica: int) -> tf.Tensor | None:
        """In the step being traced: whether `replica` got no data and runs
        on a stand-in (see `replica_batches.py`); None outside a step."""
        if self._batches is None or self._batches.without_data is None:
            return None
        return self._batches.without_data[replica]

    def combine_for_variable(self, aggregation, value, var):
        """Combines replica-context writes of `var` (see `variables/values.py`).

        Plain arithmetic, never the aggregator: these are metric totals and
        statistics, not gradients.
        """
        if aggregation == tf.VariableAggregation.ONLY_FIRST_REPLICA:
            return self._local_results(value)[0]
        if not isinstance(value, values.DistributedValues):
            if aggregation == tf.VariableAggregation.SUM:
                return value * self._num_replicas_in_sync
            return value
        per_replica = list(value.values)
        with tf.device(var.device):
            if any(isinstance(v, tf.IndexedSlices) for v in per_replica):
                op = (
                    ReduceOp.SUM
                    if aggregation == tf.VariableAggregation.SUM
                    else ReduceOp.MEAN
                )
                return _PLAIN_MEAN.reduce_sparse(op, per_replica)
            return combine_column(aggregation, per_replica, self._shares)

    # ------------------------------------------- sync inside control flow

    def _use_merge_call(self):
        # `merge_call` works everywhere but inside a replica's `cond` branch;
        # there, the staged protocol of `staged_merge.py` takes over. In
        # cross-replica context (the sync-replica chief applying an update
        # with Keras's optimizer) there is nothing to merge.
        if distribute_lib.in_cross_replica_context():
            return False
        return not in_replica_control_flow()

    def _replica_ctx_all_reduce(self, reduce_op, value, options=None):
        reduce_op = as_reduce_op(reduce_op)
        flat = [tf.convert_to_tensor(v) for v in tf.nest.flatten(value)]
        out = self._staged.combine(
            flat,
            lambda per_value: self._reduction(
                reduce_op, per_value, self._float_shares([flat])
            ),
        )
        if out is None:
            # Not the last replica: it never applies the result, so a stand-in
            # of the right structure is enough.
            out = [tf.identity(v) for v in flat]
        self._staged.mark_agreed(out)
        return tf.nest.pack_sequence_as(value, out)

    def _replica_ctx_update(self, var, fn, args=(), kwargs=None, group=True):
        if not in_replica_control_flow():
            return super()._replica_ctx_update(var, fn, args, kwargs, group)
        aggregation = effective_aggregation(tf.VariableAggregation.NONE, var.dtype)
        return self.staged_apply(
            aggregation,
            args,
            kwargs or {},
            apply=lambda a, kw: self._update(var, fn, a, kw, group),
            stand_in=lambda: None,
        )

    def staged_assign(self, var, f, aggregation, args, kwargs):
        """A replica-context write of `var` inside control flow (see
        `staged_merge.py`): combined by `aggregation`, applied once."""
        inner = var.get()

        def apply(a, kw):
            with tf.device(inner.device), distribute_lib.UpdateContext(inner.device):
                return f(inner, *a, **kw)

        return self.staged_apply(
            aggregation, args, kwargs, apply=apply, stand_in=inner.value
        )

    def staged_apply(self, aggregation, args, kwargs, apply, stand_in):
        """Stages the arguments that differ between replicas, combines them by
        `aggregation`, and calls `apply(args, kwargs)` in the last replica.
        Other replicas return `stand_in()`."""
        flat = tf.nest.flatten((args, kwargs))
        staged = [i for i, x in enumerate(flat) if not self._staged.is_agreed(x)]
        combined = self._staged.combine(
            [flat[i] for i in staged],
            lambda per_value: [
                combine_column(aggregation, c, self._shares) for c in per_value
            ],
        )
        if combined is None:
            return stand_in()
        for i, c in zip(staged, combined, strict=True):
            flat[i] = c
        args, kwargs = tf.nest.pack_sequence_as((args, kwargs), flat)
        return apply(args, kwargs)


def combine_column(aggregation, column, shares=None):
    """Combines one variable's per-replica values by `aggregation`.

    A float MEAN is weighted by each replica's share of the global batch
    (`shares`, see `replica_batches.py`), so BatchNormalization's moving statistics are
    those of the global batch even when a partial batch splits unevenly;
    a replica that got no data (whose statistics are 0/0 = NaN) has
    weight 0 and is left out.
    """
    column = [tf.convert_to_tensor(c) for c in column]
    if aggregation == tf.VariableAggregation.ONLY_FIRST_REPLICA:
        return column[0]
    if len(column) == 1:
        return tf.identity(column[0])
    dtype = column[0].dtype
    if aggregation == tf.VariableAggregation.SUM:
        if shares is not None and len(shares) == len(column):
            # Metric totals: a replica without data ran on a stand-in
            # example, which must not count.
            column = [
                tf.where(share > 0, c, tf.zeros_like(c))
                for c, share in zip(column, shares, strict=True)
            ]
        return tf.add_n(column)
    if not dtype.is_floating:
        return column[0]
    if shares is None or len(shares) != len(column):
        return tf.add_n(column) / tf.cast(len(column), dtype)
    return weighted_sum(column, shares)


def as_reduce_op(reduce_op):
    if isinstance(reduce_op, str):
        return ReduceOp(reduce_op.upper())
    return reduce_op
