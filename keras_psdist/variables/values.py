"""The variable a PSStrategy hands to Keras: one copy, on its parameter device.

`PSVariable` wraps the single resource variable that lives on a parameter
device. Reads from any replica fetch that one copy. Writes made in replica
context (BatchNormalization's moving statistics, metric totals, the optimizer's
`iterations`, a `SeedGenerator`'s state) are first combined across replicas,
then applied once, on the variable's device, according to the variable's
aggregation:

| aggregation          | applied value                                   |
|----------------------|-------------------------------------------------|
| `SUM`                | sum of the replicas' values (metric totals)     |
| `MEAN`               | mean of the replicas' values                    |
| `ONLY_FIRST_REPLICA` | replica 0's value (`iterations`)                |
| `NONE`, float dtype  | mean (BatchNormalization moving statistics)     |
| `NONE`, other dtype  | replica 0's value (`SeedGenerator` state)       |

`NONE` is where `CentralStorageStrategy` raises and `MirroredStrategy` keeps
diverging copies. With a single copy, every replica computes the same update
of an integer state, and the mean of per-replica float statistics is the
statistic of the global batch when replicas see equal-sized shards.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from keras_psdist._tf import (
    device_util,
    distribute_lib,
    ps_values,
    values,
    values_util,
)
from keras_psdist.variables import narrow_reads
from keras_psdist.variables.staged_merge import in_replica_control_flow

VariableAggregation = tf.VariableAggregation


def effective_aggregation(
    aggregation: tf.VariableAggregation, dtype: tf.DType
) -> tf.VariableAggregation:
    """The aggregation replica-context writes of this variable use."""
    if aggregation != VariableAggregation.NONE:
        return aggregation
    if tf.as_dtype(dtype).is_floating:
        return VariableAggregation.MEAN
    return VariableAggregation.ONLY_FIRST_REPLICA


class PSVariable(ps_values.AggregatingVariable):
    """A variable stored once on a parameter device and shared by all replicas.

    Behaves as a `tf.Variable` everywhere (Keras, checkpoints, SavedModel see
    the wrapped variable). Create it through `PSStrategy.scope()`, never
    directly.
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        v: tf.Variable,
        aggregation: tf.VariableAggregation,
    ):
        super().__init__(strategy, v, aggregation)
        self._replica_aggregation = effective_aggregation(aggregation, v.dtype)

    # numpy 2 passes `copy` (Keras's `np.array(variable)`), which TF's own
    # `__array__` does not take: numpy then warns. A read is a new array,
    # whatever `copy` asks.
    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.numpy(), dtype=dtype)

    def _dense_var_to_tensor(self, dtype=None, name=None, as_ref=False):
        # A replica's read from another task travels in `read_dtype` (see
        # `keras_psdist.variables.narrow_reads`); every other read is exact.
        # A large one may be read by its change since this replica's last
        # read (`keras_psdist.variables.delta_reads`).
        if (
            not as_ref
            and (dtype is None or tf.as_dtype(dtype) == self.dtype)
            and narrow_reads.reads_across_tasks(self)
        ):
            extended = self._distribute_strategy.extended
            delta = getattr(extended, "delta_reads", None)
            copy = (
                None
                if delta is None
                else delta.copy_for(self._v, device_util.current())
            )
            if copy is not None:
                return delta.read(self._v, copy, extended.read_dtype)
            # In a Keras step, with the task's other variables as one tensor
            # (`keras_psdist.distribute.packed_transfers`).
            packed = getattr(extended, "packed_reads", None)
            if packed is not None:
                value = packed.read(self._v, getattr(extended, "read_dtype", None))
                if value is not None:
                    return value
            narrow = getattr(extended, "read_dtype", None)
            if narrow is not None:
                return narrow_reads.narrowed_read(self._v, narrow)
        return super()._dense_var_to_tensor(dtype, name, as_ref)

    def _assign_func(self, *args, **kwargs):
        with distribute_lib.enter_or_assert_strategy(self._distribute_strategy):
            f = kwargs.pop("f")
            packed = getattr(self._distribute_strategy.extended, "packed_reads", None)
            if packed is not None:
                # Later reads of this variable in the step read it anew.
                packed.wrote(self._v)
            if distribute_lib.get_update_replica_id() is not None:
                # Inside `extended.update`: the write is already agreed.
                return f(self._v, *args, **kwargs)
            extended = self._distribute_strategy.extended
            if distribute_lib.in_cross_replica_context():
                # A write outside the steps (`set_weights`, `assign`): the
                # replicas' copies of it are read whole next.
                delta = getattr(extended, "delta_reads", None)
                if delta is not None:
                    delta.read_whole_next(self._v)
                return extended.update(self, f, args=args, kwargs=kwargs)
            if in_replica_control_flow():
                return extended.staged_assign(
                    self, f, self._replica_aggregation, args, kwargs
                )
            replica_context = distribute_lib.get_replica_context()

            def merge_fn(
                strategy, value, use_locking=False, name=None, read_value=True
            ):
                combined = strategy.extended.combine_for_variable(
                    self._replica_aggregation, value, self
                )
                if isinstance(name, values.PerReplica):
                    name = name.values[0]
                return strategy.extended.update(
                    self,
                    f,
                    args=(combined,),
                    kwargs={
                        "use_locking": use_locking,
                        "name": name,
                        "read_value": read_value,
                    },
                )

            return replica_context.merge_call(merge_fn, args=args, kwargs=kwargs)


