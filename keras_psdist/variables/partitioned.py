"""Partitioned variables: one logical variable stored as row shards.

A variable the strategy's partitioner splits (see `keras_psdist.partitioners`)
becomes a `PartitionedVariable`: `n` ordinary resource variables, each holding
a block of consecutive rows (axis 0) on a parameter device chosen by the
placement policy. Keras sees one `tf.Variable` of the full shape; every way it
touches a weight is routed to the shards:

| Keras / TF does                        | a partitioned variable does          |
|----------------------------------------|--------------------------------------|
| reads it (`Dense` kernel, `numpy()`)   | concatenates the shards' values      |
| `ops.take(v, ids, axis=0)` (Embedding),| gathers each row from the shard that |
| `tf.gather`, `tf.nn.embedding_lookup`  | owns it: only touched rows move      |
| `tape.gradient(loss, v)`               | one gradient of the full shape:      |
|                                        | `IndexedSlices` of the touched rows  |
|                                        | for lookups, dense for dense reads   |
| optimizer update (`extended.update`)   | runs once per shard, on its device,  |
|                                        | with the shard's rows of the gradient|
|                                        | and of every slot variable           |
| `assign`, `load_weights`, restore      | splits the value into the shards     |
| checkpoint, `model.save()`             | writes one unpartitioned tensor      |

Because the aggregator sees the gradient of the logical variable, every
Byzantine rule works unchanged: coordinate-wise rules are coordinate-wise
whether or not the rows are split, and whole-vector rules (Krum, geometric
median, centered clipping) measure distances over the whole gradient, all
variables and all shards together.

The optimizer update runs per shard under `shard_scope(layout, i)`: inside
it, this variable and its optimizer slots (which share its `ShardLayout`)
read and write shard `i` only, so Keras's optimizers, which do elementwise
arithmetic on a variable and its slots, work unchanged. An optimizer whose
update is not row-separable (Adafactor's factored moments, Lamb's and Muon's
whole-tensor norms) updates the whole variable instead: its reads gather the
shards and its writes split (`shard_updates.update_shards`,
`keras_psdist.partitioners`).

Examples:

>>> import keras, keras_psdist as kpd
>>> cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
>>> strategy = kpd.PSStrategy(
...     partitioner=kpd.partitioners.Fixed(2, min_variable_bytes=0))
>>> with strategy.scope():
...     table = keras.layers.Embedding(10, 4)
...     table.build((None,))
>>> table.embeddings.value.layout.rows
(5, 5)
>>> table(tf.constant([9, 0])).shape
TensorShape([2, 4])
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from keras_psdist._tf import (
    composite_tensor,
    composite_tensor_gradient,
    dispatch,
    distribute_lib,
    embedding_ops,
    resource_variable_ops,
    tensor_conversion_registry,
)
from keras_psdist.variables.shard_layout import ShardLayout
from keras_psdist.variables.shard_updates import current_shard
from keras_psdist.variables.staged_merge import in_replica_control_flow
from keras_psdist.variables.values import effective_aggregation


class PartitionedVariable(resource_variable_ops.BaseResourceVariable):
    """A variable stored as row shards on parameter devices (see module doc).

    Create it through a `PSStrategy` with a `partitioner`, never directly.
    `shards` are the resource variables; `layout` how the rows are split.
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        shards: Sequence[tf.Variable],
        layout: ShardLayout,
        aggregation: tf.VariableAggregation,
        name: str,
    ):
        self._distribute_strategy = strategy
        self._shards = list(shards)
        self._layout = layout
        self._aggregation = aggregation
        self._name = name
        first = self._shards[0]
        self._shape = tf.TensorShape([layout.num_rows]).concatenate(first.shape[1:])
        self._dtype = first.dtype
        self._trainable = first.trainable
        self._unique_id = f"{name}/partitioned_{id(self)}"
        self._handle_name = f"{name}:0"
        self._replica_aggregation = effective_aggregation(aggregation, self._dtype)

    # ----------------------------------------------------------- identity

    @property
    def shards(self) -> list[tf.Variable]:
        """The shard variables, in row order."""
        return list(self._shards)

    @property
    def layout(self) -> ShardLayout:
        return self._layout

    @property
    def distribute_strategy(self):
        return self._distribute_strategy

    @property
    def name(self) -> str:
        return self._handle_name

    @property
    def _shared_name(self) -> str:
        return self._name

    @property
    def shape(self) -> tf.TensorShape:
        return self._shape

    def get_shape(self) -> tf.TensorShape:
        return self._shape

    @property
    def dtype(self) -> tf.DType:
        return self._dtype

    @property
    def trainable(self) -> bool:
        return self._trainable

    @property
    def device(self) -> str:
        target = self._target()
        return (target or self._shards[0]).device

    @property
    def aggregation(self):
        return self._aggregation

    @property
    def synchronization(self):
        return self._shards[0].synchronization

    @property
    def constraint(self):
        return None

    @property
    def graph(self):
        return self._shards[0].graph

    @property
    def _in_graph_mode(self):
        return False

    def is_initialized(self, name=None):
        return tf.reduce_all([s.is_initialized() for s in self._shards])

    def _should_act_as_resource_variable(self):
        """Passes `resource_variable_ops.is_resource_variable`."""

    def __repr__(self) -> str:
        devices = ", ".join(s.device for s in self._shards)
        return (
            f"<PartitionedVariable {self._name!r} shape={self._shape} "
            f"dtype={self._dtype.name} rows={list(self._layout.rows)} "
            f"devices=[{devices}]>"
        )

    __str__ = __repr__

    def __deepcopy__(self, memo):
        raise TypeError(
            f"A partitioned variable ({self._name!r}) cannot be deep-copied. "
            "Copy its value instead: `tf.Variable(v.numpy())`."
        )

    # -------------------------------------------------------------- reads

    def _target(self):
        """The shard this variable stands for inside `shard_scope`, else None."""
        current = current_shard()
        if current is None:
            return None
        layout, index = current
        if layout is not self._layout:
            raise ValueError(
                f"Partitioned variable {self._name!r} was used while updating "
                "a variable partitioned differently. An optimizer update may "
                "only touch the variable and its own slot variables. If this "
                "optimizer's slots do not have the variable's shape (e.g. "
                "Adafactor), train this model without a partitioner."
            )
        return self._shards[index]

    @property
    def handle(self):
        target = self._target()
        if target is not None:
            return target.handle
        return ShardHandles(self)

    def value(self):
        target = self._target()
        if target is not None:
            return target.value()
        return tf.concat([s.value() for s in self._shards], axis=0)

    def read_value(self):
        target = self._target()
        if target is not None:
            return target.read_value()
        return tf.identity(self.value())

    def read_value_no_copy(self):
        return self.read_value()

    def _dense_var_to_tensor(self, dtype=None, name=None, as_ref=False):
        del as_ref
        value = self.value()
        if dtype is not None and not tf.as_dtype(dtype).is_compatible_with(value.dtype):
            raise ValueError(
                f"Incompatible type conversion requested to type {dtype!r} for "
                f"partitioned variable {self._name!r} of dtype "
                f"{value.dtype.name}."
            )
        return value

    def sparse_read(self, indices, name=None):
        """Rows `indices` (axis 0), each read on the shard that owns it."""
        target = self._target()
        if target is not None:
            return target.sparse_read(indices, name=name)
        return self._layout.gather(self._shards, indices, self._name)

    def numpy(self):
        return np.concatenate([s.numpy() for s in self._shards], axis=0)

    def __array__(self, dtype=None, copy=None):
        del copy  # `numpy()` is always a fresh array.
        return np.asarray(self.numpy(), dtype=dtype)

    # ------------------------------------------------------------- writes

    def assign(self, value, use_locking=None, name=None, read_value=True):
        return self._write("assign", value, use_locking, name, read_value)

    def assign_add(self, delta, use_locking=None, name=None, read_value=True):
        return self._write("assign_add", delta, use_locking, name, read_value)

    def assign_sub(self, delta, use_locking=None, name=None, read_value=True):
        return self._write("assign_sub", delta, use_locking, name, read_value)

    def scatter_add(self, sparse_delta, use_locking=False, name=None):
        return self._scatter("scatter_add", sparse_delta, use_locking, name)

    def scatter_sub(self, sparse_delta, use_locking=False, name=None):
        return self._scatter("scatter_sub", sparse_delta, use_locking, name)

    def scatter_update(self, sparse_delta, use_locking=False, name=None):
        return self._scatter("scatter_update", sparse_delta, use_locking, name)

    def _write(self, method, value, use_locking, name, read_value):
        target = self._target()
        if target is not None:
            return getattr(target, method)(
                value, use_locking=use_locking, name=name, read_value=read_value
            )
        with distribute_lib.enter_or_assert_strategy(self._distribute_strategy):
            if distribute_lib.in_cross_replica_context():
                return self._write_shards(method, value, use_locking, read_value)
            return self._write_in_replica(method, value, use_locking, read_value)

    def _write_in_replica(self, method, value, use_locking, read_value):
        """A write during a step (a layer's own weight, an optimizer's
        accumulator): the replicas' values are combined as the aggregation
        says and written once."""
        extended = self._distribute_strategy.extended
        if in_replica_control_flow():
            # Inside a replica's `cond` (gradient accumulation): staged.
            return extended.staged_apply(
                self._replica_aggregation,
                (value,),
                {},
                apply=lambda a, kw: self._write_shards(
                    method, a[0], use_locking, read_value
                ),
                stand_in=self.value,
            )

        def merge_fn(strategy, v):
            combined = strategy.extended.combine_for_variable(
                self._replica_aggregation, v, self
            )
            return self._write_shards(method, combined, use_locking, read_value)

        return distribute_lib.get_replica_context().merge_call(merge_fn, args=(value,))

    def _write_shards(self, method, value, use_locking, read_value):
        value = tf.convert_to_tensor(value, dtype=self._dtype)
        if not value.shape.is_compatible_with(self._shape):
            raise ValueError(
                f"Cannot {method} a value of shape {value.shape} to partitioned "
                f"variable {self._name!r} of shape {self._shape}."
            )
        ops = []
        for shard, part in zip(self._shards, self._layout.split(value), strict=True):
            with tf.device(shard.device):
                ops.append(
                    getattr(shard, method)(
                        part, use_locking=use_locking, read_value=False
                    )
                )
        if read_value:
            return self
        return tf.group(*ops) if not tf.executing_eagerly() else None

    def _scatter(self, method, sparse_delta, use_locking, name):
        target = self._target()
        if target is not None:
            return getattr(target, method)(sparse_delta, use_locking, name)
        if not isinstance(sparse_delta, tf.IndexedSlices):
            raise TypeError(
                f"{method} needs tf.IndexedSlices. Received: {type(sparse_delta)}"
            )
        for shard, part in zip(
            self._shards, self._layout.split(sparse_delta), strict=True
        ):
            with tf.device(shard.device):
                getattr(shard, method)(part, use_locking)
        return self

    # --------------------------------------------------------- checkpoints

    def _serialize_to_tensors(self):
        # One unpartitioned tensor: restores into any shard count, or into an
        # unpartitioned variable.
        with tf.device("/device:CPU:0"):
            return {"VARIABLE_VALUE": self.value()}

    def _restore_from_tensors(self, restored_tensors):
        value = restored_tensors["VARIABLE_VALUE"]
        return self._write_shards("assign", value, None, read_value=False)

    def _copy_trackable_to_cpu(self, object_map):
        object_map[self] = tf.Variable(self.value(), name=self._name)

    def _export_to_saved_model_graph(self, object_map, tensor_map, options, **kw):
        raise NotImplementedError(
            f"SavedModel export of partitioned variable {self._name!r} is not "
            "supported. Save the model with `model.save('model.keras')` (which "
            "writes unpartitioned weights), load it without the strategy and "
            "export that copy."
        )


