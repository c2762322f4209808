"""`Run`: the one description of a run a strategy front hands its extended.

A front (`PSStrategy`, `SyncReplicaStrategy`) checks its arguments and
chooses a mode (`keras_psdist.modes`); the mode finds the devices, binds the
rule, and describes the run here. `PSExtended` builds every collaborator from
it, calls the mode's `training` hook once, and nothing outside sets anything
on the extended afterwards.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from keras_psdist import placement as placement_lib
from keras_psdist.aggregators.base import Aggregator
from keras_psdist.cluster.runtime import Topology


@dataclasses.dataclass(frozen=True)
class Run:
    """What a strategy runs: devices, policies, rule, timeouts, training.

    Attributes:
        mode: The `keras_psdist.modes.Mode` that described the run: the
            extended calls its `training` hook and reads its
            `reports_lost_workers`.
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

    # A `keras_psdist.modes.Mode` (not imported: modes/ builds on distribute/).
    mode: Any
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
