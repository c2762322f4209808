"""`SyncReplicaStrategy`: TF1's `SyncReplicasOptimizer` semantics for Keras 3.

It checks its arguments and hands over to the sync-replicas mode
(`keras_psdist.modes.sync_replicas`), which describes the run for
`PSExtended`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from keras_psdist import aggregators as aggregators_lib
from keras_psdist import modes
from keras_psdist import placement as placement_lib
from keras_psdist._tf import distribute_lib
from keras_psdist.distribute.extended import PSExtended
from keras_psdist.integration import keras_patches


class SyncReplicaStrategy(distribute_lib.Strategy):
    """Synchronous parameter-server training across worker processes, with
    backup workers, stale gradients dropped and robust aggregation.

    Every worker task runs the same script (between-graph, as
    `PSStrategy(mode="between-graph")`); the variables live on the ps tasks. Each
    step, every worker sends its gradient, tagged with the global step it was
    computed at, to the ps. The chief (worker 0, or the `chief` task) drops
    gradients older than the global step; once `replicas_to_aggregate` fresh
    ones have arrived it combines them with `aggregator`, applies the result
    with the Keras optimizer, increments the global step and releases the
    workers. A worker's replicas (its GPUs) count as one: their gradients are
    summed before sending.

    - `total_num_replicas > replicas_to_aggregate`: the difference are backup
      workers: the slowest are not waited for; their late gradients are
      dropped as stale and counted.
    - `total_num_replicas < replicas_to_aggregate`: each worker sends
      `ceil(replicas_to_aggregate / total_num_replicas)` batches' gradients
      per update.
    - With a robust `aggregator`, the chief applies it to the individual
      workers' gradients.

    Per worker, how many gradients were applied and dropped is logged by the
    chief and readable with `extended.sync_training.counts()` or the
    `keras_psdist.callbacks.SyncReplicaReport` callback. The chief writes
    checkpoints; see `keras_psdist.sync.training` for what happens when a
    process fails (there is no chief failover).

    Args:
        replicas_to_aggregate: Fresh gradients per update: a number, or a
            rule of the number of workers n (`keras_psdist.count_rules`):
            `"all_but_one"` (one backup worker), a fraction such as `0.75`
            (rounded up), `kpd.count_rules.Fraction(0.75)`. Defaults to
            `total_num_replicas`.
        total_num_replicas: The number of worker processes (tasks of jobs
            `chief` and `worker`); given, it is checked against the cluster.
        aggregator: The rule over the workers' gradients: a string id, a
            configuration (`"nnm>trimmed_mean"`, see `keras_psdist.spelling`),
            config dict or `keras_psdist.aggregators.Aggregator`. Its condition on n
            and f is checked with n = `replicas_to_aggregate`. Defaults to
            `"mean"`.
        num_byzantine: How many workers may be faulty: a number, or a
            fraction of the workers (`0.25`, rounded down; see
            `keras_psdist.count_rules`). Defaults to the aggregator's own,
            else 0.
        attack: A simulated attack (`keras_psdist.attacks`) whose `replicas`
            are worker indices: each attacked worker corrupts what it sends
            (a gradient attack forges its own gradient; a data attack
            corrupts its batches). Crafted attacks (`ALIE`, `IPM`) need the
            honest workers' gradients, which a worker process cannot see, and
            are refused.
        worker_momentum: Each worker process keeps a momentum
            `m <- beta * m + (1 - beta) * g` of its own gradients and sends
            it instead of the gradient; the rule aggregates the momenta (see
            `PSStrategy`). A number in `[0, 1)`. Defaults to 0 (off).
        placement: How variables are spread over the ps tasks (see
            `PSStrategy`). Defaults to `"greedy"`.
        parameter_devices: Devices that hold variables. Defaults to every ps
            task's CPU.
        cluster_resolver: The cluster (see `PSStrategy`). Defaults to
            `TF_CONFIG`.
        step_timeout: Seconds a worker waits for a step to finish before it
            raises `TimeoutError` naming the workers the update waits for;
            also how long the chief waits, after its own `fit`, for the other
            workers to finish theirs. Defaults to 300.
        connect_timeout: Seconds to wait for the ps tasks. Defaults to 20.
        init_timeout: Seconds a worker waits for the chief to create each
            variable. Defaults to 120.
        partitioner: Splits large variables into row shards over the
            parameter devices (see `PSStrategy`). Defaults to `None`.
        heartbeat_timeout: Seconds without a heartbeat after which a worker
            process counts as lost (`keras_psdist.cluster.liveness`): with
            backup workers the run goes on without it, else every worker
            stops with `WorkerLostError` naming it; a lost chief stops every
            worker. Also how long a process whose ps task is lost may take
            to stop by itself before it is ended with the error
            (`keras_psdist.cluster.task_loss`). Defaults to 30.
        compression: What each worker sends to the chief's queue instead of
            its gradient (see `PSStrategy`): compressed on the worker, with
            one error-feedback residual per variable there (in
            `extended.training_state`), and decompressed by the chief before
            the rule. Defaults to `None` (no compression).
        read_dtype: The dtype each worker's reads of the variables travel
            in from the ps tasks (see `PSStrategy`): `"bfloat16"` or
            `"float16"` halve them. Defaults to `None` (float32).
        read_compression: `"top_k(ratio=0.05)"`: each worker reads only the
            largest changes of each large variable since its last read (see
            `PSStrategy`). Defaults to `None` (every read whole).
        max_workers: Workers may join and leave the running job, up to this
            many (tasks `worker:0` to `worker:max_workers-1`); every process
            of the job must pass the same (`keras-psdist launch
            --max-workers` sets it for every worker through the environment).
            `replicas_to_aggregate` and `num_byzantine` stated as rules
            (`"all_but_one"`, `0.75`) are derived again at each change,
            between two updates (see `keras_psdist.sync.resizing`). Defaults
            to `None` (the TF_CONFIG's workers, fixed).

    Raises:
        ValueError: without a cluster, for a `cluster_resolver` that is not
            one, malformed `parameter_devices`, counts that do not fit the
            cluster, an aggregator or attack config with an argument its
            class does not take, or an aggregator that cannot tolerate
            `num_byzantine` faulty workers out of `replicas_to_aggregate`,
            or a compression it cannot build.

    Examples:

    In a script started on every worker (e.g. by `keras-psdist launch --mode
    between-graph --num-workers 4`)::

        strategy = kpd.SyncReplicaStrategy(replicas_to_aggregate=3)  # 1 backup
        with strategy.scope():
            model = build_model()
            model.compile(...)
        model.fit(x, y, callbacks=[kpd.callbacks.SyncReplicaReport()])
    """

    def __init__(
        self,
        replicas_to_aggregate: Any = None,
        total_num_replicas: int | None = None,
        aggregator: str | dict[str, Any] | aggregators_lib.Aggregator = "mean",
        num_byzantine: Any = None,
        attack: Any = None,
        worker_momentum: float = 0.0,
        placement: str | placement_lib.PlacementFn = "greedy",
        parameter_devices: Sequence[str] | None = None,
        cluster_resolver: Any = None,
        step_timeout: float = 300.0,
        connect_timeout: float = 20.0,
        init_timeout: float = 120.0,
        partitioner: Any = None,
        heartbeat_timeout: float = 30.0,
        compression: Any = None,
        read_dtype: Any = None,
        read_compression: Any = None,
        max_workers: int | None = None,
    ):
        arguments = modes.Arguments(
            replicas_to_aggregate=replicas_to_aggregate,
            total_num_replicas=total_num_replicas,
            aggregator=aggregator,
            num_byzantine=num_byzantine,
            attack=attack,
            worker_momentum=worker_momentum,
            placement=placement,
            parameter_devices=parameter_devices,
            cluster_resolver=cluster_resolver,
            step_timeout=step_timeout,
            connect_timeout=connect_timeout,
            init_timeout=init_timeout,
            partitioner=partitioner,
            heartbeat_timeout=heartbeat_timeout,
            compression=compression,
            read_dtype=read_dtype,
            read_compression=read_compression,
            max_workers=max_workers,
        ).checked()
        mode = modes.SyncReplicasMode(arguments, "SyncReplicaStrategy")
        mode.validate()
        run = mode.run(mode.topology())
        # Keras's side of the run: installed once, before any model exists.
        keras_patches.install()
        super().__init__(PSExtended(self, run))

    @property
    def num_byzantine(self) -> int:
        """The number of workers the run tolerates as faulty."""
        return self.extended.aggregator.num_byzantine

    @property
    def replicas_to_aggregate(self) -> int:
        """Fresh gradients per update."""
        return self.extended.aggregator.replicas_to_aggregate

    @property
    def total_num_replicas(self) -> int:
        """Worker processes."""
        return self.extended.aggregator.total_num_replicas

    def training(self, model=None):
        """A context for a custom training loop (`fit` enters it by itself).

        Inside it, this worker's `optimizer.apply_gradients` calls send its
        gradient and wait for the chief's update; on the chief, the update
        service runs. Leave it on every worker when the loop ends.
        """
        return self.extended.sync_training.session(model)

    def __repr__(self) -> str:
        aggregation = self.extended.aggregator
        attack = self.extended.mode.attack
        return (
            "SyncReplicaStrategy(replicas_to_aggregate="
            f"{aggregation.replicas_to_aggregate}, "
            f"total_num_replicas={aggregation.total_num_replicas}, "
            f"aggregator={aggregation.rule!r}, num_byzantine={self.num_byzantine}"
            + (f", attack={attack!r}" if attack is not None else "")
            + (
                f", worker_momentum={aggregation.worker_momentum}"
                if aggregation.worker_momentum
                else ""
            )
            + (
                f", read_dtype={self.extended.read_dtype.name!r}"
                if self.extended.read_dtype
                else ""
            )
            + (
                f", read_compression={self.extended.read_compression!r}"
                if self.extended.read_compression is not None
                else ""
            )
            + (
                f", max_workers={self.extended.topology.max_workers}"
                if self.extended.topology.max_workers is not None
                else ""
            )
            + ")"
        )
