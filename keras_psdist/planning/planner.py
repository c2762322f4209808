"""`plan`: predicted updates/s and examples/s per mode, compression and ps
count, the bottleneck of each, and a recommended mode and ps count."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from keras_psdist.planning import inputs
from keras_psdist.planning import wire as wire_lib
from keras_psdist.planning.costs import Costs
from keras_psdist.planning.model import (
    BETWEEN_GRAPH,
    IN_GRAPH,
    MODES,
    SYNC_REPLICAS,
    Prediction,
    Setup,
    predict,
)
from keras_psdist.planning.report import render

# ps counts tried when `num_ps` is None: every one up to 8, and from
# `MANY_PS_FROM` workers on, a ladder up to 64.
FEW_PS = tuple(range(1, 9))
MANY_PS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
MANY_PS_FROM = 64
# A ps count is enough once it predicts this share of its mode's best.
ENOUGH = 0.95


@dataclasses.dataclass(frozen=True)
class Recommendation:
    """The mode, ps count and compression `plan` recommends, and why.

    Attributes:
        mode: `"between-graph"`, `"sync-replicas"` or `"in-graph"`.
        num_ps: The fewest ps tasks within 5 % of the mode's best.
        compression: The first compression listed that is within 5 % there.
        why: One sentence.
        strategy: The strategy to build in the script, as code.
        launch: The command that starts the job on one machine's processes
            (`keras-psdist launch`; `train.py` stands for the script).
    """

    mode: str
    num_ps: int
    compression: str
    why: str
    strategy: str = ""
    launch: str = ""


@dataclasses.dataclass(frozen=True)
class Plan:
    """What `plan` returns: predictions, not measurements.

    Attributes:
        predictions: One `Prediction` per mode, compression and ps count.
        recommendation: The `Recommendation`.
        by_mode: Each mode's pick: its fewest ps tasks within 5 % of its best
            (and of those, the compression listed first).
        inputs: The configuration predicted (workers, link, cores, batch,
            step_ms used, ...).
        costs: The `Costs` the predictions used.
    """

    predictions: list[Prediction]
    recommendation: Recommendation
    by_mode: dict[str, Prediction]
    inputs: dict[str, Any]
    costs: Costs

    def to_dict(self) -> dict[str, Any]:
        """Everything, as JSON-ready dicts and lists."""
        return {
            "label": "prediction",
            "inputs": dict(self.inputs),
            "costs": dataclasses.asdict(self.costs),
            "predictions": [dataclasses.asdict(p) for p in self.predictions],
            "recommendation": dataclasses.asdict(self.recommendation),
        }

    def __str__(self) -> str:
        return render(self.predictions, self.by_mode, self.recommendation, self.inputs)


def _pick(rows: list[Prediction], order: list[str]) -> Prediction:
    """The fewest ps tasks within 5 % of the best; of those, the compression
    listed first (the simplest that is enough)."""
    best = max(p.examples_per_s for p in rows)
    enough = [p for p in rows if p.examples_per_s >= ENOUGH * best]
    return min(enough, key=lambda p: (p.num_ps, order.index(p.compression)))


def _recommend(by_mode: dict[str, Prediction], exact: bool, counts: tuple[int, ...]):
    if exact:
        pool = [m for m in (SYNC_REPLICAS, IN_GRAPH) if m in by_mode]
    else:
        pool = [BETWEEN_GRAPH] if BETWEEN_GRAPH in by_mode else list(by_mode)
    mode = max(pool, key=lambda m: by_mode[m].examples_per_s)
    pick = by_mode[mode]
    why = (
        f"It predicts {pick.examples_per_s:,.0f} examples/s, bounded by "
        f"{pick.bottleneck}"
    )
    if len(counts) > 1:
        why += (
            "; more ps tasks predict under 5 % more"
            if pick.num_ps < max(counts)
            else f"; {pick.num_ps} is the most ps tasks tried"
        )
    others = {m: p.examples_per_s for m, p in by_mode.items() if m != mode}
    rivals = [m for m in (SYNC_REPLICAS, IN_GRAPH) if m in others]
    if exact and rivals:
        why += f"; the other exact mode, {rivals[0]}, predicts {others[rivals[0]]:,.0f}"
    elif mode == BETWEEN_GRAPH and others:
        fastest = max(others, key=others.get)
        ratio = pick.examples_per_s / others[fastest]
        why += "; updates need not be exact (exact=False), " + (
            f"and it predicts {ratio:.2f}x {fastest}'s examples/s"
            if ratio >= 1
            else f"though {fastest} predicts {1 / ratio:.2f}x its examples/s"
        )
    return Recommendation(mode, pick.num_ps, pick.compression, why + ".")


def _how_to_run(rec: Recommendation, workers: int, partitioned: bool) -> Recommendation:
    """`rec` with the strategy to write and the command to start it."""
    arguments = [
        f'{k}="{v}"' for k, v in wire_lib.strategy_arguments(rec.compression).items()
    ]
    if partitioned and rec.num_ps > 1:
        arguments.append(f"partitioner=kpd.partitioners.Fixed({rec.num_ps})")
    if rec.mode == SYNC_REPLICAS:
        strategy = "kpd.SyncReplicaStrategy"
    else:
        strategy = "kpd.PSStrategy"
        if rec.mode == BETWEEN_GRAPH:
            arguments.insert(0, 'mode="between-graph"')
    launch = f"keras-psdist launch --num-ps {rec.num_ps} --num-workers {workers}"
    if rec.mode != IN_GRAPH:
        launch += " --mode between-graph"
    return dataclasses.replace(
        rec,
        strategy=f"{strategy}({', '.join(arguments)})",
        launch=f"{launch} -- python train.py",
    )


def ps_counts_tried() -> str:
    """What `plan` tries when no ps count is given, in words.

    >>> ps_counts_tried()
    '1 to 8 tried; up to 64 from 64 workers on'
    """
    return (
        f"{FEW_PS[0]} to {FEW_PS[-1]} tried; up to {MANY_PS[-1]} from "
        f"{MANY_PS_FROM} workers on"
    )


def plan(
    model: Any = None,
    *,
    variable_bytes: Sequence[int] | None = None,
    workers: int,
    num_ps: int | None = None,
    link_mbit: float | None = None,
    cores_per_task: float = 1.0,
    batch: int = 128,
    step_ms: float | None = None,
    machine_cores: float | None = None,
    modes: Sequence[str] = MODES,
    compressions: Sequence[str] = ("none",),
    exact: bool = False,
    partitioned: bool = False,
    costs: Costs | None = None,
) -> Plan:
    """Predicts updates/s and examples/s from measured costs, and recommends.

    For each mode, named as `PSStrategy(mode=...)` names it
    (`"between-graph"`: `PSStrategy(mode="between-graph")`, asynchronous;
    `"sync-replicas"`: `SyncReplicaStrategy(replicas_to_aggregate=workers)`;
    `"in-graph"`: `PSStrategy()`), compression and ps count, the cost model of
    `keras_psdist.planning.model` predicts the updates and examples per
    second and names what bounds them: `"ps CPU"`, `"ps link"`, `"worker
    link"`, `"worker compute"`, the `"sync critical path"` or the `"in-graph
    critical path"`, or `"shared cores"`. Its constants (`Costs`) come from
    this repository's benchmarks (docs/planning.md).

    Args:
        model: A built `keras.Model`, or the path of a `.keras` file (loaded
            with `compile=False`): its trainable variables' sizes. Exactly one
            of `model` and `variable_bytes`.
        variable_bytes: The bytes of each variable, in creation order.
        workers: Worker tasks, >= 1.
        num_ps: Parameter-server tasks; None tries 1 to 8 (and up to 64 from
            64 workers on) and recommends the fewest within 5 % of the best.
        link_mbit: Each task's link, Mbit/s each way; None: unlimited.
        cores_per_task: Cores each task may use. Defaults to 1.
        batch: Examples per worker step. Defaults to 128.
        step_ms: The model's forward and backward pass per worker step on
            one core, in ms; None estimates `6 * params * batch /
            costs.flops_per_core_ms`.
        machine_cores: The cores every task shares, for one machine's test
            bed; None: each task has its own.
        modes: Which of `"between-graph"`, `"sync-replicas"`, `"in-graph"` to predict
            (the names of `PSStrategy(mode=...)`; underscores read as hyphens).
        compressions: Spellings as `benchmarks/scaling.py --compression`
            writes them: `"none"`, `"fp16"`, `"bf16"`, `"top_k(ratio=0.01)"`,
            with `@bfloat16` for 16-bit reads (`keras_psdist.planning.wire`);
            in order of preference: within 5 %, the first listed is picked.
        exact: Recommend only a mode whose updates apply every worker's
            gradient (sync-replicas or in-graph). Defaults to False:
            between-graph (asynchronous).
        partitioned: The variables are split evenly over the ps tasks (a
            partitioner); False places each whole, as `placement="greedy"`.
        costs: The constants; defaults to `Costs()`.

    Returns:
        A `Plan`: `predictions`, `recommendation`; `str()` is a markdown
        table, `to_dict()` JSON-ready.

    Raises:
        ValueError: for any argument out of range, naming what it received
            and what it takes.

    Examples:

    Four 4 MB variables, 16 workers on 100 Mbit/s links: the ps tasks'
    links bound async training, and four tasks, one variable each, are
    enough:

    >>> from keras_psdist.planning import plan
    >>> result = plan(variable_bytes=[4_000_000] * 4, workers=16,
    ...               link_mbit=100, modes=("between-graph",))
    >>> result.recommendation.mode, result.recommendation.num_ps
    ('between-graph', 4)
    >>> result.by_mode["between-graph"].bottleneck
    'ps link'
    >>> print(result)  # doctest: +ELLIPSIS
    Predicted by keras_psdist's cost model (not measured): 16 workers, ...
    >>> plan(variable_bytes=[1000], workers=0)
    Traceback (most recent call last):
    ...
    ValueError: `workers` must be >= 1. Received: workers=0
    """
    workers = inputs.integer("workers", workers)
    counts = (
        (FEW_PS if workers < MANY_PS_FROM else MANY_PS)
        if num_ps is None
        else (inputs.integer("num_ps", num_ps),)
    )
    link = inputs.positive("link_mbit", link_mbit, none="unlimited")
    cores = inputs.positive("cores_per_task", cores_per_task)
    batch = inputs.integer("batch", batch)
    machine = inputs.positive("machine_cores", machine_cores, none="no shared cores")
    chosen_modes = inputs.modes(modes)
    wires = inputs.wires(compressions)
    for name, flag in (("exact", exact), ("partitioned", partitioned)):
        if not isinstance(flag, bool):
            raise ValueError(f"`{name}` must be True or False. Received: {flag!r}")
    if exact and not {SYNC_REPLICAS, IN_GRAPH} & set(chosen_modes):
        raise ValueError(
            "exact=True recommends sync-replicas or in-graph, but `modes` has neither. "
            f"Received: modes={tuple(chosen_modes)!r}. Add 'sync-replicas' or 'in-graph'."
        )
    costs = Costs() if costs is None else costs
    if not isinstance(costs, Costs):
        raise ValueError(f"`costs` must be a Costs. Received: costs={costs!r}")
    # Last: it may load a .keras file, once everything else is known good.
    sizes = inputs.variable_bytes(model, variable_bytes)
    params = sum(sizes) // 4
    given = step_ms is not None
    step = (
        inputs.positive("step_ms", step_ms)
        if given
        else 6 * params * batch / costs.flops_per_core_ms
    )
    predictions = [
        predict(mode, wire, Setup(sizes, workers, n, link, cores, batch, step,
                                  machine, partitioned), costs)
        for mode in chosen_modes
        for wire in wires
        for n in counts
    ]  # fmt: skip
    by_mode = {
        mode: _pick([p for p in predictions if p.mode == mode], [w.name for w in wires])
        for mode in chosen_modes
    }
    described = {
        "workers": workers, "num_ps": num_ps, "link_mbit": link,
        "cores_per_task": cores, "batch": batch, "step_ms": step,
        "step_ms_given": given, "machine_cores": machine,
        "params": params, "variable_mb": sum(sizes) / 1e6,
        "variables": len(sizes), "partitioned": partitioned, "exact": exact,
    }  # fmt: skip
    return Plan(
        predictions=predictions,
        recommendation=_how_to_run(
            _recommend(by_mode, exact, counts), workers, partitioned
        ),
        by_mode=by_mode,
        inputs=described,
        costs=costs,
    )
