"""The planner against measurements: `keras_psdist.plan`'s predictions beside
`benchmarks/scaling.py` runs, and its constants fitted from such runs.

Without ``--fit``: each configuration of the grid (``--kinds`` x
``--workers`` x ``--ps`` x ``--mbit`` x ``--compression``) trains the MLP of
``scaling.py`` (64-512-512-2, Adam, 1.19 MB) once on separate hosts (network
namespaces, root: ``harness.host_runs.run_once`` with ``scaling.py``'s
children) and is predicted with ``plan(...,
cores_per_task=os.cpu_count(), machine_cores=os.cpu_count())`` (the tasks
share this machine's cores); the table gives measured and predicted
examples/s and the error (target: within 25 %). The JSON holds the runs, in
``scaling.py``'s form, with their predictions: ``--fit`` reads it back.

``--fit RESULTS.json...``: the runs of ``scaling.py``-style JSON (lists of
runs with ``kind``, ``workers``, ``num_ps``, ``mbit``, ``updates_per_s``,
``cpu_fraction``; optionally ``worker_cpu_ms_per_step``, every ps task's
``ps_cpu_ms_per_update`` summed, and ``model_step``'s ``cpu_ms``) give a ``Costs(...)`` to paste into
``keras_psdist/planning/costs.py``: the worker overhead and top-k cost from
medians of worker CPU per step, the ps costs by least squares on ps CPU per
update (when recorded), the sync and in-graph critical paths by least
squares of log updates/s. A constant the runs cannot tell is kept, and said.

From the repository root::

    python benchmarks/plan_check.py                       # the grid (root)
    python benchmarks/plan_check.py --workers 1 --ps 1 --mbit 0 --kinds async \\
        --steps 20 --epochs 1 --json /tmp/plan_check_smoke.json   # smoke run
    python benchmarks/plan_check.py --fit benchmarks/results/scaling*.json
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness
import numpy as np

harness.prepare_tensorflow()
harness.ensure_importable()

from keras_psdist.planning import Costs, model, plan, wire  # noqa: E402

KINDS = ("async", "sync", "in-graph")
# The planner's name (PSStrategy(mode=...)'s) of the mode each scaling.py kind runs.
PLANNER_MODE = {"async": model.BETWEEN_GRAPH, "sync": model.SYNC_REPLICAS,
                "in-graph": model.IN_GRAPH}  # fmt: skip
SCALING = Path(__file__).resolve().parent / "scaling.py"  # its children, run


def mlp_bytes(hidden: int = 512, depth: int = 2) -> list[int]:
    """The variables of scaling.py's MLP (64, then `depth` layers of
    `hidden`, then 2), in creation order."""
    hidden_layers = [hidden * hidden, hidden] * (depth - 1)
    return [4 * n for n in (64 * hidden, hidden, *hidden_layers,
                            hidden * 2, 2)]  # fmt: skip


def run_sizes(run: dict) -> list[int]:
    """The variables' bytes of the MLP `run` trained (`hidden`, `depth`;
    scaling.py's defaults, 512 and 2, for a run that does not say)."""
    return mlp_bytes(run.get("hidden", 512), run.get("depth", 2))


def predict(run: dict, cores: float, costs: Costs, batch: int):
    """The planner's prediction for one run's configuration."""
    return plan(
        variable_bytes=run_sizes(run), workers=run["workers"], num_ps=run["num_ps"],
        link_mbit=run.get("mbit") or None, cores_per_task=cores, batch=batch,
        machine_cores=cores, modes=(PLANNER_MODE[run["kind"]],),
        compressions=(run.get("compression") or "none",), costs=costs,
    ).predictions[0]  # fmt: skip


