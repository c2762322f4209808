"""`sync-replicas`: TF1's `SyncReplicasOptimizer` semantics between workers.

Every worker task runs the script and pushes its gradient, tagged with its
step, to the chief's update service, which drops stale gradients, combines
`replicas_to_aggregate` fresh ones with the rule and applies the update
(`keras_psdist.sync`, which runs it). `SyncReplicaStrategy` trains in it.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from keras_psdist import count_rules, gradients
from keras_psdist.aggregators.base import Aggregator
from keras_psdist.aggregators.mean import Mean
from keras_psdist.cluster import runtime, task_loss
from keras_psdist.cluster.config import LEAVE_FILE_ENV
from keras_psdist.cluster.shared_variables import run_namespace
from keras_psdist.distribute.run import Run
from keras_psdist.modes.arguments import resolve_attack, warn_if_undefended
from keras_psdist.modes.between_graph import BetweenGraphMode
from keras_psdist.sync.protocol import SyncConfig, SyncReplicas
from keras_psdist.sync.resizing import Resizing
from keras_psdist.sync.training import SyncTraining


class SyncReplicaAggregation(Mean):
    """The sync-replica rule, as a worker's reduction chain holds it.

    A step's gradients go, in order: this worker's replicas summed (this
    rule's own step, the mean of Keras's 1/n-scaled gradients; what
    `batch_reduce_to` runs in the worker), the worker's momentum if any, a
    push to the chief tagged with the worker's step; then, in the chief's
    update service (`keras_psdist.sync.service`): gradients older than the
    global step dropped as stale, `replicas_to_aggregate` fresh ones combined
    by `rule`, and the result applied with the Keras optimizer.

    Args:
        rule: The rule the chief applies across workers, bound to
            `replicas_to_aggregate` of them.
        replicas_to_aggregate: Fresh gradients per update.
        total_num_replicas: Worker processes.
        worker_momentum: Each worker's momentum of its gradients, sent
            instead of the gradient (0: none).
    """

    name = "sync_replicas"

    def __init__(
        self,
        rule: Aggregator,
        replicas_to_aggregate: int,
        total_num_replicas: int,
        worker_momentum: float = 0.0,
    ):
        super().__init__()
        self.rule = rule
        self.replicas_to_aggregate = replicas_to_aggregate
        self.total_num_replicas = total_num_replicas
        self.worker_momentum = worker_momentum
        # The run tolerates what the chief's rule tolerates.
        self.num_byzantine = rule.num_byzantine

    def get_config(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "replicas_to_aggregate": self.replicas_to_aggregate,
            "total_num_replicas": self.total_num_replicas,
            "worker_momentum": self.worker_momentum,
        }


class SyncReplicasMode(BetweenGraphMode):
    """Synchronous between-graph training with backup workers, stale
    gradients dropped, and the rule applied by the chief across workers."""

    name = "sync-replicas"
    summary = (
        "every worker task runs the script; the chief applies each update from "
        "replicas_to_aggregate fresh gradients"
    )
    selectable = False
    # The update service logs lost and returning workers.
    reports_lost_workers = False
    # Each worker compresses what it pushes (`SyncTraining._push`); the
    # chief's apply of the aggregate sends it as it is (compressing it again
    # stepped the chief's random-k seed twice per update, off every other
    # worker's coordinates, and fed the aggregate into its residuals).
    compresses_applied_gradients = False
    # Workers may join and leave (`max_workers`): the counts follow them
    # (`keras_psdist.sync.resizing`).
    elastic = True

    @property
    def owner(self) -> str:
        return self.front

    def without_cluster(self) -> ValueError:
        return ValueError(
            f"{self.owner} trains between worker processes and needs a cluster, "
            "but TF_CONFIG is not set and no cluster_resolver was passed. Run "
            "the script with `keras-psdist launch --mode between-graph "
            f"--num-ps 1 --num-workers 3 -- {runtime.script_command()}` (or "
            "pass cluster_resolver=). On one host, PSStrategy() trains "
            "synchronously on this process's devices."
        )

    def validate(self) -> None:
        super().validate()
        # Bound and resolved now, before connecting: a rule or attack that
        # cannot run fails at once.
        gradients.check_compression_across_workers(
            self.arguments.compression, self.aggregation.rule
        )
        self.attack  # noqa: B018

    @functools.cached_property
    def aggregation(self) -> SyncReplicaAggregation:
        """The rule across workers, bound to `replicas_to_aggregate`."""
        arguments = self.arguments
        workers = runtime.num_training_tasks(self.config)
        total = arguments.total_num_replicas
        if total is None:
            total = workers
        elif total != workers:
            raise ValueError(
                f"total_num_replicas={total}, but the cluster has "
                f"{workers} worker processes (chief and worker tasks) and each "
                "is one replica. Pass total_num_replicas="
                f"{workers} or leave it out."
            )
        # Counts stated as rules follow the number of workers.
        to_aggregate = (
            count_rules.count(
                arguments.replicas_to_aggregate, total, "replicas_to_aggregate"
            )
            or total
        )
        if arguments.max_workers is not None and to_aggregate > total:
            raise ValueError(
                f"replicas_to_aggregate={to_aggregate} is more than the "
                f"{total} workers, so each would send several batches' gradients "
                "per update; a run whose workers join and leave (max_workers="
                f"{arguments.max_workers}) sends one per update. Pass a "
                "replicas_to_aggregate of at most the workers, or a rule such as "
                "'all_but_one' or 0.75 that follows them."
            )
        rule = arguments.aggregator.bind(
            to_aggregate,
            count_rules.count(arguments.num_byzantine, total, "num_byzantine"),
        )
        warn_if_undefended(rule, self.front)
        return SyncReplicaAggregation(
            rule, to_aggregate, total, arguments.worker_momentum
        )

    @functools.cached_property
    def attack(self) -> Any:
        """The simulated attack; its `replicas` are worker indices."""
        aggregation = self.aggregation
        return resolve_worker_attack(
            self.arguments.attack,
            self.arguments.max_workers or aggregation.total_num_replicas,
            aggregation.num_byzantine,
        )

    def run(self, topology: runtime.Topology) -> Run:
        arguments = self.arguments
        attacked = self.attack is not None and (
            topology.worker_index in self.attack.replicas
        )
        return Run(
            self,
            topology,
            arguments.placement,
            self.aggregation,
            None,
            arguments.init_timeout,
            partitioner=arguments.partitioner,
            heartbeat_timeout=arguments.heartbeat_timeout,
            worker_attack=self.attack if attacked else None,
            compression=arguments.compression,
            read_dtype=arguments.read_dtype,
            read_compression=arguments.read_compression,
        )

    def training(
        self, strategy, topology, shared, heartbeats, registry=None
    ) -> SyncTraining:
        """This process's steps, `fit`s and watchdog, and on the chief the
        update service."""
        from keras_psdist.attacks.base import GradientAttack

        aggregation = self.aggregation
        arguments = self.arguments
        sync = SyncReplicas(
            SyncConfig(
                aggregation.replicas_to_aggregate,
                aggregation.total_num_replicas,
                float(arguments.step_timeout),
                worker_names=topology.training_task_names,
                max_workers=topology.max_workers,
            ),
            worker=topology.worker_index,
            is_chief=topology.is_chief,
            device=topology.parameter_devices[0],
            shared=shared,
            local_device=topology.client_device,
            unreachable_servers=functools.partial(
                task_loss.unreachable_tasks, topology.config, ("ps",)
            ),
            namespace=run_namespace("sync"),
        )
        attack = self.attack
        forges = (
            attack is not None
            and topology.worker_index in attack.replicas
            and isinstance(attack, GradientAttack)
        )
        return SyncTraining(
            strategy,
            sync,
            aggregation.rule,
            attack if forges else None,
            topology.parameter_devices,
            heartbeats=heartbeats,
            config=topology.config,
            worker_momentum=aggregation.worker_momentum,
            resizing=None
            if registry is None
            else Resizing(
                arguments.replicas_to_aggregate,
                arguments.num_byzantine,
                arguments.aggregator,
                registry.members,
                arguments.max_workers,
            ),
            registry=registry,
            leave_file=os.environ.get(LEAVE_FILE_ENV),
        )


def resolve_worker_attack(attack, num_workers, num_byzantine):
    """The attack from its config, checked against the workers: omniscient
    attacks, which need the honest workers' gradients, are refused."""
    if attack is None:
        return None
    from keras_psdist import attacks as attacks_lib

    attack = attacks_lib.get(attack)
    if attack.omniscient:
        runnable = [
            name
            for name in attacks_lib.names()
            if not attacks_lib.ATTACKS.lookup(name).omniscient
        ]
        raise ValueError(
            f"{attack!r} forges its gradient from the honest workers' gradients, "
            "which a worker process of SyncReplicaStrategy cannot see. Use "
            f"{', '.join(runnable)} here, or evaluate omniscient attacks with "
            "PSStrategy on one host."
        )
    return resolve_attack(attack, num_workers, num_byzantine)
