"""`Run`: the one description of a run a strategy front hands its extended,
and the types the extended sees of the mode behind it.

A front (`PSStrategy`, `SyncReplicaStrategy`) checks its arguments and
chooses a mode (`keras_psdist.modes`); the mode finds the devices, binds the
rule, and describes the run here. `PSExtended` builds its collaborators from
it (placement, reduction, variables), asks the mode once for the run's
`RunServices` (heartbeats, membership, this process's `Training`), and
nothing outside sets anything on the extended afterwards.

The extended knows a mode only as a `RunMode` (modes/ builds on distribute/,
not the reverse): what it calls and what it gets back are typed here.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Protocol, runtime_checkable

import tensorflow as tf

from keras_psdist import placement as placement_lib
from keras_psdist.aggregators.base import Aggregator
from keras_psdist.cluster.runtime import Topology


@runtime_checkable
class Training(Protocol):
    """One process's part in a mode's training, beyond Keras's own step.

    What `keras_psdist.integration.training_hooks` calls, from Keras's
    `Optimizer.apply` and `Model.fit` (`strategy.extended.services.training`,
    also readable as `strategy.extended.sync_training`). Exported as
    `keras_psdist.modes.Training`.
    """

    def worker_apply(self, optimizer, apply, grads, variables) -> Any:
        """Instead of Keras's `apply(grads, variables)` (handed over as
        `apply`): e.g. push the gradient and wait, or apply it if fresh."""

    def session(self, model=None) -> contextlib.AbstractContextManager:
        """A context around one `fit` (or custom training loop)."""

    def check_steps(self, steps: int) -> None:
        """Refuses a `fit` of `steps` steps that cannot train."""

    def before_step(self) -> None:
        """Called before each step of a `fit`."""

    def progress(
        self, steps_run: int | None = None, steps_planned: int | None = None
    ) -> bool:
        """Called after each step of a `fit`; True stops the `fit`."""

    def counts(self) -> dict[str, Any]:
        """What happened to this run's gradients so far."""

    def checkpointed(self) -> dict[str, tf.Module]:
        """State `BackupAndRestore` saves beside the weights, by name."""


class RunServices(Protocol):
    """What a process of a run does beside Keras's step and the strategy's
    hooks, as its mode started it (`keras_psdist.cluster.services` builds
    it for every mode; one host has none of it).

    Attributes:
        training: This process's `Training`, or None: Keras's step runs as
            it is.
        server_watch: Cluster runs: ends this process if a server task is
            lost and it does not stop by itself
            (`keras_psdist.cluster.task_loss.ServerWatch`), else None.
        heartbeats: Between-graph: this process's heartbeat and its view of
            the others' (`keras_psdist.cluster.liveness.Heartbeats`), else
            None.
        loss_reporter: Between-graph chief: logs lost and returning workers
            (`keras_psdist.cluster.liveness.LossReporter`), else None.
        registry: Elastic runs (`max_workers`): who trains
            (`keras_psdist.cluster.elastic.SlotTable`), else None.
        membership: Elastic runs, on the chief: its log of each change
            (`keras_psdist.cluster.elastic.MembershipWatcher`), else None.
    """

    training: Training | None
    server_watch: Any
    heartbeats: Any
    loss_reporter: Any
    registry: Any
    membership: Any

    def checkpointed(self) -> dict[str, tf.Module]:
        """The training's state `BackupAndRestore` saves, by name."""

    def reporting_lost_tasks(self) -> contextlib.AbstractContextManager:
        """A context in which an error from a lost server task becomes a
        `keras_psdist.errors.TaskLostError` that names it."""


class RunMode(Protocol):
    """What the extended asks of the mode that described its run (a
    `keras_psdist.modes.Mode`)."""

    def services(
        self, strategy: tf.distribute.Strategy, run: Run, shared: Any
    ) -> RunServices:
        """Starts this process's services for `run`, once the extended has
        its shared variables (`SharedVariables` between graphs, else None)."""


@dataclasses.dataclass(frozen=True)
class Run:
    """What a strategy runs: devices, policies, rule, timeouts, training.

    Attributes:
        mode: The `keras_psdist.modes.Mode` that described the run: the
            extended asks it once for the run's `RunServices`.
        topology: Where the replicas, inputs and parameters are.
        placement: The placement policy (see `PSStrategy`).
        aggregator: The bound rule `batch_reduce_to` runs over this process's
            replicas' gradients. (Sync replicas: a
            `modes.sync_replicas.SyncReplicaAggregation`, which names the rule
            the chief applies across workers.)
        attack: A simulated attack on replicas, or `None`.
        init_timeout: Between-graph, seconds to wait for the chief to
            initialise a shared variable.
        partitioner: Splits large variables, or `None`.
        heartbeat_timeout: Cluster runs: seconds of silence after which a
            worker (between-graph) or a server task counts as lost.
        worker_attack: Sync replicas: the attack this worker process runs on
            every replica, when it is an attacked worker.
        worker_momentum: Each replica's momentum of its gradients, which the
            rule aggregates (see `aggregators.momentum`), or 0 for none.
        compression: What each replica sends instead of its gradient (a
            `keras_psdist.compression.Compressor`), or `None`.
        read_dtype: The dtype a replica's reads of variables on another task
            travel in (`keras_psdist.variables.narrow_reads`), or `None`.
        read_compression: The top-k that picks the changes a replica reads
            of a large variable on another task
            (`keras_psdist.variables.delta_reads`), or `None`.
        dense: Which trainable variables are replicated and all-reduced
            instead of kept on a parameter device (see
            `keras_psdist.dense_choice.get_chooser`).
    """

    mode: RunMode
    topology: Topology
    placement: str | placement_lib.PlacementFn
    aggregator: Aggregator
    attack: Any = None
    init_timeout: float = 120.0
    partitioner: Any = None
    heartbeat_timeout: float = 30.0
    worker_attack: Any = None
    worker_momentum: float = 0.0
    dense: Any = "ps"
    compression: Any = None
    read_dtype: Any = None
    read_compression: Any = None
