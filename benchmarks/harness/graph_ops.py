"""Op counts of the `model.fit` train step under each strategy
(``strategies.py --ops``).

It explains step-time differences by what each strategy makes TensorFlow
run. For every strategy it builds and warms up `strategies.py`'s model
(same data, devices and strategies), then reports

* the traced graph of Keras' train function (`multi_step_on_iterator`, a
  `tf.function`): its own nodes and the nodes of the functions it calls
  (the per-step `one_step_on_data` with the strategy's replica code inlined);
* the graph TensorFlow actually executes for one step, from the eager run
  metadata (`context.enable_run_metadata()`): node count after Grappler, the
  per-device partitions and the `_Send` / `_Recv` pairs that move tensors
  between (logical) devices;
* how many other functions one `fit` call runs eagerly (iterator setup etc.);
* the op types whose counts differ most between strategies.

Nothing is timed here.
"""

from __future__ import annotations

import collections

from keras_psdist._tf import context
from keras_psdist.devices import split_host_cpu

from . import mlp
from .progress import log
from .results import write_results
from .tables import Column, format_row, text_table


def _train_tf_function(model):
    """The `tf.function` behind Keras 3's `model.train_function` closure."""
    for cell in model.train_function.__closure__ or ():
        value = cell.cell_contents
        if hasattr(value, "experimental_get_tracing_count"):
            return value
    raise RuntimeError("could not find the tf.function in model.train_function")


def _short_device(name: str) -> str:
    return name.rsplit("/device:", 1)[-1] if name else "?"


def analyze(name: str, devices: list[str], dataset, args) -> dict:
    strategy = mlp.make_strategy(name, devices)
    model = mlp.build_model(strategy, args.seed, jit_compile=name.endswith("_xla"))
    model.fit(dataset, epochs=1, steps_per_epoch=2, verbose=0, shuffle=False)

    fn = _train_tf_function(model)
    concrete = fn._list_all_concrete_functions()  # traced once by the warm-up
    graph_def = concrete[0].graph.as_graph_def()
    traced_ops = collections.Counter(n.op for n in graph_def.node)
    for f in graph_def.library.function:
        traced_ops.update(n.op for n in f.node_def)
    traced = {
        "tracing_count": fn.experimental_get_tracing_count(),
        "top_level_nodes": len(graph_def.node),
        "library_functions": len(graph_def.library.function),
        "library_nodes": sum(len(f.node_def) for f in graph_def.library.function),
        "op_types": dict(traced_ops),
    }

    context.enable_run_metadata()
    try:
        model.fit(dataset, epochs=1, steps_per_epoch=1, verbose=0, shuffle=False)
        metadata = context.context().export_run_metadata()
    finally:
        context.disable_run_metadata()
    graphs = list(metadata.function_graphs)
    executed = None
    if graphs:
        # The train step is by far the largest function one fit step runs.
        step = max(graphs, key=lambda g: len(g.post_optimization_graph.node))
        ops = collections.Counter(n.op for p in step.partition_graphs for n in p.node)
        partitions = {}
        for p in step.partition_graphs:
            dev = next((n.device for n in p.node if n.device), "")
            partitions[_short_device(dev)] = len(p.node)
        executed = {
            "pre_optimization_nodes": len(step.pre_optimization_graph.node),
            "post_optimization_nodes": len(step.post_optimization_graph.node),
            "partition_nodes": dict(sorted(partitions.items())),
            "send": ops["_Send"],
            "recv": ops["_Recv"],
            "op_types": dict(ops),
            "other_functions_per_fit": len(graphs) - 1,
        }
    return {
        "replicas": strategy.num_replicas_in_sync,
        "traced": traced,
        "executed": executed,
    }


def format_report(results: dict) -> str:
    columns = [
        Column("strategy", 24, "<"),
        Column("traced (top+lib)", 16),
        Column("executed", 9),
        Column("_Send/_Recv", 11),
        Column("fns/fit", 7),
        Column(" nodes per device partition", 0, "<"),
    ]
    rows = []
    for name, r in results.items():
        label = mlp.LABELS[name]
        if "error" in r:
            rows.append(f"{format_row(columns, [label])} failed: {r['error']}")
            continue
        t, e = r["traced"], r["executed"]
        traced = f"{t['top_level_nodes']}+{t['library_nodes']}"
        if e is None:  # a single-device function exports no run metadata
            rows.append(format_row(columns, [label, traced, "n/a", "n/a", "n/a"]))
            continue
        parts = " ".join(f"{d}:{n}" for d, n in e["partition_nodes"].items())
        send_recv = f"{e['send']:>5}/{e['recv']:<5}"
        rows.append(
            [
                label,
                traced,
                e["post_optimization_nodes"],
                send_recv,
                e["other_functions_per_fit"],
                f" {parts}",
            ]
        )
    lines = text_table(columns, rows)
    lines += [
        "",
        "traced   = nodes of Keras' train tf.function + of the functions it calls",
        "executed = nodes of the executed step graph after Grappler (all partitions)",
        "fns/fit  = other functions one fit() call of 1 step runs (iterator setup...)",
    ]

    # Op types whose executed counts differ most between strategies.
    # (A single-device step, the default strategy's, exports no run metadata.)
    source = {
        n: r["executed"]["op_types"]
        for n, r in results.items()
        if "error" not in r and r["executed"] is not None
    }
    if len(source) > 1:
        names = list(source)
        all_ops = set().union(*source.values())
        spread = {
            op: max(source[n].get(op, 0) for n in names)
            - min(source[n].get(op, 0) for n in names)
            for op in all_ops
        }
        top = sorted((op for op in all_ops if spread[op]), key=lambda o: -spread[o])
        top = top[:20]
        lines += ["", "op types with the largest count differences (executed graph):"]
        columns = [Column("op", 36, "<"), *(Column(n[:15], 16) for n in names)]
        rows = [[op, *(source[n].get(op, 0) for n in names)] for op in top]
        lines += text_table(columns, rows, sep="", rule=False)
    return "\n".join(lines)


def run(args) -> int:
    """Analyzes `args.strategies` on `args.replicas` logical CPUs at a
    global batch of `args.batch`; prints the report and writes `args.json`."""
    devices = split_host_cpu(args.replicas)
    dataset = mlp.make_dataset(args.batch, args.seed)
    results = {}
    for name in args.strategies:
        log(f"analyzing {mlp.LABELS[name]} ...")
        try:
            results[name] = analyze(name, devices, dataset, args)
        except Exception as e:  # noqa: BLE001 - report and go on
            results[name] = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
    print(
        f"train-step graph size: MLP {mlp.INPUT_DIM}-{mlp.HIDDEN}-{mlp.HIDDEN}-"
        f"{mlp.NUM_CLASSES}, adam, batch {args.batch}, "
        f"{args.replicas} logical CPU devices"
    )
    print(format_report(results))
    write_results(args.json, {"environment": {}, "results": results})
    print(f"wrote {args.json}")
    return 0
