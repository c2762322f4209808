"""The cost model: pure functions from one configuration to a `Prediction`.

Per update, with `B` the variables' bytes, `Rb` the bytes a worker reads and
`G` the bytes it sends per step (`wire.py`), `s` the busiest ps task's share
of the variables (`ps_share`), `c` the cores per task, `W` the workers:

- ps CPU per update, on the busiest ps task: `ps_fixed_ms + k (ps_request_ms
  + t ps_tensor_ms) + ps_ms_per_mb k (Rb + G) s + ps_apply_ms_per_mparam *
  params s`, with `k = 1` worker steps per update for async and `k = W` for
  sync and in-graph (each step's requests reach every ps task holding a
  variable), plus `ps_apply_ms_per_variable` for each variable the task
  updates, and `t` the tensors a worker step moves to and from that task
  (`ps_tensors`: its variables read as one and their gradients pushed as
  one, each variable over 256 KiB and each shard alone; sync pushes one per
  variable).
- async: a worker's step takes `step_ms / c + worker_overhead_ms + rtt_ms +
  (Rb + G) / link + ps CPU` (it waits for its own update on the ps);
  updates/s is the least of `W / step`, `c / ps CPU` and, the link carrying
  reads out and gradients in at once, `link / (max(Rb, G) s)`.
- sync and in-graph: one update per `W` worker steps, taking `step_ms / c +
  worker_overhead_ms + rtt_ms + critical + max((Rb + G) / link, W (Rb + G) s
  / link, ps CPU / c)`, `critical` being `sync_critical_path_ms` or
  `in_graph_chief_ms * W` (one step's control reaches each worker in turn,
  from the first worker, where the step is called).
- `machine_cores` (one machine for every task): updates/s is at most
  `machine_cores * shared_core_use / (CPU ms of every task per update /
  1000)`, the tasks keeping that fraction of the cores busy; for sync, the
  update's critical path adds to that time (no worker computes while the
  update is released).

The bottleneck is the least cap's name; for a step's own time, the largest
of its terms.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from keras_psdist.planning.costs import Costs
from keras_psdist.planning.wire import Wire

# The modes of `keras_psdist.modes` that the model predicts, by their names
# there (`PSStrategy(mode=...)`'s words; `keras_psdist.cluster.mode_names`).
BETWEEN_GRAPH, SYNC_REPLICAS, IN_GRAPH = "between-graph", "sync-replicas", "in-graph"
MODES = (BETWEEN_GRAPH, SYNC_REPLICAS, IN_GRAPH)
BOTTLENECKS = (
    "ps CPU",
    "ps link",
    "worker link",
    "worker compute",
    "sync critical path",
    "in-graph critical path",
    "shared cores",
)


@dataclasses.dataclass(frozen=True)
class Setup:
    """One configuration to predict (`plan` checks every field first).

    Attributes:
        variable_bytes: Bytes of each variable, in creation order.
        workers: Worker tasks.
        num_ps: Parameter-server tasks.
        link_mbit: Each task's link, Mbit/s each way; None: unlimited.
        cores_per_task: Cores each task may use.
        batch: Examples per worker step.
        step_ms: The model's forward and backward pass per worker step, on
            one core, in ms.
        machine_cores: Cores all tasks share (one machine), or None.
        partitioned: Variables split evenly over the ps tasks, not placed
            whole.
    """

    variable_bytes: tuple[int, ...]
    workers: int
    num_ps: int
    link_mbit: float | None = None
    cores_per_task: float = 1.0
    batch: int = 128
    step_ms: float = 1.0
    machine_cores: float | None = None
    partitioned: bool = False


@dataclasses.dataclass(frozen=True)
class Prediction:
    """What the cost model predicts for one mode, compression and ps count.

    A prediction, not a measurement (`label` says so in every table and
    JSON it goes to).

    Attributes:
        mode: `"between-graph"`, `"sync-replicas"` or `"in-graph"`.
        compression: The compression spelling.
        num_ps: Parameter-server tasks.
        updates_per_s: Predicted optimizer updates per second.
        examples_per_s: Predicted examples trained per second.
        bottleneck: What bounds it, one of `BOTTLENECKS`.
        ps_cpu_ms_per_update: CPU ms per update on the busiest ps task.
        ps_link_mb_per_update: MB per update through the busiest ps
            task's link (both ways).
        label: Always `"prediction"`.
    """

    mode: str
    compression: str
    num_ps: int
    updates_per_s: float
    examples_per_s: float
    bottleneck: str
    ps_cpu_ms_per_update: float
    ps_link_mb_per_update: float
    label: str = "prediction"


def ps_share(variable_bytes: Sequence[int], num_ps: int, partitioned: bool):
    """`(share, used)`: the busiest ps task's fraction of the bytes, and how
    many ps tasks hold any.

    Whole variables go as `placement="greedy"` (the default) puts them: each
    on the least-loaded task by bytes, in creation order, so one large
    variable bounds what more tasks take off the busiest. Partitioned, each
    task holds `1 / num_ps`.

    >>> ps_share([1000, 10, 10], 2, partitioned=False)
    (0.9803921568627451, 2)
    >>> ps_share([1000, 10, 10], 4, partitioned=True)
    (0.25, 4)
    """
    total = sum(variable_bytes)
    if partitioned or total == 0:
        return 1.0 / num_ps, num_ps
    loads, _ = _greedy(variable_bytes, num_ps)
    return max(loads) / total, sum(load > 0 for load in loads)


# A variable of more bytes than this travels as its own tensor; smaller
# ones of a task travel as one (`keras_psdist.distribute.packed_transfers`'s
# `MAX_PACKED_ELEMENTS` float32 elements).
PACKED_MAX_BYTES = 256 << 10


def ps_tensors(
    variable_bytes: Sequence[int],
    num_ps: int,
    partitioned: bool,
    packed_pushes: bool = True,
):
    """`(busiest, total)`: the tensors a worker step moves to and from the
    busiest ps task (by bytes, as `ps_share` places them), and to and from
    every task. A step reads each task's variables of at most
    `PACKED_MAX_BYTES` as one tensor and each larger one alone, and pushes
    their gradients the same way (`packed_pushes`; sync replicas' pushes go
    one per variable). A partitioned variable's shards (every task holds a
    shard of each) are read and pushed one by one.

    >>> ps_tensors([1000, 10, 10], 2, partitioned=False)
    (2, 4)
    >>> ps_tensors([1000, 10, 10], 1, partitioned=False, packed_pushes=False)
    (4, 4)
    >>> ps_tensors([1000, 10, 10], 4, partitioned=True)
    (6, 24)
    """
    if partitioned:
        return 2 * len(variable_bytes), 2 * len(variable_bytes) * num_ps
    loads, _ = _greedy(variable_bytes, num_ps)
    per_task = [
        _task_tensors(sizes, packed_pushes)
        for sizes in _greedy_tasks(variable_bytes, num_ps)
    ]
    return per_task[loads.index(max(loads))], sum(per_task)


def ps_variables(variable_bytes: Sequence[int], num_ps: int, partitioned: bool):
    """`(busiest, total)`: the variables (or shards) the busiest ps task (by
    bytes, as `ps_share` places them) updates, and every task's together:
    each costs the optimizer's ops once per update, whatever its size.

    >>> ps_variables([1000, 10, 10], 2, partitioned=False)
    (1, 3)
    >>> ps_variables([1000, 10, 10], 4, partitioned=True)
    (3, 12)
    """
    if partitioned:
        return len(variable_bytes), len(variable_bytes) * num_ps
    loads, counts = _greedy(variable_bytes, num_ps)
    return counts[loads.index(max(loads))], sum(counts)


def _task_tensors(sizes: Sequence[int], packed_pushes: bool) -> int:
    """The tensors one worker step moves to and from a task holding
    variables of `sizes` bytes."""
    large = sum(size > PACKED_MAX_BYTES for size in sizes)
    small = len(sizes) - large
    packed = large + min(small, 1)
    return packed + (packed if packed_pushes else len(sizes))


def _greedy_tasks(variable_bytes: Sequence[int], num_ps: int) -> list[list[int]]:
    """The sizes each ps task holds, as `_greedy` places them."""
    loads, tasks = [0] * num_ps, [[] for _ in range(num_ps)]
    for size in variable_bytes:
        task = loads.index(min(loads))
        loads[task] += size
        tasks[task].append(size)
    return tasks


def _greedy(variable_bytes: Sequence[int], num_ps: int):
    """`(loads, counts)` per ps task, bytes and variables, as
    `placement="greedy"` places whole variables: each on the least-loaded
    task by bytes, in creation order."""
    loads, counts = [0] * num_ps, [0] * num_ps
    for size in variable_bytes:
        task = loads.index(min(loads))
        loads[task] += size
        counts[task] += 1
    return loads, counts


def _largest(terms: dict[str, float]) -> str:
    return max(terms, key=terms.get)


def _add(caps: dict[str, float], name: str, updates_per_s: float) -> None:
    """Caps `name` at `updates_per_s` (the least, when it has one already)."""
    caps[name] = min(updates_per_s, caps.get(name, updates_per_s))


def predict(mode: str, wire: Wire, setup: Setup, costs: Costs) -> Prediction:
    """The prediction for `mode` (one of `MODES`) and `wire` on `setup`."""
    total = sum(setup.variable_bytes)
    params_m = total / 4 / 1e6  # float32 parameters, millions
    share, used = ps_share(setup.variable_bytes, setup.num_ps, setup.partitioned)
    cores, workers = setup.cores_per_task, setup.workers
    read_mb = total * wire.read_factor / 1e6
    grad_mb = total * wire.gradient_factor / 1e6
    # MB per ms of one link, each way; None: unlimited.
    rate = None if setup.link_mbit is None else setup.link_mbit / 8 / 1000

    def link_ms(mb: float) -> float:
        return 0.0 if rate is None else mb / rate

    compress_ms = costs.compress_ms_per_mparam * params_m
    worker_cpu = setup.step_ms + costs.worker_overhead_ms
    worker_cpu += compress_ms * (int(wire.gradient_top_k) + int(wire.read_top_k))
    compute = worker_cpu - setup.step_ms + setup.step_ms / cores + costs.rtt_ms
    steps = 1 if mode == BETWEEN_GRAPH else workers  # worker steps per update
    ps_mb = steps * (read_mb + grad_mb) * share
    select = steps * compress_ms if wire.read_top_k else 0.0
    busiest, tensors = ps_tensors(
        setup.variable_bytes,
        setup.num_ps,
        setup.partitioned,
        packed_pushes=mode != SYNC_REPLICAS,
    )
    requests = steps * costs.ps_request_ms
    updated, variables = ps_variables(
        setup.variable_bytes, setup.num_ps, setup.partitioned
    )
    ps_cpu = (
        costs.ps_fixed_ms
        + requests
        + steps * costs.ps_tensor_ms * busiest
        + costs.ps_ms_per_mb * ps_mb
        + (costs.ps_apply_ms_per_mparam * params_m + select) * share
        + costs.ps_apply_ms_per_variable * updated
    )
    ps_cpu_all = (
        (costs.ps_fixed_ms + requests) * used
        + steps * costs.ps_tensor_ms * tensors
        + costs.ps_ms_per_mb * steps * (read_mb + grad_mb)
        + costs.ps_apply_ms_per_mparam * params_m
        + costs.ps_apply_ms_per_variable * variables
        + select
    )
    worker_link = link_ms(read_mb + grad_mb)
    if mode == BETWEEN_GRAPH:
        terms = {
            "worker compute": compute,
            "worker link": worker_link,
            # One request's work on the ps: a chain that does not spread
            # over the task's cores (sync's W requests at once do).
            "ps CPU": ps_cpu,
        }
        caps: dict[str, float] = {}
        _add(caps, _largest(terms), 1000 * workers / sum(terms.values()))
        _add(caps, "ps CPU", 1000 * cores / ps_cpu)
        if rate is not None:
            _add(caps, "ps link", 1000 / link_ms(max(read_mb, grad_mb) * share))
    else:
        if mode == SYNC_REPLICAS:
            critical = ("sync critical path", costs.sync_critical_path_ms)
        else:
            critical = ("in-graph critical path", costs.in_graph_chief_ms * workers)
        transfer = {
            "worker link": worker_link,
            "ps link": link_ms(ps_mb),
            "ps CPU": ps_cpu / cores,
        }
        waits = _largest(transfer)
        terms = {"worker compute": compute, critical[0]: critical[1]}
        terms[waits] = transfer[waits]
        caps = {_largest(terms): 1000 / sum(terms.values())}
    if setup.machine_cores is not None:
        cpu_ms = steps * worker_cpu + ps_cpu_all  # every task's, per update
        busy = setup.machine_cores * costs.shared_core_use
        # A sync update's barrier: while its protocol releases the update,
        # no worker computes, so the shared cores' time and the critical
        # path add up rather than overlap.
        barrier = costs.sync_critical_path_ms if mode == SYNC_REPLICAS else 0.0
        _add(caps, "shared cores", 1000 / (cpu_ms / busy + barrier))
    bottleneck = min(caps, key=caps.get)
    updates = caps[bottleneck]
    examples = updates * setup.batch * steps
    return Prediction(
        mode=mode,
        compression=wire.name,
        num_ps=setup.num_ps,
        updates_per_s=updates,
        examples_per_s=examples,
        bottleneck=bottleneck,
        ps_cpu_ms_per_update=ps_cpu,
        ps_link_mb_per_update=ps_mb,
    )
