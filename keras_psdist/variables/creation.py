"""Where a new variable goes: the first link of the hook chain.

`PSExtended._create_variable` hands every variable Keras creates under a
parameter-server strategy to a `VariableCreator`, which decides:

| variable                              | becomes                                  |
|---------------------------------------|------------------------------------------|
| a model variable                      | a `PSVariable` on the parameter device   |
|                                       | the placement policy picks               |
| one the partitioner splits            | a `PartitionedVariable`: row shards, each|
|                                       | placed by the policy                     |
| an optimizer slot (`colocate_with`)   | beside its variable; split like it when  |
|                                       | the variable is partitioned and the slot |
|                                       | has its shape                            |
| `ON_READ` (a metric's total, count)   | one copy per replica, on its compute     |
|                                       | device, combined when read               |
| a trainable variable the `dense=`     | a `ReplicatedVariable`: one copy per     |
| chooser sends to `"all_reduce"`       | replica, on its compute device; its      |
|                                       | slots replicated like it                 |

Every placed variable and shard is recorded in the placement report. In
between-graph each one is opened by name on its ps task, shared
by every worker (`cluster.shared_variables`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from keras_psdist import dense_choice
from keras_psdist import partitioners as partitioners_lib
from keras_psdist import placement as placement_lib
from keras_psdist._tf import (
    device_util,
    distribute_utils,
    numpy_dataset,
)
from keras_psdist.cluster.runtime import Topology
from keras_psdist.cluster.shared_variables import SharedVariables
from keras_psdist.variables.delta_reads import DeltaReads
from keras_psdist.variables.partitioned import PartitionedVariable
from keras_psdist.variables.shard_layout import ShardLayout
from keras_psdist.variables.values import (
    PSVariable,
    ReplicaLocalVariable,
    ReplicatedVariable,
)

_REPLICA_LOCAL_CLASSES = {
    **distribute_utils.VARIABLE_CLASS_MAPPING,
    tf.VariableSynchronization.ON_READ: ReplicaLocalVariable,
}
_REPLICATED_CLASSES = {
    **distribute_utils.VARIABLE_CLASS_MAPPING,
    tf.VariableSynchronization.ON_WRITE: ReplicatedVariable,
}
_AGGREGATIONS = (
    tf.VariableAggregation.NONE,
    tf.VariableAggregation.SUM,
    tf.VariableAggregation.MEAN,
    tf.VariableAggregation.ONLY_FIRST_REPLICA,
)


class VariableCreator:
    """Creates, places and records a strategy's variables (see module doc).

    Args:
        strategy_fn: Returns the strategy the variables belong to.
        topology: Where the replicas and parameter devices are.
        policy: The placement function `(name, shape, dtype) -> device`.
        partitioner: A `keras_psdist.partitioners.Partitioner`, or None.
        shared: Between-graph, the `SharedVariables` that open variables on
            the ps tasks; else None.
        chooser: `(name, shape, dtype) -> "ps" | "all_reduce"` for each
            trainable variable no partitioner splits (see
            `keras_psdist.dense_choice`). Defaults to every one on a
            parameter device.
        delta_reads: Where replicas read large variables by their change
            (`read_compression=`), the copies that makes; else None.
    """

    def __init__(
        self,
        strategy_fn: Callable[[], tf.distribute.Strategy],
        topology: Topology,
        policy: placement_lib.PlacementFn,
        partitioner: partitioners_lib.Partitioner | None,
        shared: SharedVariables | None,
        chooser: dense_choice.ChooserFn = dense_choice.all_on_ps,
        delta_reads: DeltaReads | None = None,
    ):
        self._strategy_fn = strategy_fn
        self._compute_devices = topology.compute_devices
        self._parameter_devices = topology.parameter_devices
        self._policy = policy
        self.partitioner = partitioner
        self._shared = shared
        self.chooser = chooser
        self._delta_reads = delta_reads
        self.placement = placement_lib.Placement(self._parameter_devices)

    def create(self, next_creator, **kwargs) -> tf.Variable:
        """The variable for `tf.Variable(**kwargs)` under the strategy."""
        colocate_with = kwargs.pop("colocate_with", None)
        aggregation = kwargs.pop("aggregation", tf.VariableAggregation.NONE)
        if aggregation not in _AGGREGATIONS:
            raise ValueError(
                f"Invalid variable aggregation {aggregation!r} for variable "
                f"{kwargs.get('name')!r}. Expected one of: {list(_AGGREGATIONS)}."
            )
        kwargs["initial_value"], shape, dtype = _materialize_initial_value(kwargs)
        if kwargs.get("synchronization") == tf.VariableSynchronization.ON_READ:
            return self._create_replica_local(next_creator, aggregation, kwargs)
        name = kwargs.get("name") or "Variable"
        slot_of = None
        if isinstance(colocate_with, PartitionedVariable):
            if shape == colocate_with.shape:
                return self._create_partitioned(
                    next_creator,
                    kwargs,
                    dtype,
                    aggregation,
                    colocate_with.layout,
                    [s.device for s in colocate_with.shards],
                    slot_of=colocate_with.name,
                )
            # A slot of another shape (a factored moment) stays whole.
            colocate_with = colocate_with.shards[0]
        if isinstance(colocate_with, ReplicatedVariable):
            return self._create_replicated(
                next_creator, kwargs, aggregation, shape, dtype, colocate_with.name
            )
        if colocate_with is None:
            shards = self._num_shards(name, shape, dtype)
            if shards > 1:
                layout = ShardLayout(partitioners_lib.shard_rows(shape[0], shards))
                return self._create_partitioned(
                    next_creator, kwargs, dtype, aggregation, layout
                )
            # tf.Variable's trainable=None means True (ON_READ is handled above).
            trainable = kwargs.get("trainable") is not False
            if trainable and self._replicates(name, shape, dtype):
                return self._create_replicated(
                    next_creator, kwargs, aggregation, shape, dtype
                )
            device = self._place(name, shape, dtype)
        elif isinstance(colocate_with, numpy_dataset.SingleDevice):
            device = colocate_with.device
        else:
            device = colocate_with.device
            slot_of = colocate_with.name
        v = self._create_on(device, next_creator, kwargs, shape, dtype, name)
        self._record(v, slot_of)
        if self._delta_reads is not None and slot_of is None:
            self._delta_reads.track(
                v, next_creator, trainable=kwargs.get("trainable") is not False
            )
        return PSVariable(self._strategy_fn(), v, aggregation)

    def _replicates(self, name, shape, dtype):
        """Whether the chooser keeps this variable on every replica."""
        scope = tf.get_current_name_scope()
        path = f"{scope}/{name}" if scope else name
        return self.chooser(path, shape, dtype) == dense_choice.ALL_REDUCE

    def _num_shards(self, name, shape, dtype):
        try:
            return partitioners_lib.num_shards(self.partitioner, shape, dtype)
        except ValueError as e:
            raise ValueError(f"While partitioning variable {name!r}: {e}") from None

    def _place(self, name, shape, dtype):
        """The policy's device for a new variable, checked."""
        device = self._policy(name, shape, dtype)
        try:
            canonical = device_util.canonicalize(device)
        except (TypeError, ValueError):
            canonical = None
        if canonical not in self._parameter_devices:
            raise ValueError(
                f"The placement policy put variable {name!r} on {device!r}, which "
                f"is not a parameter device. Expected one of: "
                f"{list(self._parameter_devices)}."
            )
        return canonical

    def _create_on(self, device, next_creator, kwargs, shape, dtype, name):
        """One resource variable on `device` (shared by name between-graph)."""
        if self._shared is not None:
            # Named as a local variable would be: with its name scope, which
            # is Keras's path ("sequential/dense/kernel").
            scope = tf.get_current_name_scope()
            return self._shared.create(
                device,
                **{
                    **kwargs,
                    "shape": shape,
                    "dtype": dtype,
                    "name": f"{scope}/{name}" if scope else name,
                },
            )
        with tf.init_scope(), tf.device(None), tf.device(device):
            return next_creator(**kwargs)

    def _record(self, v, slot_of, shard=None):
        self.placement.record(
            placement_lib.PlacedVariable(
                name=v.name.split(":")[0],
                device=device_util.canonicalize(v.device),
                shape=tuple(v.shape.as_list()) if v.shape.rank is not None else (),
                dtype=v.dtype.name,
                bytes=placement_lib.variable_bytes(v.shape, v.dtype),
                slot_of=slot_of,
                shard=shard,
            )
        )

    def _create_partitioned(
        self,
        next_creator,
        kwargs,
        dtype,
        aggregation,
        layout,
        devices=None,
        slot_of=None,
    ):
        """A `PartitionedVariable`: one shard per block of rows of `layout`.

        A model variable's shards are placed one by one by the placement
        policy; a slot's shards go where its variable's are (`devices`).
        """
        name = kwargs.get("name") or "Variable"
        initial = kwargs["initial_value"]
        with tf.init_scope(), tf.device("/device:CPU:0"):
            initial = getattr(initial, "wrapped_value", initial)
            parts = layout.split(tf.convert_to_tensor(initial, dtype=dtype))
        shards = []
        logical = name
        for i, part in enumerate(parts):
            shard_name = f"{name}/part_{i}"
            if devices is None:
                device = self._place(shard_name, part.shape, dtype)
            else:
                device = devices[i]
            shard_kwargs = {**kwargs, "initial_value": part, "name": shard_name}
            shard_kwargs.pop("shape", None)
            v = self._create_on(
                device, next_creator, shard_kwargs, part.shape, dtype, shard_name
            )
            # The full name, with the name scope TF put in front (Keras's path).
            logical = v.name.split(":")[0].removesuffix(f"/part_{i}")
            self._record(
                v,
                slot_of,
                shard=placement_lib.Shard(
                    logical, i, layout.num_shards, layout.offsets[i]
                ),
            )
            shards.append(v)
        return PartitionedVariable(
            self._strategy_fn(), shards, layout, aggregation, logical
        )

    def _create_replicated(
        self, next_creator, kwargs, aggregation, shape, dtype, slot_of=None
    ):
        """A `ReplicatedVariable`: one copy per replica, on its compute
        device, all with the first copy's initial value (as `MirroredStrategy`).
        """
        if self._shared is not None:
            raise ValueError(
                "Replicated variables (dense='all_reduce') need one client "
                "that sees every replica: one host or mode='in-graph'. "
                "Between-graph workers (asynchronous PSStrategy, "
                "SyncReplicaStrategy) keep every variable on the ps tasks; "
                "leave dense= out there."
            )
        kwargs = {**kwargs, "synchronization": tf.VariableSynchronization.ON_WRITE}
        variable = self._create_per_replica(
            next_creator, aggregation, kwargs, _REPLICATED_CLASSES
        )
        first = variable.values[0]
        self.placement.record(
            placement_lib.PlacedVariable(
                name=first.name.split(":")[0],
                device=device_util.canonicalize(first.device),
                shape=tuple(shape.as_list()),
                dtype=dtype.name,
                bytes=placement_lib.variable_bytes(shape, dtype),
                slot_of=slot_of,
                synchronizer=dense_choice.ALL_REDUCE,
                replicas=tuple(
                    device_util.canonicalize(v.device) for v in variable.values
                ),
            )
        )
        return variable

    def _create_replica_local(self, next_creator, aggregation, kwargs):
        """An ON_READ variable (a metric's total and count): one copy per
        replica, on its compute device, combined when read.

        Keras updates metric state as `v.assign(v + delta)` in each replica,
        which is only right if each replica has its own copy; a shared copy
        would sum the old value n times. These are not parameters, so they are
        not in the placement report.
        """
        return self._create_per_replica(
            next_creator, aggregation, kwargs, _REPLICA_LOCAL_CLASSES
        )

    def _create_per_replica(self, next_creator, aggregation, kwargs, classes):
        """A distributed variable of `classes` (TF's mapping by
        synchronization): one component per compute device, each with the
        first one's initial value."""

        def create_components(**kw):
            components = []
            name = kw.get("name") or "Variable"
            for i, device in enumerate(self._compute_devices):
                component_kw = dict(kw)
                if i > 0:
                    component_kw["name"] = f"{name}/replica_{i}"
                    component_kw["initial_value"] = components[0].value()
                with tf.init_scope(), tf.device(None), tf.device(device):
                    components.append(next_creator(**component_kw))
            return components

        return distribute_utils.create_mirrored_variable(
            self._strategy_fn(),
            create_components,
            classes,
            distribute_utils.VARIABLE_POLICY_MAPPING,
            **{**kwargs, "aggregation": aggregation},
        )