def measure(args) -> int:
    from harness import host_runs

    from keras_psdist.testing import hosts

    hosts.check_available()
    harness.use_checkout()
    cores, runs, rows = os.cpu_count(), [], []
    model_size = {"hidden": args.hidden, "depth": args.depth}
    load_start, start = harness.loadavg(), time.monotonic()
    grid = list(itertools.product(args.kinds, args.workers, args.ps, args.mbit,
                                  args.compression))  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="plan-check-") as tmp:
        for round_ in range(args.rounds):
            # Odd rounds run the grid backwards: no configuration always
            # runs first, or after the same one.
            for kind, workers, num_ps, mbit, compression in (
                grid if round_ % 2 == 0 else grid[::-1]
            ):
                # scaling.py's children train each configuration.
                run = host_runs.run_once(SCALING, kind, workers, num_ps, args, Path(tmp),
                                         mbit=mbit or None, compression=compression)  # fmt: skip
                runs.append({**run, **model_size, "round": round_})
    configurations = [_checked(c, cores, args.batch) for c in _medians(runs)]
    rows = [_row(c) for c in configurations]
    columns = ["kind", "workers", "ps", "link", "compression", "measured examples/s",
               "predicted examples/s", "error", "predicted bottleneck",
               "within 25 %"]  # fmt: skip
    if args.rounds > 1:
        columns[5] = f"measured examples/s (median of {args.rounds} rounds)"
    print(harness.markdown_table(rows, columns))
    errors = [abs(c["prediction_error"]) for c in configurations
              if "prediction_error" in c]  # fmt: skip
    within = sum(e <= 0.25 for e in errors)
    print(f"{within} of {len(errors)} configurations within 25 %")
    out = harness.write_results(
        args.json,
        {
            "settings": {k: getattr(args, k) for k in
                         ("kinds", "workers", "ps", "mbit", "compression", "steps",
                          "epochs", "batch", "steps_per_execution", "seed",
                          "hidden", "depth")},
            "costs": dataclasses.asdict(Costs()),
            "loadavg_start": load_start,
            "loadavg_end": harness.loadavg(),
            "wall_s": time.monotonic() - start,
            "rounds": args.rounds,
            "runs": runs,
            "configurations": configurations,
        },
    )  # fmt: skip
    print(f"wrote {out}")
    return 1 if any("error" in r for r in runs) else 0


def _medians(runs: list[dict]) -> list[dict]:
    """One entry per configuration, in the order first run: its first
    round's run with the medians of every round's examples/s and updates/s
    (`examples_per_s_rounds` lists them); a configuration that failed in
    every round keeps its first error."""
    keys = ("kind", "workers", "num_ps", "mbit", "compression")
    by_config: dict[tuple, list[dict]] = {}
    for run in runs:
        by_config.setdefault(tuple(run.get(k) for k in keys), []).append(run)
    merged = []
    for same in by_config.values():
        done = [r for r in same if "error" not in r]
        if not done:
            merged.append(same[0])
            continue
        merged.append({
            **done[0],
            "examples_per_s": statistics.median(r["examples_per_s"] for r in done),
            "updates_per_s": statistics.median(r["updates_per_s"] for r in done),
            "examples_per_s_rounds": [r["examples_per_s"] for r in done],
        })  # fmt: skip
    return merged


def _checked(run: dict, cores: int, batch: int) -> dict:
    """`run` with its prediction and the prediction's error."""
    if "error" in run:  # the run failed; scaling.py put its log tail there
        return run
    p = predict(run, cores, Costs(), batch)
    error = p.examples_per_s / run["examples_per_s"] - 1
    return {**run, "predicted": dataclasses.asdict(p), "prediction_error": error}


def _row(run: dict) -> list:
    config = [run["kind"], run["workers"], run["num_ps"], run["mbit"] or "unlimited",
              run["compression"]]  # fmt: skip
    if "error" in run:
        return [*config, "failed", "", "", "", ""]
    p, e = run["predicted"], run["prediction_error"]
    return [*config, f"{run['examples_per_s']:.0f}", f"{p['examples_per_s']:.0f}",
            f"{100 * e:+.0f} %", p["bottleneck"], "yes" if abs(e) <= 0.25 else "no"]  # fmt: skip


def worker_cpu_per_step(run: dict) -> float | None:
    """A worker's CPU ms per step: recorded, or from `cpu_fraction` (async:
    each worker makes updates/workers steps; sync: the non-chief workers one
    per update; in-graph: not known, the workers being servers)."""
    if run.get("worker_cpu_ms_per_step") is not None:
        return run["worker_cpu_ms_per_step"]
    fractions = run.get("cpu_fraction") or {}
    rate = run.get("updates_per_s")
    if not rate or run["kind"] not in ("async", "sync"):
        return None
    if run["kind"] == "async":
        samples = [f * run["workers"] / rate * 1000 for f in fractions.values()]
    else:
        samples = [f / rate * 1000 for t, f in fractions.items() if t != "worker:0"]
    return statistics.median(samples) if samples else None


