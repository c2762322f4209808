"""Execution modes: who runs the replicas, where the variables live, when
updates apply. One module per mode, one registry (`MODES`).

    base.py               `Mode`, the interface every mode implements
                          (validate, topology, run, services, training)
    services.py           `ClusterServices`: what a process runs beside
                          Keras's step (server watch, heartbeats, slots, its
                          `Training`, the hooks Keras's apply and `fit` call)
    arguments.py          `Arguments`: what a front was given, checked
    local.py              `local`: one process, its own devices
    in_graph.py           `in-graph`: the chief drives every worker's replicas
    between_graph.py      `between-graph`: every worker runs the script;
                          asynchronous updates
    bounded_staleness.py  `bounded-staleness`: between-graph, no worker more
                          than max_staleness steps ahead
    sync_replicas.py      `sync-replicas`: the chief applies each update from
                          replicas_to_aggregate fresh workers' gradients

A mode's name is read by the one rule of `keras_psdist.cluster.mode_names`
(underscores as hyphens; `sync` and `async` deprecated), here as in
`PSStrategy(mode=...)` and `keras-psdist launch --mode`.

Examples:

>>> from keras_psdist import modes
>>> modes.get("in_graph").name
'in-graph'
>>> [name for name, mode in modes.MODES.items() if mode.selectable]
['in-graph', 'between-graph']
"""

from __future__ import annotations

from keras_psdist.cluster.mode_names import canonical
from keras_psdist.distribute.run import Training
from keras_psdist.modes.arguments import Arguments
from keras_psdist.modes.base import Mode
from keras_psdist.modes.between_graph import BetweenGraphMode
from keras_psdist.modes.bounded_staleness import BoundedStalenessMode
from keras_psdist.modes.in_graph import InGraphMode
from keras_psdist.modes.local import LocalMode
from keras_psdist.modes.sync_replicas import SyncReplicasMode

# Every mode, by name: the one registry.
MODES: dict[str, type[Mode]] = {
    mode.name: mode
    for mode in (
        LocalMode,
        InGraphMode,
        BetweenGraphMode,
        BoundedStalenessMode,
        SyncReplicasMode,
    )
}


def get(name: str | type[Mode]) -> type[Mode]:
    """The mode class of `name` (any spelling `Mode.spellings` lists), or
    `name` itself if it is a mode class.

    Raises:
        ValueError: for an unknown name, listing the modes.
    """
    if isinstance(name, type) and issubclass(name, Mode):
        return name
    return MODES[canonical(name, tuple(MODES), "keras_psdist.modes.get")]


def choose(name: str, arguments: Arguments, front: str) -> Mode:
    """The mode `front(mode=name)` trains in with `arguments`: the selectable
    mode `name`, or the mode that refines it for them (`LocalMode` without a
    cluster, `BoundedStalenessMode` with `max_staleness`).

    Raises:
        ValueError: for a name no selectable mode has (listing them and what
            each does), or `max_staleness` in a mode that does not bound
            staleness.
    """
    selectable = {n: mode for n, mode in MODES.items() if mode.selectable}
    name = canonical(
        name,
        tuple(selectable),
        front,
        explain="("
        + "; ".join(f"{n}: {mode.summary}" for n, mode in selectable.items())
        + ")",
        stacklevel=4,
    )
    chosen = selectable[name]
    for mode in MODES.values():
        if mode.refines == name and mode.refines_for(arguments):
            chosen = mode
    if arguments.max_staleness is not None and not chosen.takes_max_staleness:
        raise ValueError(
            "max_staleness bounds how far asynchronous workers drift apart; "
            f"it needs mode='between-graph'. Received: mode={name!r}, "
            f"max_staleness={arguments.max_staleness}. For synchronous training "
            "with backup workers use SyncReplicaStrategy."
        )
    return chosen(arguments, front)


__all__ = [
    "MODES",
    "Arguments",
    "BetweenGraphMode",
    "BoundedStalenessMode",
    "InGraphMode",
    "LocalMode",
    "Mode",
    "SyncReplicasMode",
    "Training",
    "choose",
    "get",
]