class ShardHandles(composite_tensor.CompositeTensor):
    """What `PartitionedVariable.handle` returns: the shards' handles.

    `GradientTape.gradient(loss, variable)` differentiates with respect to a
    variable's handle. This composite hands the tape every shard's handle and
    joins the shards' gradients back into one gradient of the full shape
    (`ShardLayout.join`): sparse rows stay sparse.
    """

    def __init__(self, variable: PartitionedVariable):
        self._variable = variable
        self._handles = [s.handle for s in variable.shards]

    @property
    def _type_spec(self):
        raise NotImplementedError(
            "The handle of a partitioned variable is only a gradient source."
        )

    @property
    def dtype(self):
        return tf.resource

    class _Gradient(composite_tensor_gradient.CompositeTensorGradient):
        def get_gradient_components(self, value):
            return list(value._handles)

        def replace_gradient_components(self, value, component_grads):
            v = value._variable
            return v.layout.join(list(component_grads), v.shape, v.dtype)

    __composite_gradient__ = _Gradient()


def _tensor_conversion(var, dtype=None, name=None, as_ref=False):
    return var._dense_var_to_tensor(dtype=dtype, name=name, as_ref=as_ref)


tensor_conversion_registry.register_tensor_conversion_function(
    PartitionedVariable, _tensor_conversion
)


