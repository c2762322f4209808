"""`PSExtended`: the hook chain of a parameter-server strategy on one host.

    _create_variable       -> placement policy picks the parameter device;
                              slots follow `colocate_vars_with`
    _call_for_each_replica -> one replica thread per compute device
    _batch_reduce_to /     -> the aggregator over all replicas' values of a
    _reduce_to                step, computed on a parameter device
    _update                -> the optimizer update runs on the variable's device
                              (on every copy of a replicated variable)
    optimizer_update       -> Keras's update step, the optimizer known (a
                              partitioned variable updates shard by shard)
    run.mode.services      -> once: what the process runs beside Keras's
                              step (`services`: heartbeats, slots, and its
                              `training`, a `keras_psdist.modes.Training`)

Variables exist once (a `PSVariable` on a parameter device); replicas read it
there. There is no mirrored copy to keep in sync, so an update is one op per
variable instead of one per replica. With `dense="all_reduce"` the dense
trainable variables are instead `ReplicatedVariable`s, one copy per replica
(see `keras_psdist.dense_choice`): the reduced gradient reaches every
replica and each updates its own copy.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import numpy as np
import tensorflow as tf

from keras_psdist import dense_choice
from keras_psdist import partitioners as partitioners_lib
from keras_psdist import placement as placement_lib
from keras_psdist._tf import (
    cross_device_ops_lib,
    distribute_lib,
    distribute_utils,
    mirrored_run,
    numpy_dataset,
    ps_values,
    resource_variable_ops,
    values,
)
from keras_psdist.aggregators import Aggregator
from keras_psdist.attacks.harness import corrupting_batches
from keras_psdist.cluster.runtime import Topology
from keras_psdist.cluster.shared_variables import SharedVariables
from keras_psdist.distribute.all_reduce import ReplicatedAllReduce
from keras_psdist.distribute.cross_replica import CrossReplicaReductions
from keras_psdist.distribute.input import InputPipelines
from keras_psdist.distribute.packed_transfers import PackedReads, move_together
from keras_psdist.distribute.reduction import GradientReduction
from keras_psdist.distribute.replica_batches import ReplicaBatches
from keras_psdist.distribute.replica_writes import (
    ReplicaWrites,
)
from keras_psdist.distribute.run import Run
from keras_psdist.gradients.wire import WireCompression
from keras_psdist.variables import row_separable
from keras_psdist.variables.creation import VariableCreator
from keras_psdist.variables.delta_reads import DeltaReads
from keras_psdist.variables.partitioned import PartitionedVariable
from keras_psdist.variables.shard_updates import update_shards
from keras_psdist.variables.staged_merge import StagedMerge
from keras_psdist.variables.values import ReplicatedVariable

ReduceOp = tf.distribute.ReduceOp


class PSExtended(
    CrossReplicaReductions, ReplicaWrites, distribute_lib.StrategyExtendedV1
):
    """Implementation of `PSStrategy` (see its docstring for the user view)."""

    def __init__(self, container_strategy: tf.distribute.Strategy, run: Run):
        """Builds the run's every collaborator; nothing is set from outside.

        Args:
            container_strategy: The strategy this implements.
            run: The run, as the strategy's front described it.
        """
        super().__init__(container_strategy)
        topology = run.topology
        self._mode = run.mode
        self._read_dtype = run.read_dtype
        self._delta_reads = (
            DeltaReads(run.read_compression, topology.compute_devices)
            if run.read_compression is not None
            else None
        )
        self._topology = topology
        self._compute_devices = topology.compute_devices
        self._parameter_devices = topology.parameter_devices
        self._host_device = topology.client_device
        self._input_host_device = numpy_dataset.SingleDevice(self._host_device)
        self._inputs = InputPipelines(topology)
        self._shared = None
        if topology.between_graph:
            self._shared = SharedVariables(
                is_chief=topology.is_chief,
                chief=topology.chief_name,
                init_timeout=run.init_timeout,
            )
        self._reduction_device = topology.reduction_device
        self._reduction = GradientReduction(
            run.aggregator,
            run.attack,
            self._reduction_device,
            len(self._compute_devices),
            # Between-graph, a worker combines its own replicas' gradients.
            spread_devices=() if topology.between_graph else self._parameter_devices,
            worker_momentum=run.worker_momentum,
            # Each replica's momentum on its own device, where that spreads
            # the work (GPUs, tasks); logical CPUs of one task share the
            # memory and the cores, so fused updates of all replicas' buffers
            # where the rule runs win (measured: mean + worker momentum
            # 1.33x -> 1.23x the mean).
            replica_devices=(
                None
                if dense_choice.share_memory(
                    [*self._compute_devices, self._reduction_device]
                )
                else self._compute_devices
            ),
            # Compression always on each replica's own device: what crosses
            # to the reduction device is the compressed payload. Between
            # graphs, what crosses the network is the worker's combined
            # gradient, on its way to the ps tasks: compressed there.
            compression=None if topology.between_graph else run.compression,
            compute_devices=self._compute_devices,
        )
        self._wire = (
            WireCompression(run.compression, self._reduction_device, _parameter_device)
            if topology.between_graph and run.compression is not None
            else None
        )
        self._creator = VariableCreator(
            self._container_strategy,
            topology,
            placement_lib.get_policy(run.placement, self._parameter_devices),
            partitioners_lib.get(run.partitioner),
            self._shared,
            dense_choice.get_chooser(
                run.dense,
                self._compute_devices,
                self._parameter_devices,
                plain_mean=self._reduction.is_plain_mean,
                between_graph=topology.between_graph,
            ),
            delta_reads=self._delta_reads,
        )
        # Replicated variables' gradients under the plain mean: TF's own
        # all-reduce (NCCL among GPUs), no central rule needed.
        self._all_reduce = (
            ReplicatedAllReduce(self._compute_devices)
            if self._reduction.is_plain_mean
            and not isinstance(self._creator.chooser, dense_choice.AllOnPS)
            else None
        )
        self._gather_ops = cross_device_ops_lib.ReductionToOneDevice(
            reduce_to_device=self._reduction_device
        )
        self._staged = StagedMerge(self._reduction_device)
        # A step's tensors from one task to another travel as one (see
        # `packed_transfers.py`); False moves one per variable each way.
        self._packed_reads = PackedReads()
        # The gradients the reduction returned in the steps being traced
        # (see `as_reduced`).
        self._reduced = set()
        self.pack_transfers = True
        # The per-replica batches of the step being traced (their shares,
        # which replicas have none; see `replica_batches.py`), else None.
        self._batches = None
        # TensorFlow's iterator (`distribute_datasets_from_function`) may
        # then leave replicas without data at the end; `replica_batches.py`
        # fills them.
        self.experimental_enable_get_next_as_optional = True
        # Sync replicas: the attack this worker process runs when it is one
        # of the attacked workers.
        self.worker_attack = run.worker_attack
        # What this process runs beside Keras's step, as its mode started
        # it: server watch, heartbeats, slots, its `Training` (see
        # `keras_psdist.distribute.run.RunServices`).
        self.services = run.mode.services(container_strategy, run, self._shared)
        # The rule's state, for checkpoints (see `training_state`).
        self._training_state = tf.Module(name="training_state")
        self._training_state.reduction = self._reduction.state
        if self._wire is not None:
            self._training_state.wire = self._wire.state
        for name, state in self.services.checkpointed().items():
            setattr(self._training_state, name, state)

    # ---------------------------------------------------------------- state

    @property
    def sync_training(self) -> Any:
        """This process's part in its mode's training beyond Keras's step (a
        `keras_psdist.modes.Training`: sync replicas, bounded staleness,
        elastic async), else None: `services.training`. Its `counts()` say
        what happened to the run's gradients."""
        return self.services.training

    @property
    def registry(self) -> Any:
        """Elastic runs (`max_workers`): who trains, a
        `keras_psdist.cluster.elastic.SlotTable` (`ask_to_leave(k)`,
        `members()`); else None: `services.registry`."""
        return self.services.registry

    @property
    def heartbeats(self) -> Any:
        """Between-graph runs: this process's heartbeat and its view of the
        others' (`keras_psdist.cluster.liveness.Heartbeats`); else None:
        `services.heartbeats`."""
        return self.services.heartbeats

    @property
    def server_watch(self) -> Any:
        """Cluster runs: ends this process if a server task is lost and it
        does not stop by itself (`keras_psdist.cluster.task_loss`); else
        None: `services.server_watch`."""
        return self.services.server_watch

    @property
    def placement(self) -> placement_lib.Placement:
        """Where each variable was placed and the bytes per device."""
        return self._creator.placement

    @property
    def all_reduce_ops(self) -> tf.distribute.CrossDeviceOps | None:
        """TensorFlow's cross-device ops that sum the replicated variables'
        gradients under the plain mean (`CollectiveAllReduce` across the
        worker tasks of an in-graph cluster, NCCL among local GPUs, else a
        reduction to one device); None when nothing can be replicated or a
        robust rule reduces."""
        return None if self._all_reduce is None else self._all_reduce.cross_device_ops

    @property
    def dense_decisions(self) -> list[dense_choice.Decision]:
        """Under `dense="auto"`, each variable's choice and why; else []."""
        return list(getattr(self._creator.chooser, "decisions", []))

    @property
    def partitioner(self) -> partitioners_lib.Partitioner | None:
        """How large variables are split into row shards, or None."""
        return self._creator.partitioner

    @property
    def shared_variables(self) -> SharedVariables | None:
        """Between-graph: opens (on the chief, creates) variables shared by
        every worker on the ps tasks; else `None`."""
        return self._shared

    @property
    def mode(self) -> Any:
        """The run's `keras_psdist.modes.Mode`."""
        return self._mode

    @property
    def topology(self) -> Topology:
        """Where the replicas, inputs and parameters are (one host or a cluster)."""
        return self._topology

    @property
    def step_device(self) -> str | None:
        """The device to call a step function on, or `None` (the caller's).

        In-graph across a cluster, the first worker's host: `fit`,
        `evaluate` and `train_on_batch` call Keras's step there, so that a
        step's loop and checks run beside the replicas rather than on the
        chief. A custom loop does the same with
        `with tf.device(strategy.extended.step_device): step(iterator)`
        (`tf.device(None)` is no scope). See `Topology.step_host`.
        """
        return self._topology.step_host

    @property
    def aggregator(self) -> Aggregator:
        """The rule `batch_reduce_to` applies to per-replica values (sync
        replicas: a `SyncReplicaAggregation`, whose `rule` the chief applies
        across workers)."""
        return self._reduction.aggregator

    @property
    def attack(self) -> Any:
        """The simulated attack on some replicas, or `None`."""
        return self._reduction.attack

    @property
    def training_state(self) -> tf.Module:
        """The training state beside the model's and optimizer's variables.

        The aggregator's state between steps (centered clipping's centre,
        each replica's momentum under `worker_momentum`, each replica's
        error-feedback residuals under `compression`), also that of a
        sync-replica chief's update service. `BackupAndRestore` saves and
        restores it beside the weights; a custom loop checkpoints it with
        `tf.train.Checkpoint(model=model, optimizer=optimizer,
        aggregation=strategy.extended.training_state)`. Its variables appear
        when the first step is traced; a checkpoint read earlier restores
        them then.
        """
        return self._training_state

    @property
    def worker_momentum(self) -> float:
        """Each replica's momentum of its gradients (0: the rule sees gradients)."""
        return self._reduction.worker_momentum

    @property
    def read_dtype(self) -> tf.DType | None:
        """The dtype a replica's reads of variables on another task travel
        in (`PSStrategy(read_dtype=...)`, see
        `keras_psdist.variables.narrow_reads`), or `None`: as they are."""
        return self._read_dtype

    @property
    def read_compression(self) -> Any:
        """The top-k that picks the changes a replica on another task reads
        of a large variable (`PSStrategy(read_compression=...)`, see
        `keras_psdist.variables.delta_reads`), or `None`: reads whole."""
        return None if self._delta_reads is None else self._delta_reads.compressor

    @property
    def pack_transfers(self) -> bool:
        """Whether a step's tensors from one task to another travel as one
        (reads and gradients per ps task; see `packed_transfers.py`). On by
        default; set it to `False` before a step is traced to move one
        tensor per variable each way."""
        return self._pack_transfers

    @pack_transfers.setter
    def pack_transfers(self, value: bool) -> None:
        self._pack_transfers = bool(value)
        self._reduction.pack_transfers = bool(value)

    @property
    def packed_reads(self) -> PackedReads | None:
        """The packed reads of the steps being traced (`None` when
        `pack_transfers` is off)."""
        return self._packed_reads if self._pack_transfers else None

    @property
    def delta_reads(self) -> DeltaReads | None:
        """The replicas' copies of the variables they read by their change,
        or `None` without `read_compression`."""
        return self._delta_reads

    @property
    def wire(self) -> WireCompression | None:
        """Between graphs with compression: what compresses each gradient a
        worker sends (to the ps tasks, or to the chief's queue), and holds
        its residuals; else `None`."""
        return self._wire

    @property
    def compression(self) -> Any:
        """What each replica sends instead of its gradient (a
        `keras_psdist.compression.Compressor`; between graphs, what each
        worker sends to the ps tasks), or `None`."""
        if self._wire is not None:
            return self._wire.compressor
        return self._reduction.compression

    def report(self) -> dict[str, np.ndarray]:
        """What the aggregator did in the last step, per replica.

        `name -> array of shape [num_replicas]`, e.g. Krum's `selected` or the
        median's `extreme_fraction`; empty for `mean`. See
        `keras_psdist.callbacks.AggregationReport` to log it.
        """
        return self._reduction.report()

    @property
    def report_variables(self) -> dict[str, tf.Variable]:
        """The variables behind `report()`, readable inside `tf.function`."""
        return self._reduction.report_variables

    # ------------------------------------------------------------ variables

    def _create_variable(self, next_creator, **kwargs):
        # A variable first made inside a traced step (a model built by its
        # first call, an optimizer by its first `apply_gradients`) is made
        # once, eagerly, as outside the step: TF's `init_scope`, as Keras
        # lifts its own deferred variables. The step then reads it where it
        # lives, as any other.
        # A ps lost while the model is built: an error that names it.
        with tf.init_scope(), self.services.reporting_lost_tasks():
            return self._creator.create(next_creator, **kwargs)

    def colocate_vars_with(self, colocate_with_variable):
        # Checked before TF's own scope check, whose message ("Need to be
        # inside strategy.scope()") hides the usual cause: a model built
        # outside the scope.
        if not isinstance(colocate_with_variable, numpy_dataset.SingleDevice):
            _unwrap(colocate_with_variable)
        if distribute_lib.get_strategy() is not self._container_strategy():
            # A Keras optimizer of this strategy building its slots in a step
            # called outside the scope (a training loop from scratch, the
            # model and optimizer made under the scope): the slots are this
            # strategy's as the optimizer is, so its scope is entered here.
            return self._colocated_in_scope(colocate_with_variable)
        return super().colocate_vars_with(colocate_with_variable)

    @contextlib.contextmanager
    def _colocated_in_scope(self, colocate_with_variable):
        with (
            self._container_strategy().scope(),
            super().colocate_vars_with(colocate_with_variable),
        ):
            yield

    def _validate_colocate_with_variable(self, colocate_with_variable):
        distribute_utils.validate_colocate(colocate_with_variable, self)

    def value_container(self, val):
        container = getattr(val, "_distributed_container", None)
        if container is not None and isinstance(container(), ReplicatedVariable):
            return container()
        if hasattr(val, "_aggregating_container") and not isinstance(
            val, ps_values.AggregatingVariable
        ):
            wrapper = val._aggregating_container()
            if wrapper is not None:
                return wrapper
        return val

    def read_var(self, var):
        return tf.identity(var)

    # ------------------------------------------------------------- replicas

    def _call_for_each_replica(self, fn, args, kwargs):
        # Shares are read before stand-ins fill empty batches (see
        # `replica_batches.py`): a replica without data weighs 0.
        batches = ReplicaBatches(args, kwargs, self._num_replicas_in_sync)
        args, kwargs = batches.with_stand_ins(args, kwargs or {})
        previous = self._batches
        self._batches = batches
        packed = self._packed_variables(fn)
        fn = self._with_data_attack(fn)
        try:
            with self._packed_reads.step(packed):
                outputs = mirrored_run.call_for_each_replica(
                    self._container_strategy(), fn, args, kwargs
                )
        finally:
            self._batches = previous
            if previous is None:
                self._reduced.clear()
        return batches.trim_outputs(
            self._one_value_per_replica(outputs), zero_the_rest=not _is_keras_step(fn)
        )

    def _packed_variables(self, fn) -> list[tf.Variable]:
        """The variables whose reads in `fn`'s step come packed per ps
        task: a Keras step's model's trainable parameter-server variables
        (what its forward pass reads); none for other functions, whose
        reads are not known in advance."""
        if (
            not self._pack_transfers
            or self._delta_reads is not None
            or tf.executing_eagerly()  # a step run eagerly reads each alone
        ):
            return []
        model = _keras_step_model(fn)
        if model is None:
            return []
        out = []
        for variable in model.trainable_variables:
            variable = getattr(variable, "value", variable)  # a Keras variable's
            if isinstance(variable, ps_values.AggregatingVariable):
                out.append(variable.get())
        return out

    def _one_value_per_replica(self, outputs):
        """TF's regroup keeps an output every replica returned as the same
        object as that one object: here, where a variable exists once, that
        is every read of a variable (`strategy.run(lambda: v.value)`), which
        MirroredStrategy gives as one component per replica. Such tensors and
        variables become `Mirrored`, so `.values` and
        `experimental_local_results` give one per replica, as there."""
        n = self._num_replicas_in_sync
        if n == 1:
            return outputs

        def per_replica(x):
            if isinstance(x, (tf.Tensor, tf.Variable)) and not isinstance(
                x, values.DistributedValues
            ):
                return values.Mirrored((x,) * n)
            return x

        return tf.nest.map_structure(per_replica, outputs)

    def _with_data_attack(self, fn):
        """`fn` with the attacked replicas' batches corrupted (data attacks)."""
        if self.worker_attack is not None:
            # An attacked worker process corrupts every one of its replicas.
            attacked = range(self._num_replicas_in_sync)
            return corrupting_batches(fn, self.worker_attack, attacked)
        if self.attack is None:
            return fn
        return corrupting_batches(fn, self.attack, self.attack.replicas)

    # --------------------------------------------------------------- update

    def _update(self, var, fn, args, kwargs, group):
        inner = _unwrap(var)
        self._packed_reads.wrote(inner)
        if isinstance(inner, ReplicatedVariable):
            return self._update_replicated(inner, fn, args, kwargs, group)
        if isinstance(inner, PartitionedVariable):
            results = update_shards(
                inner,
                fn,
                self._select_single_value(args),
                self._select_single_value(kwargs),
            )
            return _grouped(results, group)
        with tf.device(inner.device), distribute_lib.UpdateContext(inner.device):
            result = fn(
                inner,
                *self._select_single_value(args),
                **self._select_single_value(kwargs),
            )
            if group:
                return result
            return tf.nest.map_structure(self._local_results, result)

    def _update_replicated(self, var, fn, args, kwargs, group):
        """`fn` on every copy, each with its replica's value of the arguments
        (as `MirroredStrategy`): the copies take the same update."""
        updates = []
        for i, component in enumerate(var.values):
            with (
                tf.device(component.device),
                distribute_lib.UpdateContext(i),
                tf.name_scope(f"update_{i}"),
            ):
                updates.append(
                    fn(
                        component,
                        *distribute_utils.select_replica(i, args),
                        **distribute_utils.select_replica(i, kwargs),
                    )
                )
        return distribute_utils.update_regroup(self, updates, group)

    def optimizer_update(self, optimizer, grads_and_vars, learning_rate) -> None:
        """Keras's update step of `optimizer` (its `_distributed_tf_update_step`,
        which hands it here): one `update` per variable, with the optimizer
        passed along, so a partitioned variable can tell whether its update
        may run shard by shard (`variables.row_separable`). Between graphs
        with compression, each gradient travels compressed to its variable's
        ps task (`keras_psdist.gradients.wire`), unless the mode's workers
        send it another way (`Mode.compresses_applied_gradients`: the sync
        chief applies the aggregate as it is). Otherwise, with
        `pack_transfers`, the gradients for each ps task travel there as one
        tensor (`packed_transfers.py`), each taken where the reduction left
        it (`as_reduced`)."""
        if self._wire is not None and self._mode.compresses_applied_gradients:
            grads_and_vars = self._wire(
                [(self._select_single_value(g), v) for g, v in grads_and_vars]
            )
        elif self._pack_transfers:
            grads_and_vars = self._pushed_together(grads_and_vars)
        for grad, var in grads_and_vars:
            self.update(
                var,
                row_separable.optimizer_update_step,
                args=(grad, learning_rate),
                kwargs={"optimizer": optimizer},
                group=False,
            )

    def _pushed_together(self, grads_and_vars):
        """`grads_and_vars` with the dense gradients of each ps task's
        variables moved there as one tensor (see `packed_transfers.py`);
        a partitioned or replicated variable's gradient as it was."""
        pairs = list(grads_and_vars)
        by_device: dict[str, list[int]] = {}
        for i, (grad, var) in enumerate(pairs):
            inner = _unwrap(var)
            if isinstance(inner, (PartitionedVariable, ReplicatedVariable)):
                continue
            grad = self.as_reduced(self._select_single_value(grad))
            pairs[i] = (grad, var)
            if isinstance(grad, tf.Tensor):
                by_device.setdefault(inner.device, []).append(i)
        for device, indices in by_device.items():
            moved = move_together([pairs[i][0] for i in indices], device)
            for i, grad in zip(indices, moved, strict=True):
                pairs[i] = (grad, pairs[i][1])
        return pairs

    def _update_non_slot(self, colocate_with, fn, args, kwargs, group):
        with (
            tf.device(colocate_with.device),
            distribute_lib.UpdateContext(colocate_with),
        ):
            result = fn(*args, **kwargs)
            if group:
                return result
            return tf.nest.map_structure(self._local_results, result)

    def _select_single_value(self, structured):
        def select(x):
            if isinstance(x, (values.Mirrored, values.PerReplica)):
                return x._primary
            return x

        return tf.nest.map_structure(select, structured)

    # ---------------------------------------------------------------- input

    def _input_workers_with_options(self, options=None):
        return self._inputs.input_workers(options)

    @property
    def _input_workers(self):
        return self._input_workers_with_options()

    def _experimental_distribute_dataset(self, dataset, options):
        return self._inputs.distribute_dataset(dataset, options)

    def _distribute_datasets_from_function(self, dataset_fn, options):
        return self._inputs.distribute_datasets_from_function(dataset_fn, options)

    def _experimental_make_numpy_dataset(self, numpy_input, session):
        return numpy_dataset.one_host_numpy_dataset(
            numpy_input, self._input_host_device, session
        )

    def _experimental_distribute_values_from_function(self, value_fn):
        per_replica = [
            value_fn(distribute_lib.ValueContext(i, self._num_replicas_in_sync))
            for i in range(self._num_replicas_in_sync)
        ]
        return distribute_utils.regroup(per_replica, always_wrap=True)

    # ------------------------------------------------------------ topology

    @property
    def _num_replicas_in_sync(self):
        return len(self._compute_devices)

    @property
    def worker_devices(self):
        return self._compute_devices

    @property
    def worker_devices_by_replica(self):
        return [[d] for d in self._compute_devices]

    @property
    def parameter_devices(self):
        return self._parameter_devices

    def non_slot_devices(self, var_list):
        return min(var_list, key=lambda x: x.name)

    def _in_multi_worker_mode(self):
        # TF means "collectives across client processes" by this (its input
        # pipelines then agree on the end of data across clients). In-graph,
        # one client sees every worker's pipeline; async workers never agree.
        return False

    @property
    def experimental_between_graph(self):
        return self._topology.between_graph

    @property
    def experimental_should_init(self):
        return self._topology.is_chief

    @property
    def should_checkpoint(self):
        return self._topology.is_chief

    @property
    def should_save_summary(self):
        return self._topology.is_chief

    @property
    def _global_batch_size(self):
        return True

    def _get_local_replica_id(self, replica_id_in_sync_group):
        return replica_id_in_sync_group

    def _get_replica_id_in_sync_group(self, replica_id):
        return replica_id