def _model_size(payload: dict, hidden: int, depth: int) -> dict:
    """The MLP a results file's runs trained: its settings' (or command's)
    `--hidden` and `--depth`, else `hidden` and `depth`."""
    settings, words = payload.get("settings") or {}, payload.get("command", "").split()
    size = {"hidden": hidden, "depth": depth}
    for name in size:
        if f"--{name}" in words[:-1]:
            size[name] = int(words[words.index(f"--{name}") + 1])
        size[name] = settings.get(name) or size[name]
    return size


def read_runs(
    paths: list[str], hidden: int = 512, depth: int = 2
) -> tuple[list[dict], float | None]:
    """Every run of the dense MLP in `paths` (each with its model's `hidden`
    and `depth`, and `model_step_ms`, the CPU ms of that model's own step on
    one device when its file timed it), and the machine's cores."""
    runs, cores = [], None
    for path in paths:
        payload = json.loads(Path(path).read_text())
        machine = payload.get("machine") or payload.get("environment") or {}
        cores = cores or machine.get("cpu_count")
        steps = [m["cpu_ms"] for m in payload.get("model_step") or [] if m]
        size = _model_size(payload, hidden, depth)
        size["model_step_ms"] = statistics.median(steps) if steps else None
        for key, value in payload.items():
            if not isinstance(value, list) or key == "configurations":
                continue  # plan_check's medians: its runs are read
            runs += [{"compression": "none", **size, **run, "file": path} for run in value
                     if isinstance(run, dict) and run.get("kind") in KINDS
                     and not run.get("rows") and "error" not in run
                     # The planner predicts packed transfers, the default.
                     and run.get("compression") != "unpacked"
                     and isinstance(run.get("updates_per_s"), float)]  # fmt: skip
    return runs, cores


def _log_error(runs, cores, costs, batch) -> float:
    return sum(math.log(predict(r, cores, costs, batch).updates_per_s
                        / r["updates_per_s"]) ** 2 for r in runs)  # fmt: skip


def _least_log_error(name, grid, runs, cores, costs, batch) -> float:
    """The value of `costs.name` in `grid` that predicts `runs`' updates/s
    best (least squares of the log)."""
    return min(grid, key=lambda v: _log_error(
        runs, cores, dataclasses.replace(costs, **{name: v}), batch))  # fmt: skip


def _params_m(run: dict) -> float:
    return sum(run_sizes(run)) / 4e6  # float32 parameters, millions


