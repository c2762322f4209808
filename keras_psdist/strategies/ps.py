"""`PSStrategy`: the public front of the parameter-server strategy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from absl import logging

from keras_psdist import aggregators as aggregators_lib
from keras_psdist import dense_choice
from keras_psdist import devices as devices_lib
from keras_psdist import partitioners as partitioners_lib
from keras_psdist import placement as placement_lib
from keras_psdist._tf import distribute_lib
from keras_psdist.aggregators.base import check_count
from keras_psdist.aggregators.momentum import check_beta
from keras_psdist.cluster import runtime
from keras_psdist.distribute.extended import PSExtended
from keras_psdist.distribute.run import Run
from keras_psdist.integration import keras_patches


class PSStrategy(distribute_lib.Strategy):
    """Parameter-server data parallelism for Keras 3 `model.fit`.

    Replicas run on the compute devices; every variable lives once, on a
    parameter device chosen by a placement policy, with its optimizer slots
    beside it. Each step, the replicas' gradients are combined by an
    aggregator on a parameter device, and the optimizer updates each variable
    where it lives.

    Swapping it for `tf.distribute.MirroredStrategy()` in Keras code is a
    one-line change: build and compile the model under `strategy.scope()`,
    then call `fit` / `evaluate` / `predict` as usual.

    Args:
        devices: Compute devices, one replica each. Defaults to every local
            GPU; with no GPU, every logical CPU device (one unless the CPU was
            split with `tf.config.set_logical_device_configuration`).
        parameter_devices: Devices that hold variables. Defaults to the host
            CPU, or to the GPU when there is exactly one compute GPU.
        placement: `"greedy"` (the least-loaded parameter device by bytes, as
            AutoDist's load balancer), `"round_robin"` (as TF1's
            `replica_device_setter`), a config dict or a
            `keras_psdist.placement.PlacementPolicy`, or a callable
            `(name, shape, dtype) -> device` returning one of
            `parameter_devices`. Defaults to `"greedy"`.
        aggregator: How per-replica gradients become one: a string id, a
            config dict or a `keras_psdist.aggregators.Aggregator`. Defaults
            to `"mean"`.
        num_byzantine: How many replicas may be faulty (the papers' *f*);
            robust rules guard against this many, and each rule's condition
            on the replica count and f is checked when the strategy is
            built. Defaults to the aggregator's own `num_byzantine` if it
            has one, else 0.
        attack: A simulated attack from `keras_psdist.attacks` (or its
            config dict), applied to the replicas it names every training
            step, to evaluate a rule: e.g. `attacks.SignFlip(replicas=[7])`.
            Defaults to `None`.
        worker_momentum: Each replica keeps a momentum
            `m <- beta * m + (1 - beta) * g` of its own gradients and the
            aggregator combines the momenta (Karimireddy et al., ICML 2021):
            with a robust rule, the defense against small, hidden shifts
            (ALIE, IPM). A number in `[0, 1)`; 0.9 is usual. With it, use a
            momentum-free optimizer (see docs/robustness.md). Defaults to 0
            (off).
        cluster_resolver: The cluster to train on: a
            `tf.distribute.cluster_resolver.ClusterResolver` or a
            `keras_psdist.cluster.ClusterConfig`, with jobs `ps`, `worker`
            and optionally `chief`. Defaults to the cluster in the `TF_CONFIG`
            environment variable, if set; else this process alone. See
            docs/cluster.md.
        mode: With a cluster, how it trains; the same word as
            `keras-psdist launch --mode`. `"in-graph"`: this process is the
            one client (the chief); the replicas are every worker task's
            GPUs, else its CPU; the variables live on the ps tasks; each step
            is synchronous, as on one host. `"between-graph"`: every worker
            task runs the same script; the variables live on the ps tasks,
            shared by all workers; each worker applies its updates as they
            come, without waiting for the others (asynchronous training);
            the replicas are this worker's GPUs, else its CPU, and the
            aggregator combines only those. For synchronous between-graph
            training, with backup workers, use `SyncReplicaStrategy`. A
            process started in a role the mode cannot use (e.g. by a launch
            of the other mode) raises `ValueError` naming the command that
            works. The spellings `"sync"` and `"async"` of earlier versions
            still work, with a `DeprecationWarning` (renamed in 0.2). Defaults to
            `"in-graph"`.
        max_staleness: Between-graph, bound the staleness (stale synchronous
            parallel): a worker at most this many steps ahead of the slowest
            waits before its next step, and a gradient computed more than
            this many steps behind the fastest worker is dropped, not
            applied. See `keras_psdist.sync.staleness`. Defaults to `None`
            (unbounded).
        step_timeout: With `max_staleness`, seconds a worker waits for the
            slowest before raising `TimeoutError`. Defaults to 300.
        connect_timeout: Seconds to wait for the cluster's tasks to accept
            connections before raising `ConnectionError`. Defaults to 20.
        init_timeout: Between-graph, seconds a worker waits for the chief to
            initialise each variable before raising `TimeoutError`.
            Defaults to 120.
        heartbeat_timeout: Between-graph, seconds without a heartbeat after
            which a worker process counts as lost
            (`keras_psdist.cluster.liveness`): the chief logs it, and with
            `max_staleness` the others stop waiting for it. On a cluster
            (any mode), also how long a process whose ps task is lost may
            take to stop by itself before it is ended with the error
            (`keras_psdist.cluster.task_loss`). Defaults to 30.
        partitioner: Splits large variables (embedding tables) into shards of
            consecutive rows, each placed on a parameter device by
            `placement`: a `keras_psdist.partitioners` object (`Fixed`,
            `MinSize`, `MaxSize`) or its config dict
            (`{"class_name": "fixed", "config": {"num_shards": 2}}`), a TF
            `tf.distribute.experimental.partitioners.*`, or a callable
            `(shape, dtype) -> list[int]`. Lookups read only the touched rows
            from the shards that own them; updates run on each shard's
            device; checkpoints hold unpartitioned values. See
            docs/partitioning.md. Defaults to `None` (no variable is split).
        dense: How trainable variables are kept in sync. `"ps"`: each on a
            parameter device, read by every replica each step. `"all_reduce"`:
            dense ones replicated on every replica, their gradients reduced
            across replicas and every copy updated, as `MirroredStrategy`;
            embedding tables (and variables the partitioner splits) stay on
            the parameter devices: the Parallax hybrid. `"auto"`: per
            variable, whichever moves fewer bytes per step, logged with the
            reason (`keras_psdist.dense_choice.AutoChoice`;
            `strategy.extended.dense_decisions`). Or a config dict, a
            `keras_psdist.dense_choice.DenseChoice`, or a callable
            `(name, shape, dtype) -> "ps" | "all_reduce" | "auto"` per
            variable (`"auto"`: leave that one to the automatic choice).
            Replication needs one host or `mode="in-graph"`. See
            docs/hybrid.md. Defaults to `"ps"`.

    Raises:
        ValueError: for unknown or malformed devices, placement or
            aggregator names, an aggregator or attack config with an
            argument its class does not take, a `cluster_resolver` that is
            not one, an aggregator that cannot tolerate `num_byzantine` faulty replicas,
            an attack on replicas that do not exist, an invalid cluster (or
            TF_CONFIG), or a task that cannot play the mode's role.
        ConnectionError: if a task of the cluster does not answer within
            `connect_timeout`.
        OSError: if this task's port is held by another process.

    Examples:

    >>> import keras, keras_psdist as kpd
    >>> strategy = kpd.PSStrategy()
    >>> with strategy.scope():
    ...     model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    ...     model.compile(optimizer="sgd", loss="mse")
    >>> strategy.extended.placement.device_of(model.weights[0].path)
    '/job:localhost/replica:0/task:0/device:CPU:0'
    """

    def __init__(
        self,
        devices: Sequence[str] | None = None,
        parameter_devices: Sequence[str] | None = None,
        placement: str | dict[str, Any] | placement_lib.PlacementFn = "greedy",
        aggregator: str | dict[str, Any] | aggregators_lib.Aggregator = "mean",
        num_byzantine: int | None = None,
        attack: Any = None,
        worker_momentum: float = 0.0,
        cluster_resolver: Any = None,
        mode: str = "in-graph",
        max_staleness: int | None = None,
        step_timeout: float = 300.0,
        connect_timeout: float = 20.0,
        init_timeout: float = 120.0,
        partitioner: Any = None,
        heartbeat_timeout: float = 30.0,
        dense: str | dict[str, Any] | dense_choice.ChooserFn = "ps",
    ):
        choice = dense_choice.get(dense)
        devices_lib.canonical_names(devices, "devices")
        partitioner, aggregator, worker_momentum = check_shared_arguments(
            parameter_devices=parameter_devices,
            cluster_resolver=cluster_resolver,
            placement=placement,
            partitioner=partitioner,
            aggregator=aggregator,
            num_byzantine=num_byzantine,
            worker_momentum=worker_momentum,
            step_timeout=step_timeout,
            connect_timeout=connect_timeout,
            init_timeout=init_timeout,
            heartbeat_timeout=heartbeat_timeout,
        )
        mode = runtime.resolve_mode(mode)
        if max_staleness is not None:
            check_count("max_staleness", max_staleness, minimum=0)
            if mode != "between-graph":
                raise ValueError(
                    "max_staleness bounds how far asynchronous workers drift "
                    "apart; it needs mode='between-graph'. Received: "
                    f"mode={mode!r}, "
                    f"max_staleness={max_staleness}. For synchronous training "
                    "with backup workers use SyncReplicaStrategy."
                )
        if mode == "between-graph" and not isinstance(
            choice, (dense_choice.AllOnPS, dense_choice.AutoChoice)
        ):
            raise ValueError(
                f"dense={dense!r} replicates variables on the replicas, which "
                "needs one client that sees every replica: one host or "
                "mode='in-graph'. Between-graph workers keep every variable "
                "on the ps tasks. Received: mode='between-graph'; leave dense= "
                "out, or train in-graph."
            )
        config = runtime.resolve_config(cluster_resolver)
        if config is None:
            if mode == "between-graph":
                raise ValueError(
                    "PSStrategy(mode='between-graph') trains between processes "
                    "and needs a cluster, but TF_CONFIG is not set and no "
                    "cluster_resolver was passed. Run the script with "
                    "`keras-psdist launch --mode between-graph --num-ps 1 "
                    f"--num-workers 2 -- {runtime.script_command()}` (or pass "
                    "cluster_resolver=); on one host, leave mode out."
                )
            topology = runtime.local_topology(devices, parameter_devices)
        else:
            runtime.check_launch_mode(config, mode, f"PSStrategy(mode={mode!r})")
            topology = runtime.connect(
                config, mode, devices, parameter_devices, connect_timeout
            )
        n = len(topology.compute_devices)
        aggregator = aggregator.bind(n, num_byzantine)
        warn_if_undefended(aggregator, "PSStrategy")
        self._num_byzantine = aggregator.num_byzantine
        attack = resolve_attack(attack, n, self._num_byzantine)
        training = None
        if max_staleness is not None:
            from keras_psdist.cluster.shared_variables import run_namespace
            from keras_psdist.sync.staleness import BoundedStaleness

            namespace = run_namespace("staleness")

            def training(extended):
                return BoundedStaleness(
                    self,
                    max_staleness,
                    worker=topology.worker_index,
                    num_workers=topology.num_training_processes,
                    device=topology.parameter_devices[0],
                    shared=extended.shared_variables,
                    local_device=topology.client_device,
                    step_timeout=float(step_timeout),
                    heartbeats=extended.heartbeats,
                    names=topology.training_task_names,
                    namespace=namespace,
                )

        # Keras's side of the run: installed once, before any model exists.
        keras_patches.install()
        run = Run(
            topology,
            placement,
            aggregator,
            attack,
            init_timeout,
            partitioner=partitioner,
            heartbeat_timeout=heartbeat_timeout,
            training=training,
            worker_momentum=worker_momentum,
            dense=dense,
        )
        super().__init__(PSExtended(self, run))

    @property
    def num_byzantine(self) -> int:
        """The number of replicas the run tolerates as faulty."""
        return self._num_byzantine

    def __repr__(self) -> str:
        ext = self.extended
        mode = ext.topology.mode
        return (
            f"PSStrategy(devices={list(ext.worker_devices)}, "
            f"parameter_devices={list(ext.parameter_devices)}, "
            f"aggregator={ext.aggregator!r}, num_byzantine={self._num_byzantine}"
            + (f", attack={ext.attack!r}" if ext.attack is not None else "")
            + (
                f", worker_momentum={ext.worker_momentum}"
                if ext.worker_momentum
                else ""
            )
            + (
                f", partitioner={ext.partitioner!r}"
                if ext.partitioner is not None
                else ""
            )
            + (f", mode={mode!r})" if mode != "local" else ")")
        )


def check_shared_arguments(
    *,
    parameter_devices: Any,
    cluster_resolver: Any,
    placement: Any,
    partitioner: Any,
    aggregator: Any,
    num_byzantine: Any,
    worker_momentum: Any,
    **seconds: Any,
) -> tuple[Any, aggregators_lib.Aggregator, float]:
    """Checks the arguments every strategy front takes (`ValueError` naming
    the fix); returns the partitioner, the (unbound) aggregator and the
    worker momentum, resolved."""
    devices_lib.canonical_names(parameter_devices, "parameter_devices")
    runtime.check_cluster_resolver(cluster_resolver)
    check_placement(placement)
    worker_momentum = check_beta(worker_momentum)
    partitioner = partitioners_lib.get(partitioner)
    check_seconds(**seconds)
    if num_byzantine is not None:
        check_count("num_byzantine", num_byzantine, minimum=0)
    return partitioner, aggregators_lib.get(aggregator), worker_momentum


def check_placement(placement: Any) -> None:
    """Raises `ValueError` unless `placement` names a policy (an id, a
    config dict, a policy) or is callable."""
    placement_lib.get(placement)


def check_seconds(**durations: Any) -> None:
    """Raises `ValueError` unless every value is a positive number of seconds."""
    for name, value in durations.items():
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not (value > 0)
        ):
            raise ValueError(
                f"`{name}` must be a positive number of seconds. "
                f"Received: {name}={value!r}"
            )


def warn_if_undefended(aggregator, strategy_name: str) -> None:
    """Warns when a rule that needs `num_byzantine` runs with 0: it then
    defends against nothing (see `Aggregator.needs_num_byzantine`)."""
    if aggregator.needs_num_byzantine and aggregator.f == 0:
        logging.warning(
            "%s(aggregator=%r) runs with num_byzantine=0, so %s %s. Pass "
            "num_byzantine=f, the number of replicas that may be faulty, beside "
            "the same aggregator: %s(aggregator=<your rule>, num_byzantine=f).",
            strategy_name,
            aggregator,
            aggregator.name,
            aggregator.without_num_byzantine or "defends against no faulty replica",
            strategy_name,
        )


def resolve_attack(attack, num_replicas, num_byzantine):
    """The attack from its config, checked against the replica count (warns
    when it controls more replicas than `num_byzantine`)."""
    if attack is None:
        return None
    from keras_psdist import attacks as attacks_lib

    attack = attacks_lib.get(attack)
    attack.check(num_replicas)
    if len(attack.replicas) > num_byzantine:
        count = len(attack.replicas)
        logging.warning(
            "The attack controls %d replica%s %s but num_byzantine=%d: the rule "
            "is not guaranteed to withstand it. This is intended only when "
            "probing a rule beyond its tolerance (or showing the undefended "
            "mean).",
            count,
            "" if count == 1 else "s",
            list(attack.replicas),
            num_byzantine,
        )
    return attack
