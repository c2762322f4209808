"""`PSStrategy`: the public front of the parameter-server strategy.

It checks its arguments, chooses the mode (`keras_psdist.modes`: one host,
in-graph, between-graph, bounded staleness) and hands the run the mode
describes to `PSExtended`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from keras_psdist import aggregators as aggregators_lib
from keras_psdist import dense_choice, modes
from keras_psdist import placement as placement_lib
from keras_psdist._tf import distribute_lib
from keras_psdist.distribute.extended import PSExtended
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
            configuration (`"nnm>trimmed_mean"`, `"arc>median+wm"`, see
            `keras_psdist.spelling`), a config dict or a
            `keras_psdist.aggregators.Aggregator`. Defaults to `"mean"`.
        num_byzantine: How many replicas may be faulty (the papers' *f*);
            robust rules guard against this many, and each rule's condition
            on the replica count and f is checked when the strategy is
            built. A number, or a fraction of the replicas (`0.25`,
            rounded down; `keras_psdist.count_rules`). Defaults to the
            aggregator's own `num_byzantine` if it has one, else 0.
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
            works. Underscores read as hyphens (`"in_graph"`); the spellings
            `"sync"` and `"async"` of earlier versions still work, with a
            `DeprecationWarning` (renamed in 0.2); see
            `keras_psdist.modes`. Defaults to `"in-graph"`.
        max_staleness: Between-graph, bound the staleness (stale synchronous
            parallel): a worker at most this many steps ahead of the slowest
            waits before its next step, and a gradient computed more than
            this many steps behind the fastest worker is dropped, not
            applied (`keras_psdist.modes.bounded_staleness`). Defaults to
            `None` (unbounded).
        max_workers: Between-graph and asynchronous: workers may join and
            leave the running job, up to this many (`worker:0` to
            `worker:max_workers-1`); each process of the job must pass the
            same value. A worker joins by starting with its own index in its
            TF_CONFIG (`keras-psdist launch --max-workers` starts them),
            leaves at the end of its `fit` or when asked, and is refused
            (`keras_psdist.errors.JoinRefusedError`) if a live worker holds
            its index. See `keras_psdist.cluster.elastic` and
            docs/cluster.md. Defaults to `None` (the workers of TF_CONFIG).
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
        compression: What each replica sends instead of its gradient,
            compressed on the replica's own device and decompressed on the
            reduction device, before the attack and the rule: an id
            (`"fp16"`, `"bf16"`, `"top_k"`, `"random_k"`, `"sign"`,
            `"power_sgd"`, `"none"`), an id with arguments
            (`"top_k(ratio=0.01)"`), a config dict or a
            `keras_psdist.compression.Compressor`. Top-k, random-k, sign and
            PowerSGD keep an error-feedback residual per replica, in
            `extended.training_state` (checkpointed). A configuration string
            may start with it instead: `aggregator="top_k>trimmed_mean"`.
            Between graphs, each worker compresses what it sends to the
            ps tasks (its replicas' combined gradient), keeping one residual
            per variable, and each ps task decompresses before the update.
            See docs/compression.md. Defaults to `None` (no compression).
        read_dtype: The dtype a replica's reads of variables on another
            task travel in: `"bfloat16"` or `"float16"` halve the bytes each
            step reads from the ps tasks (the variables, the update and the
            gradient stay float32; a replica computes with the weights
            rounded to it). Reads on one host are unchanged. See
            `keras_psdist.variables.narrow_reads` and docs/compression.md.
            Defaults to `None` (reads travel as float32).
        read_compression: `"top_k(ratio=0.05)"` (or a
            `kpd.compression.TopK`): a replica on another task keeps its own
            copy of each large variable and reads only the largest changes
            since its last read (a copy per replica on the ps task too); the
            rest comes through at later reads, and every 100th read is
            whole. With `read_dtype` the values travel narrowed. See
            `keras_psdist.variables.delta_reads` and docs/compression.md.
            Defaults to `None` (every read whole).

    Raises:
        ValueError: for unknown or malformed devices, placement or
            aggregator names, an aggregator or attack config with an
            argument its class does not take, a `cluster_resolver` that is
            not one, an aggregator that cannot tolerate `num_byzantine` faulty replicas,
            an attack on replicas that do not exist, an invalid cluster (or
            TF_CONFIG), a task that cannot play the mode's role, an unknown
            or malformed compressor.
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
        num_byzantine: Any = None,
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
        compression: Any = None,
        read_dtype: Any = None,
        read_compression: Any = None,
        max_workers: int | None = None,
    ):
        arguments = modes.Arguments(
            devices=devices,
            parameter_devices=parameter_devices,
            placement=placement,
            aggregator=aggregator,
            num_byzantine=num_byzantine,
            attack=attack,
            worker_momentum=worker_momentum,
            cluster_resolver=cluster_resolver,
            max_staleness=max_staleness,
            step_timeout=step_timeout,
            connect_timeout=connect_timeout,
            init_timeout=init_timeout,
            partitioner=partitioner,
            heartbeat_timeout=heartbeat_timeout,
            dense=dense,
            compression=compression,
            read_dtype=read_dtype,
            read_compression=read_compression,
            max_workers=max_workers,
        ).checked()
        mode = modes.choose(mode, arguments, "PSStrategy")
        mode.validate()
        run = mode.run(mode.topology())
        # Keras's side of the run: installed once, before any model exists.
        keras_patches.install()
        super().__init__(PSExtended(self, run))

    @property
    def num_byzantine(self) -> int:
        """The number of replicas the run tolerates as faulty."""
        return self.extended.aggregator.num_byzantine

    def __repr__(self) -> str:
        ext = self.extended
        launch = ext.mode.launch
        return (
            f"PSStrategy(devices={list(ext.worker_devices)}, "
            f"parameter_devices={list(ext.parameter_devices)}, "
            f"aggregator={ext.aggregator!r}, num_byzantine={self.num_byzantine}"
            + (f", attack={ext.attack!r}" if ext.attack is not None else "")
            + (
                f", worker_momentum={ext.worker_momentum}"
                if ext.worker_momentum
                else ""
            )
            + (
                f", compression={ext.compression!r}"
                if ext.compression is not None
                else ""
            )
            + (f", read_dtype={ext.read_dtype.name!r}" if ext.read_dtype else "")
            + (
                f", read_compression={ext.read_compression!r}"
                if ext.read_compression is not None
                else ""
            )
            + (
                f", max_workers={ext.topology.max_workers}"
                if ext.topology.max_workers is not None
                else ""
            )
            + (
                f", partitioner={ext.partitioner!r}"
                if ext.partitioner is not None
                else ""
            )
            + (f", mode={launch!r})" if launch is not None else ")")
        )
