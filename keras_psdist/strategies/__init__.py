"""The strategies a user constructs: thin fronts over one extended.

    ps.py            `PSStrategy`: parameter-server placement, robust
                     reduction, one host or a cluster (in-graph or
                     between-graph)
    sync_replica.py  `SyncReplicaStrategy`: TF1's `SyncReplicasOptimizer`
                     semantics between worker processes

Each front checks its arguments (`keras_psdist.modes.Arguments`), chooses a
mode (`keras_psdist.modes`), and hands the description of the run the mode
gives (`keras_psdist.distribute.run.Run`) to
`keras_psdist.distribute.extended.PSExtended`, which builds everything the
run needs from it.
"""

from keras_psdist.strategies.ps import PSStrategy
from keras_psdist.strategies.sync_replica import SyncReplicaStrategy

__all__ = ["PSStrategy", "SyncReplicaStrategy"]