def fit(runs: list[dict], cores: float, batch: int, keep=()):
    """The fitted `Costs`, and a note per constant on what it came from; the
    ps costs named in `keep` stay as they are. Each run is predicted with
    its own model's sizes (`run_sizes`)."""
    costs, notes = Costs(), {}

    def apply_ms(run):  # the Adam update of the run's model
        return costs.ps_apply_ms_per_mparam * _params_m(run)

    own = {}  # each model's own step on one device, less the update
    for r in runs:
        if r.get("model_step_ms") and r["model_step_ms"] > apply_ms(r):
            flops = 6 * _params_m(r) * 1e6 * batch
            own[r["file"]] = flops / (r["model_step_ms"] - apply_ms(r))
    if own:
        costs = dataclasses.replace(
            costs, flops_per_core_ms=round(statistics.median(own.values()), -4)
        )
        notes["flops_per_core_ms"] = f"the models' own steps, {len(own)} files"

    def step(run):
        return 6 * _params_m(run) * 1e6 * batch / costs.flops_per_core_ms

    plain = [r for r in runs if r["compression"] == "none"]
    # Async workers on unlimited links: a slow link or the sync protocol
    # adds CPU per step that is not the step's own.
    fast = [r for r in runs if r["kind"] == "async" and not r.get("mbit")]
    cpu = {id(r): c for r in fast if (c := worker_cpu_per_step(r)) is not None}
    base = [cpu[id(r)] - step(r) for r in fast
            if id(r) in cpu and r["compression"] == "none"]  # fmt: skip
    if base:
        value = max(0.0, statistics.median(base))
        costs = dataclasses.replace(costs, worker_overhead_ms=round(value, 3))
        notes["worker_overhead_ms"] = f"median async worker CPU/step, {len(base)} runs"
        extra = [(cpu[id(r)] - step(r) - value) / _params_m(r) for r in fast
                 if id(r) in cpu and wire.parse(r["compression"]).gradient_top_k]  # fmt: skip
        if extra:
            value = max(0.0, statistics.median(extra))
            costs = dataclasses.replace(costs, compress_ms_per_mparam=round(value, 3))
            notes["compress_ms_per_mparam"] = f"median top-k extra, {len(extra)} runs"
    rows = []  # every ps task's CPU per update less the apply, against the
    for r in plain:  # tasks holding variables, their requests, and the MB
        if r.get("ps_cpu_ms_per_update") is not None:
            sizes = run_sizes(r)
            used = model.ps_share(sizes, r["num_ps"], partitioned=False)[1]
            k = 1 if r["kind"] == "async" else r["workers"]  # steps per update
            # The tensors' CPU is measured apart (ps_request_cost.py).
            tensors = k * model.ps_tensors(
                sizes, r["num_ps"], partitioned=False,
                packed_pushes=r["kind"] != "sync",  # sync pushes each variable
            )[1]  # fmt: skip
            variables = model.ps_variables(sizes, r["num_ps"], partitioned=False)[1]
            rows.append((used, k * used, k * 2 * sum(sizes) / 1e6, variables,
                         r["ps_cpu_ms_per_update"] - apply_ms(r)
                         - tensors * costs.ps_tensor_ms))  # fmt: skip
    table = np.array(rows, dtype=float).reshape(-1, 5)
    a, y = table[:, :4], table[:, 4]
    columns = (
        "ps_fixed_ms",
        "ps_request_ms",
        "ps_ms_per_mb",
        "ps_apply_ms_per_variable",
    )  # of `a`; fmt: skip
    free = [i for i, name in enumerate(columns) if name not in keep]

    def solvable(chosen):
        return len(rows) >= len(chosen) and (
            np.linalg.matrix_rank(a[:, chosen]) == len(chosen)
        )

    if free and not solvable(free) and 3 in free:
        # One model: its variables cost the same in every run.
        free.remove(3)
    if free and not solvable(free) and 1 in free:
        # Requests move with the bytes (one ps count): keep the request cost.
        free.remove(1)
    if free and solvable(free):
        values = [getattr(costs, name) for name in columns]
        kept = [i for i in range(len(columns)) if i not in free]
        rest = y - a[:, kept] @ np.array([values[i] for i in kept])
        fitted = dict.fromkeys(free, 0.0)
        while chosen := [i for i in free if i in fitted]:
            # Least squares with no cost below 0: a negative one is set to 0
            # and the others fitted again without it (clipping it after the
            # fit would leave the others fitted around the negative value).
            solution = np.linalg.lstsq(a[:, chosen], rest)[0]
            if (solution >= 0).all():
                fitted.update(zip(chosen, solution, strict=True))
                break
            del fitted[chosen[int(np.argmin(solution))]]
        for i in free:
            digits = 4 if columns[i] == "ps_ms_per_mb" else 3
            value = round(float(fitted.get(i, 0.0)), digits)
            costs = dataclasses.replace(costs, **{columns[i]: value})
            notes[columns[i]] = f"least squares, {len(rows)} runs" + (
                "" if i in fitted else " (would be < 0)"
            )
    # The share of the shared cores the tasks keep busy: from async runs on
    # unlimited links, the runs it bounds (no critical path of its own).
    if bound := [r for r in plain if r["kind"] == "async" and not r.get("mbit")]:
        grid = [round(0.3 + 0.01 * i, 2) for i in range(71)]  # 0.3 to 1
        value = _least_log_error("shared_core_use", grid, bound, cores, costs, batch)
        costs = dataclasses.replace(costs, shared_core_use=value)
        notes["shared_core_use"] = f"least squares of log updates/s, {len(bound)} runs"
    grid = [0.0] + [round(0.05 * 1.05**i, 3) for i in range(206)]  # to ~1 s
    for name, kind in (("sync_critical_path_ms", "sync"),
                       ("in_graph_chief_ms", "in-graph")):  # fmt: skip
        if chosen := [r for r in plain if r["kind"] == kind]:
            value = _least_log_error(name, grid, chosen, cores, costs, batch)
            costs = dataclasses.replace(costs, **{name: value})
            notes[name] = f"least squares of log updates/s, {len(chosen)} runs"
    return costs, notes


