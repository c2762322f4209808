"""`local`: one process trains on its own devices (no cluster)."""

from __future__ import annotations

from keras_psdist.cluster import runtime
from keras_psdist.cluster.mode_names import IN_GRAPH, LOCAL
from keras_psdist.cluster.runtime import Topology
from keras_psdist.modes.arguments import Arguments
from keras_psdist.modes.base import Mode


class LocalMode(Mode):
    """One host: a replica per local GPU (else per logical CPU), the
    variables on the host CPU (or the one GPU), synchronous steps.

    Chosen by `PSStrategy()` when there is no cluster (no TF_CONFIG, no
    `cluster_resolver`).
    """

    name = LOCAL
    launch = None
    summary = "this process alone trains on its devices, in synchronous steps"
    refines = IN_GRAPH

    @classmethod
    def refines_for(cls, arguments: Arguments) -> bool:
        return arguments.config is None

    def topology(self) -> Topology:
        return runtime.local_topology(
            self.arguments.devices, self.arguments.parameter_devices
        )
