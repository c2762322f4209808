"""`bounded-staleness`: between-graph, no worker more than s steps ahead.

`PSStrategy(mode="between-graph", max_staleness=s)`: stale synchronous
parallel (see `keras_psdist.sync.staleness`, which runs it).
"""

from __future__ import annotations

from keras_psdist.cluster.mode_names import BETWEEN_GRAPH
from keras_psdist.cluster.shared_variables import run_namespace
from keras_psdist.modes.arguments import Arguments
from keras_psdist.modes.between_graph import BetweenGraphMode
from keras_psdist.sync.staleness import BoundedStaleness


class BoundedStalenessMode(BetweenGraphMode):
    """Asynchronous between-graph training in which a worker more than
    `max_staleness` steps ahead of the slowest waits, and a gradient older
    than that is dropped."""

    name = "bounded-staleness"
    summary = (
        "every worker task runs the script; none runs more than max_staleness "
        "steps ahead of the slowest"
    )
    selectable = False
    refines = BETWEEN_GRAPH
    takes_max_staleness = True
    # Its clocks count a fixed set of workers.
    elastic = False

    @classmethod
    def refines_for(cls, arguments: Arguments) -> bool:
        return arguments.max_staleness is not None

    def training(
        self, strategy, topology, shared, heartbeats, registry=None
    ) -> BoundedStaleness:
        """This worker's clock on the ps, its wait before a step and its
        check of each gradient's staleness."""
        return BoundedStaleness(
            strategy,
            self.arguments.max_staleness,
            worker=topology.worker_index,
            num_workers=topology.num_training_processes,
            device=topology.parameter_devices[0],
            shared=shared,
            local_device=topology.client_device,
            step_timeout=float(self.arguments.step_timeout),
            heartbeats=heartbeats,
            names=topology.training_task_names,
            namespace=run_namespace("staleness"),
        )
