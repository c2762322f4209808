"""`between-graph`: every worker task runs the script; updates apply at once."""

from __future__ import annotations

import dataclasses

from keras_psdist.cluster import runtime
from keras_psdist.cluster.mode_names import BETWEEN_GRAPH
from keras_psdist.cluster.runtime import Topology
from keras_psdist.modes.base import Mode


class BetweenGraphMode(Mode):
    """Every worker task runs the same script on its piece of each batch;
    the variables live on the ps tasks, shared by every worker; each worker
    applies its own updates as they come (asynchronous training).

    `PSStrategy(mode="between-graph")`; with `max_staleness`,
    `BoundedStalenessMode` refines it.
    """

    name = BETWEEN_GRAPH
    launch = BETWEEN_GRAPH
    summary = "every worker task runs the script and applies its updates asynchronously"
    selectable = True
    replicates_variables = False

    # Workers may join and leave (`max_workers`, `keras_psdist.cluster.elastic`).
    elastic = True

    def topology(self) -> Topology:
        arguments = self.arguments
        topology = runtime.connect_between_graph(
            self.config,
            arguments.devices,
            arguments.parameter_devices,
            arguments.connect_timeout,
        )
        if arguments.max_workers is not None:
            topology = dataclasses.replace(topology, max_workers=arguments.max_workers)
        return topology