def _materialize_initial_value(kwargs: dict[str, Any]):
    """Returns `(initial_value, shape, dtype)` with the shape known up front.

    The placement policy weighs a variable by its bytes before it exists, so a
    callable initial value (how Keras creates weights) is evaluated once here,
    eagerly, on the host.
    """
    initial_value = kwargs.get("initial_value")
    dtype = kwargs.get("dtype")
    shape = kwargs.get("shape")
    if callable(initial_value):
        with tf.init_scope(), tf.device("/device:CPU:0"):
            initial_value = initial_value()
    elif tf.is_symbolic_tensor(initial_value) and tf.executing_eagerly():
        initial_value = _lifted(initial_value, kwargs.get("name"))
    value = getattr(initial_value, "wrapped_value", initial_value)
    if shape is None:
        shape = getattr(value, "shape", None)
        if shape is None:
            value = tf.convert_to_tensor(value, dtype=dtype)
            shape = value.shape
    if dtype is None:
        dtype = getattr(value, "dtype", None) or tf.convert_to_tensor(value).dtype
    return initial_value, tf.TensorShape(shape), tf.as_dtype(dtype).base_dtype


def _lifted(tensor: tf.Tensor, name: str | None) -> tf.Tensor:
    """The value of a tensor of a traced step's graph, given as the initial
    value of a variable created in that step (which is made eagerly, outside
    it), as `tf.function` lifts such an initializer on one device: its
    constant value if TensorFlow folds it, else the ops that compute it
    copied out of the step and run once (`tf.random.normal([3])`, a read of
    another variable).

    Raises:
        ValueError: for a value computed from the step's inputs, which
            exists only when the step runs.
    """
    value = tf.get_static_value(tensor)
    if value is not None:
        return tf.constant(value, dtype=tensor.dtype)
    from keras_psdist import _tf

    step = tensor.graph
    inputs = {t.op for t in step.inputs if t not in step.internal_captures}

    def initial_value():
        copied = _tf.lift_to_graph.lift_to_graph(
            [tensor],
            tf.compat.v1.get_default_graph(),
            disallowed_placeholders=inputs,
            handle_captures=True,
        )
        return copied[tensor]

    try:
        return tf.function(initial_value, autograph=False)()
    except _tf.lift_to_graph.UnliftableError:
        raise ValueError(
            f"Variable {name or 'Variable'!r} is first created inside a traced "
            f"step with an initial value computed from the step's inputs "
            f"({tensor!r}); a variable is made once, outside the step, so its "
            "initial value must be known there. Pass a callable (as Keras's "
            "`add_weight` does: `tf.Variable(lambda: tf.zeros([3]) + 1.0)`) or "
            "a value that does not depend on the inputs, or create the variable "
            "before the first step."
        ) from None