_KERAS_STEPS = frozenset({"train_step", "test_step", "predict_step"})


def _is_keras_step(fn) -> bool:
    """Whether `fn` is a Keras model's `train_step`, `test_step` or
    `predict_step` (what `fit`, `evaluate` and `predict` hand to
    `strategy.run`), seen through TensorFlow's autograph wrapper."""
    fn = inspect.unwrap(fn)
    owner = getattr(fn, "__self__", None)
    return getattr(fn, "__name__", None) in _KERAS_STEPS and hasattr(
        owner, "make_train_function"
    )


def _keras_step_model(fn) -> Any:
    """The Keras model whose step `fn` is: its `train_step`, `test_step` or
    `predict_step`, or the closure `predict` hands to `strategy.run`
    (`one_step_on_data`, which calls `predict_step`); else `None`."""
    if _is_keras_step(fn):
        return inspect.unwrap(fn).__self__
    fn = inspect.unwrap(fn)
    if getattr(fn, "__name__", None) != "one_step_on_data":
        return None
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            owner = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if hasattr(owner, "make_predict_function"):
            return owner
    return None


def _grouped(result, group):
    """What `update` returns: one op when grouped (graph), else the results."""
    if not group or tf.executing_eagerly():
        return result
    ops = [r for r in tf.nest.flatten(result) if r is not None]
    return tf.group(*ops) if ops else None


def _parameter_device(var) -> str:
    """Where `var`'s update runs: its ps task's device (a partitioned
    variable's first shard's)."""
    inner = _unwrap(var)
    if isinstance(inner, PartitionedVariable):
        return inner.shards[0].device
    return inner.device


def _unwrap(var):
    if type(var) is values.Mirrored and all(
        v is var._primary  # noqa: SLF001
        for v in var.values
    ):
        # A variable every replica returned (`_one_value_per_replica`), e.g.
        # the `(gradient, variable)` pairs of `call_for_each_replica`.
        var = var._primary  # noqa: SLF001
    if isinstance(var, ps_values.AggregatingVariable):
        return var.get()
    if isinstance(var, (PartitionedVariable, ReplicatedVariable)):
        return var
    if hasattr(
        var, "_aggregating_container"
    ) and resource_variable_ops.is_resource_variable(var):
        return var
    name = getattr(var, "name", repr(var))
    raise ValueError(
        f"Variable {name!r} was not created under this PSStrategy's scope, so it "
        "has no parameter device. Build the model and call `model.compile()` "
        "inside `with strategy.scope():`."
    )
