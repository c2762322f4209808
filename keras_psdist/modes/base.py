"""`Mode`: the interface every execution mode implements.

A strategy front checks its arguments (`Arguments.checked`), chooses a mode,
and hands over; the mode does the rest, in this order:

| hook                       | who calls it            | what it does                        |
|----------------------------|-------------------------|-------------------------------------|
| `modes.choose(name, ...)`  | the front               | the mode `name`, or one that       |
|                            |                         | `refines` it for these arguments   |
|                            |                         | (one host: `local`)                |
| `validate()`               | the front               | checks before anything connects    |
| `topology()`               | the front               | finds or connects to the devices   |
| `run(topology)`            | the front               | the `Run` its extended builds from |
| `services(strategy, ...)`  | the extended, once its  | this process's `RunServices`:      |
|                            | shared variables exist  | server watch, heartbeats, slots,   |
|                            |                         | and its `training`                 |
| `training(strategy, ...)`  | `services`, once the    | this process's part in training    |
|                            | heartbeats exist        | beyond Keras's own step, or None   |

`training` returns a `Training` (`keras_psdist.distribute.run.Training`),
whose hooks Keras's wrapped `apply` and `fit` call
(`keras_psdist.integration.training_hooks`); a mode that leaves Keras's step
as it is returns None (the default), and Keras runs untouched.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import tensorflow as tf

from keras_psdist import count_rules, dense_choice
from keras_psdist.cluster import runtime
from keras_psdist.cluster.mode_names import spellings
from keras_psdist.cluster.runtime import Topology
from keras_psdist.cluster.shared_variables import SharedVariables
from keras_psdist.distribute.run import Run, Training
from keras_psdist.errors import JoinRefusedError
from keras_psdist.modes import services as services_lib
from keras_psdist.modes.arguments import (
    Arguments,
    resolve_attack,
    warn_if_undefended,
)


class Mode(abc.ABC):
    """How a run trains: who runs the replicas, where the variables live,
    when updates apply. One instance per strategy, made by its front.

    Args:
        arguments: The front's checked arguments.
        front: The front's name, for messages (`"PSStrategy"`).

    Attributes:
        name: The mode's name in the registry (`keras_psdist.modes.MODES`).
        launch: The `keras-psdist launch --mode` a cluster of this mode is
            started with, or None: one process, no cluster.
        summary: What the mode does, in a few words, for messages.
        selectable: Whether `PSStrategy(mode=name)` chooses it.
        refines: The selectable mode this one replaces when `refines_for`
            the arguments (`keras_psdist.modes.choose`), or None.
        takes_max_staleness: Whether the mode bounds staleness.
        replicates_variables: Whether variables may be replicated on the
            replicas (`dense="all_reduce"`): needs one client that sees
            every replica.
        reports_lost_workers: Between-graph, whether the chief logs lost and
            returning workers (a mode whose training logs them itself says
            False).
        compresses_applied_gradients: Between graphs with compression,
            whether Keras's apply compresses each gradient on its way to the
            ps tasks (each worker applies its own). False where a worker
            sends its payload another way and the apply is of the aggregate
            (sync replicas: the chief's apply must not compress it again).
    """

    name: ClassVar[str]
    launch: ClassVar[str | None]
    summary: ClassVar[str]
    selectable: ClassVar[bool] = False
    refines: ClassVar[str | None] = None
    takes_max_staleness: ClassVar[bool] = False
    replicates_variables: ClassVar[bool] = True
    reports_lost_workers: ClassVar[bool] = True
    compresses_applied_gradients: ClassVar[bool] = True

    def __init__(self, arguments: Arguments, front: str):
        self.arguments = arguments
        self.front = front

    @classmethod
    def spellings(cls) -> tuple[str, ...]:
        """Every name `keras_psdist.modes.get` reads as this mode."""
        return spellings(cls.name)

    @classmethod
    def refines_for(cls, arguments: Arguments) -> bool:
        """Whether this mode replaces the mode `refines` for `arguments`
        (e.g. `local` replaces `in-graph` without a cluster). Only read when
        `refines` is set."""
        return False

    @property
    def owner(self) -> str:
        """Who trains in this mode, for messages: `PSStrategy(mode='in-graph')`,
        or `PSStrategy on one host` (a mode no `mode=` names)."""
        if self.launch is None:
            return f"{self.front} on one host"
        return f"{self.front}(mode={self.launch!r})"

    @property
    def config(self):
        """The cluster, or None on one host."""
        return self.arguments.config

    def validate(self) -> None:
        """Checks, before anything connects, that this process can train in
        this mode with these arguments.

        Raises:
            ValueError: naming what is wrong and the fix.
        """
        dense = self.arguments.dense
        if not self.replicates_variables and not isinstance(
            dense_choice.get(dense), (dense_choice.AllOnPS, dense_choice.AutoChoice)
        ):
            raise ValueError(
                f"dense={dense!r} replicates variables on the replicas, which "
                "needs one client that sees every replica: one host or "
                "mode='in-graph'. Between-graph workers keep every variable "
                f"on the ps tasks. Received: mode={self.launch!r}; leave dense= "
                "out, or train in-graph."
            )
        max_workers = self.arguments.max_workers
        if max_workers is not None and not self.elastic:
            raise ValueError(
                f"max_workers={max_workers} lets workers join and leave a "
                "running job, which asynchronous between-graph training "
                "(PSStrategy(mode='between-graph', max_workers=M) without "
                "max_staleness) and SyncReplicaStrategy(max_workers=M) do. "
                f"This run is {self.name!r} ({self.summary}); "
                "leave max_workers out here (or launch without --max-workers, "
                "which sets it for every worker)."
            )
        if self.launch is None:
            return
        if self.config is None:
            raise self.without_cluster()
        runtime.check_launch_mode(self.config, self.launch, self.owner)
        if max_workers is not None:
            check_slot(self.config, max_workers)

    # Whether workers may join and leave a running job (`max_workers`).
    elastic: bool = False

    def without_cluster(self) -> ValueError:
        """The error for a cluster mode started without a cluster."""
        return ValueError(
            f"{self.owner} trains between processes and needs a cluster, but "
            "TF_CONFIG is not set and no cluster_resolver was passed. Run the "
            f"script with `keras-psdist launch --mode {self.launch} --num-ps 1 "
            f"--num-workers 2 -- {runtime.script_command()}` (or pass "
            "cluster_resolver=); on one host, leave mode out."
        )

    @abc.abstractmethod
    def topology(self) -> Topology:
        """The run's devices: this process's, or the cluster's once
        connected.

        Raises:
            ConnectionError: if a task does not answer within
                `connect_timeout`.
        """

    def run(self, topology: Topology) -> Run:
        """The run the extended builds: here, the rule bound to one replica
        per compute device, and the attack on them."""
        arguments = self.arguments
        n = len(topology.compute_devices)
        aggregator = arguments.aggregator.bind(
            n, count_rules.count(arguments.num_byzantine, n, "num_byzantine")
        )
        warn_if_undefended(aggregator, self.front)
        return Run(
            self,
            topology,
            arguments.placement,
            aggregator,
            resolve_attack(arguments.attack, n, aggregator.num_byzantine),
            arguments.init_timeout,
            partitioner=arguments.partitioner,
            heartbeat_timeout=arguments.heartbeat_timeout,
            worker_momentum=arguments.worker_momentum,
            dense=arguments.dense,
            compression=arguments.compression,
            read_dtype=arguments.read_dtype,
            read_compression=arguments.read_compression,
        )

    def services(
        self, strategy: tf.distribute.Strategy, run: Run, shared: Any
    ) -> services_lib.ClusterServices:
        """Starts this process's services for `run` (a `RunServices`: see
        `keras_psdist.modes.services`), its `training` among them.

        Called once by the extended, when it has made the run's shared
        variables (`SharedVariables` between graphs, else None).

        Raises:
            JoinRefusedError: an elastic joiner that may not take its slot.
        """
        return services_lib.start(
            run.topology,
            shared,
            run.heartbeat_timeout,
            training=lambda heartbeats, registry: self.training(
                strategy, run.topology, shared, heartbeats, registry
            ),
            reports_lost_workers=self.reports_lost_workers,
        )

    def training(
        self,
        strategy: tf.distribute.Strategy,
        topology: Topology,
        shared: SharedVariables | None,
        heartbeats: Any,
        registry: Any = None,
    ) -> Training | None:
        """This process's part in training beyond Keras's own step.

        Called once by `services`, when it has made the run's heartbeats
        (between-graph; else None).

        Args:
            strategy: The strategy (for `scope()` once training runs).
            topology: The run's devices.
            shared: Opens (on the chief, creates) variables on the ps tasks.
            heartbeats: This process's `cluster.liveness.Heartbeats`.
            registry: Who trains (`cluster.elastic.SlotTable`) when workers
                join and leave (`max_workers`), else None.

        Returns:
            None (the default): Keras's step runs as it is.
        """
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(owner={self.owner!r})"


def check_slot(config: Any, max_workers: int) -> None:
    """Refuses (`JoinRefusedError`) a process whose worker index is not below
    `max_workers`, or a cluster whose TF_CONFIG lists more workers than it,
    before it connects."""
    listed = runtime.num_training_tasks(config)
    index = runtime.training_task_names(config).index(
        f"{config.task_type}:{config.task_id}"
    )
    if index >= max_workers or listed > max_workers:
        raise JoinRefusedError(
            f"This process starts as {config.task_type}:{config.task_id} (worker "
            f"index {index}) in a TF_CONFIG that lists {listed} training tasks, but "
            f"the job takes at most max_workers={max_workers}. Start it with an "
            f"index below {max_workers} that no live worker holds, or raise "
            "max_workers in every process of the job (the ps tasks keep "
            "running; the running workers need a restart to use a larger one)."
        )
