"""`ClusterServices`: what a process of a run does beside Keras's step.

The extended keeps the `StrategyExtended` hooks; the services a mode adds
for a cluster run start here, once, in this order:

1. the server watch (every cluster process): ends the process if a ps task
   is lost and nothing else stops it (`cluster.task_loss`);
2. between graphs, elastic runs (`max_workers`): the slot table, and this
   process's admission to it before it beats, so a refused joiner leaves
   no trace (`cluster.elastic`);
3. between graphs: the heartbeats; on the chief the log of lost and
   returning workers, and of each membership change (`cluster.liveness`,
   `cluster.elastic`);
4. the mode's `Training` (`keras_psdist.modes.Mode.training`), built from
   the shared variables, heartbeats and slot table; an elastic async run
   without one counts each update and leaves when asked.

On one host none of it exists: `NO_SERVICES`.

Example (one host):

>>> NO_SERVICES.training is None and NO_SERVICES.checkpointed() == {}
True
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from keras_psdist.cluster import elastic, task_loss
from keras_psdist.cluster.liveness import Heartbeats, LossReporter
from keras_psdist.cluster.runtime import Topology
from keras_psdist.cluster.shared_variables import SharedVariables
from keras_psdist.distribute.run import Training


@dataclasses.dataclass(frozen=True)
class ClusterServices:
    """A `keras_psdist.distribute.run.RunServices` (see its attributes)."""

    training: Training | None = None
    server_watch: task_loss.ServerWatch | None = None
    heartbeats: Heartbeats | None = None
    loss_reporter: LossReporter | None = None
    registry: elastic.SlotTable | None = None
    membership: elastic.MembershipWatcher | None = None
    # Cluster runs: the cluster, and the jobs whose tasks this process
    # depends on (`task_loss.server_jobs`).
    config: Any = None
    server_jobs: tuple[str, ...] = ()

    def reporting_lost_tasks(self) -> contextlib.AbstractContextManager:
        """A context in which an error from a lost server task becomes a
        `TaskLostError` that names it (one host: nothing)."""
        if self.config is None:
            return contextlib.nullcontext()
        return task_loss.reporting_lost_tasks(
            self.config, self.server_jobs, self.config.task_name
        )

    def checkpointed(self) -> dict[str, tf.Module]:
        """The training's state `BackupAndRestore` saves, by name."""
        return {} if self.training is None else dict(self.training.checkpointed())


NO_SERVICES = ClusterServices()

# The mode's hook: (heartbeats, slot table) -> this process's Training.
TrainingFactory = Callable[[Any, Any], "Training | None"]


def start(
    topology: Topology,
    shared: SharedVariables | None,
    heartbeat_timeout: float,
    training: TrainingFactory,
    reports_lost_workers: bool = True,
) -> ClusterServices:
    """Starts this process's services for a run on `topology`.

    Args:
        topology: The run's devices (a cluster's, or one host's).
        shared: Between graphs, opens (on the chief, creates) variables on
            the ps tasks; else None.
        heartbeat_timeout: Seconds of silence after which a worker (between
            graphs) or a server task counts as lost.
        training: The mode's `training(heartbeats, registry)` hook.
        reports_lost_workers: Between graphs, whether the chief logs lost
            and returning workers (False for a mode whose training logs
            them itself).

    Raises:
        JoinRefusedError: an elastic joiner that may not take its slot.
    """
    server_watch = task_loss.watch(topology, heartbeat_timeout)
    heartbeats = loss_reporter = registry = membership = None
    if topology.between_graph:
        if topology.max_workers is not None:
            registry = elastic.SlotTable(
                shared,
                topology.parameter_devices[0],
                topology.worker_index,
                topology.max_workers,
                names=topology.training_task_names,
            )
        heartbeats = Heartbeats(
            shared,
            topology.parameter_devices[0],
            topology.worker_index,
            topology.num_training_processes,
            heartbeat_timeout,
            server_watch=server_watch,
            names=topology.training_task_names,
            start=registry is None,
        )
        if registry is not None:
            # Admitted before it beats: a refused joiner leaves no trace.
            registry.admit(heartbeats.beats, heartbeats.period, heartbeat_timeout)
            heartbeats.members = registry.members
            heartbeats.start()
            if topology.is_chief:
                membership = elastic.MembershipWatcher(registry)
        if topology.is_chief and reports_lost_workers:
            loss_reporter = LossReporter(heartbeats)
    mode_training = training(heartbeats, registry)
    if registry is not None and mode_training is None:
        # Elastic async: count each update, leave when asked.
        mode_training = elastic.ElasticTraining(
            registry,
            os.environ.get(elastic.LEAVE_FILE_ENV),
            unreachable_servers=functools.partial(
                task_loss.unreachable_tasks, topology.config, ("ps",)
            ),
        )
    return ClusterServices(
        training=mode_training,
        server_watch=server_watch,
        heartbeats=heartbeats,
        loss_reporter=loss_reporter,
        registry=registry,
        membership=membership,
        config=topology.config,
        server_jobs=task_loss.server_jobs(topology.mode),
    )