# `tf.nn.embedding_lookup` and `safe_embedding_lookup_sparse` colocate with
# their table's handle, which a partitioned variable does not have as one
# tensor. As for TF's `ShardedVariable`, they look up in the list of shards
# instead: TF's "div" partitioning is the shards' layout.


dispatch.register_dispatchable_type(PartitionedVariable)


@dispatch.dispatch_for_api(
    embedding_ops.embedding_lookup, {"params": PartitionedVariable}
)
def _embedding_lookup(
    params,
    ids,
    partition_strategy="mod",
    name=None,
    validate_indices=True,
    max_norm=None,
):
    # One logical table: `partition_strategy` only means something for a
    # list of tables, so the shards' own ("div") layout applies.
    del partition_strategy
    if isinstance(params, (list, tuple)):
        (params,) = params
    return embedding_ops.embedding_lookup(
        params.shards, ids, "div", name, validate_indices, max_norm
    )


@dispatch.dispatch_for_api(
    embedding_ops.safe_embedding_lookup_sparse,
    {"embedding_weights": PartitionedVariable},
)
def _safe_embedding_lookup_sparse(
    embedding_weights,
    sparse_ids,
    sparse_weights=None,
    combiner="mean",
    default_id=None,
    name=None,
    partition_strategy="div",
    max_norm=None,
    allow_fast_lookup=False,
):
    del partition_strategy
    return embedding_ops.safe_embedding_lookup_sparse(
        embedding_weights.shards,
        sparse_ids,
        sparse_weights=sparse_weights,
        combiner=combiner,
        default_id=default_id,
        name=name,
        partition_strategy="div",
        max_norm=max_norm,
        allow_fast_lookup=allow_fast_lookup,
    )