class ReplicatedVariable(values.MirroredVariable):
    """A trainable variable kept on every replica (`PSStrategy(dense=
    "all_reduce")`): one copy per compute device, as `MirroredStrategy`
    keeps variables. Each replica reads its own copy; the optimizer's update
    runs on every copy with the same reduced gradient
    (`PSExtended.update`), so the copies stay equal. Checkpoints and saved
    models hold one value.
    """

    # As `PSVariable.__array__`: TF's (reached through the primary copy)
    # takes no `copy`.
    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.numpy(), dtype=dtype)

    @property
    def handle(self):
        # Outside a replica (a step called under the scope, not through
        # `strategy.run`) the copies are equal, so the first is the variable,
        # as on one device; a gradient taken there is applied to every copy by
        # `update`. TF's `MirroredVariable` raises instead.
        if values_util.get_current_replica_id_as_int() is None:
            return self._primary.handle
        return super().handle


class ReplicaLocalVariable(values.SyncOnReadVariable):
    """An `ON_READ` variable (a metric's total or count): one copy per
    replica, summed when read, as TensorFlow's `SyncOnReadVariable`.

    A replica without data runs the step on a stand-in example
    (`keras_psdist.distribute.replica_batches`); its writes here leave its copy as it
    was, so the stand-in is never counted.
    """

    # Keras 3.10 reads a metric whose `result()` returns its variable with
    # `float(variable)` (TF's own `SyncOnReadVariable` then fails, under
    # MirroredStrategy too): the value read is the sum over replicas.
    def __float__(self):
        return float(self.read_value())

    def __int__(self):
        return int(self.read_value())

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.read_value(), dtype=dtype)

    def assign(self, value, *args, **kwargs):
        empty = _replica_without_data(self._distribute_strategy)
        if empty is not None:
            value = tf.where(empty, self._get_on_device_or_primary().value(), value)
        return super().assign(value, *args, **kwargs)

    def assign_add(self, delta, *args, **kwargs):
        return super().assign_add(self._counted(delta), *args, **kwargs)

    def assign_sub(self, delta, *args, **kwargs):
        return super().assign_sub(self._counted(delta), *args, **kwargs)

    def _counted(self, delta):
        """`delta`, or zeros in a replica without data."""
        empty = _replica_without_data(self._distribute_strategy)
        if empty is None:
            return delta
        delta = tf.convert_to_tensor(delta)
        return tf.where(empty, tf.zeros_like(delta), delta)


def _replica_without_data(strategy):
    """In a replica of a step: whether it got no data (a scalar bool tensor);
    elsewhere None."""
    if distribute_lib.in_cross_replica_context():
        return None
    context = distribute_lib.get_replica_context()
    replica = getattr(context, "_replica_id_in_sync_group", None)
    if not isinstance(replica, int):
        return None
    return strategy.extended.replica_without_data(replica)