def fit_main(args) -> int:
    runs, cores = read_runs(args.fit, args.hidden, args.depth)
    cores = args.machine_cores or cores or os.cpu_count()
    if not runs:
        print(f"no async, sync or in-graph runs in {args.fit}", file=sys.stderr)
        return 1
    costs, notes = fit(runs, cores, args.batch, keep=args.keep)
    for field in dataclasses.fields(Costs):
        old, new = getattr(Costs(), field.name), getattr(costs, field.name)
        said = notes.get(field.name, "kept: these runs cannot tell it")
        print(f"{field.name:24s} {old:>12g} -> {new:<12g} {said}")

    def off(run, c):  # |error| of the predicted updates/s
        rate = predict(run, cores, c, args.batch).updates_per_s
        return abs(rate / run["updates_per_s"] - 1)

    for kind in KINDS:
        if chosen := [r for r in runs if r["kind"] == kind]:
            before = statistics.median(off(r, Costs()) for r in chosen)
            after = statistics.median(off(r, costs) for r in chosen)
            print(f"{kind}: {len(chosen)} runs, median |error| of updates/s "
                  f"{before:.0%} -> {after:.0%}")  # fmt: skip
    fields = ", ".join(f"{f.name}={getattr(costs, f.name)!r}"
                       for f in dataclasses.fields(Costs))  # fmt: skip
    print(f"\nCosts({fields})")
    return 0


def parse_args(argv=None):
    parser = harness.BenchmarkParser(__doc__.split("\n")[0], name="plan_check")
    parser.add_argument("--fit", nargs="+", metavar="RESULTS.json",
                        help="fit the constants to these runs instead of measuring")  # fmt: skip
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--workers", nargs="+", type=harness.positive,
                        default=[1, 2, 4, 8])  # fmt: skip
    parser.add_argument("--ps", nargs="+", type=harness.positive, default=[1, 2, 4])
    parser.add_argument("--mbit", nargs="+", type=harness.non_negative_float,
                        default=[0, 100, 10], help="link rates, Mbit/s; 0: unlimited")  # fmt: skip
    parser.add_argument("--compression", nargs="+", default=["none"],
                        help="as scaling.py's --compression (default none)")  # fmt: skip
    parser.add_rounds(1, "runs of each configuration, the grid backwards in odd "
                      "rounds; each is predicted against its median (default 1)")  # fmt: skip
    parser.add_argument("--steps", type=harness.positive, default=30)
    parser.add_argument("--epochs", type=harness.positive, default=2)
    parser.add_argument("--batch", type=harness.positive, default=128)
    parser.add_argument("--steps-per-execution", type=harness.positive, default=10)
    parser.add_argument("--hidden", type=harness.positive, default=512,
                        help="the MLP's hidden width (512); --fit: in the runs "
                        "whose file does not say")  # fmt: skip
    parser.add_argument("--depth", type=harness.positive, default=2,
                        help="the MLP's hidden layers (2); --fit: in the runs "
                        "whose file does not say")  # fmt: skip
    parser.add_argument("--keep", nargs="+", default=[],
                        choices=("ps_fixed_ms", "ps_request_ms", "ps_ms_per_mb",
                                 "ps_apply_ms_per_variable"),  # fmt: skip
                        help="--fit: ps costs to keep as they are (e.g. "
                        "ps_ms_per_mb, when every run moved the same bytes)")  # fmt: skip
    parser.add_argument("--machine-cores", type=harness.positive_float,
                        help="--fit: the cores the runs' tasks shared (default: "
                        "the JSON's cpu_count)")  # fmt: skip
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    return fit_main(args) if args.fit else measure(args)


if __name__ == "__main__":
    sys.exit(main())
