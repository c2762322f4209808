"""`in-graph`: one client, the chief, drives every worker task's replicas."""

from __future__ import annotations

from keras_psdist.cluster import runtime
from keras_psdist.cluster.mode_names import IN_GRAPH
from keras_psdist.cluster.runtime import Topology
from keras_psdist.modes.base import Mode


class InGraphMode(Mode):
    """The chief runs the script and drives every worker task's replicas in
    synchronous steps; the variables live on the ps tasks; the worker and ps
    tasks only serve (`keras-psdist serve`).

    `PSStrategy(mode="in-graph")`, the default; without a cluster,
    `LocalMode` refines it.
    """

    name = IN_GRAPH
    launch = IN_GRAPH
    summary = "one client, the chief, drives every worker's replicas in lockstep"
    selectable = True

    def topology(self) -> Topology:
        arguments = self.arguments
        return runtime.connect_in_graph(
            self.config,
            arguments.devices,
            arguments.parameter_devices,
            arguments.connect_timeout,
        )
