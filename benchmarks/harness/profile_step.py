"""Where the steady `fit` step's time goes (`strategies.py --profile`): a
TensorFlow profiler trace of the single device and of PSStrategy, op times
summed by kind.

The model, data and replicas are `strategies.py`'s (MLP 64->512->512->2,
Adam, global batch 256, 4 logical CPU replicas). Each strategy is warmed up,
then `fit` runs `--steps` steps under `tf.profiler.experimental.start`; the
trace's XPlane gives every op's time, summed over the threads that ran it,
per step. Summed kernel time is not wall time: ops of several replicas run
at once on the same cores, and each one's time then includes its waits for
a core. Read the kinds side by side, as where the extra work is.

`--dynamic-batch` batches without `drop_remainder` (a global batch size not
known when tracing: the step then carries the stand-in machinery for empty
replicas); `--autotune` keeps tf.data's autotuning on.
"""

from __future__ import annotations

import collections
import glob
import tempfile
import time

import tensorflow as tf

from keras_psdist.devices import split_host_cpu

from . import mlp
from .results import write_results
from .tables import Column, text_table

KINDS = {
    "forward/backward kernels": (
        "MatMul",
        "BiasAddGrad",
        "ReluGrad",
        "Relu",
        "BiasAdd",
        "SparseSoftmaxCrossEntropyWithLogits",
    ),
    "transfers between devices": ("_Send", "_Recv", "_HostSend", "_HostRecv"),
    "gradient sum": ("AddN",),
    "optimizer update and other elementwise": (
        "Sqrt",
        "RealDiv",
        "Pow",
        "AssignSubVariableOp",
        "AssignAddVariableOp",
        "Square",
        "Sub",
        "Mul",
        "AddV2",
        "Maximum",
        "Minimum",
        "Cast",
    ),
    "variable reads and writes": ("ReadVariableOp", "AssignVariableOp"),
    "batch cut, shapes, control flow": (
        "StridedSlice",
        "Slice",
        "Shape",
        "Pack",
        "ConcatV2",
        "FloorDiv",
        "FloorMod",
        "Less",
        "Greater",
        "Equal",
        "Switch",
        "Merge",
        "Identity",
        "SelectV2",
        "Any",
        "All",
    ),
    "input pipeline": (
        "Iterator",
        "BatchV2",
        "ForeverRepeat",
        "TensorSlice",
        "Prefetch",
        "Optional",
        "Options",
    ),
}
# Trace events that are not ops (executor and function frames).
NOT_OPS = {"Process", "Run", "Start", "Done", "DoCompute", "Root"}


def kind_of(op: str) -> str:
    for kind, markers in KINDS.items():
        if any(m in op for m in markers):
            return kind
    return "other"


def op_times(logdir: str, steps: int) -> collections.Counter:
    """ms per step of each op type in the trace under `logdir`."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    (path,) = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    times = collections.Counter()
    for plane in space.planes:
        names = plane.event_metadata
        for line in plane.lines:
            for event in line.events:
                name = names[event.metadata_id].name
                if ":" not in name or name.startswith("$"):
                    continue
                op = name.split(":")[-1].strip()
                if op in NOT_OPS or op.startswith("__inference"):
                    continue
                times[op] += event.duration_ps / 1e9 / steps
    return times


def profile(
    name: str, devices, dataset, steps: int
) -> tuple[float, collections.Counter]:
    model = mlp.build_model(mlp.make_strategy(name, devices), seed=0)
    model.fit(dataset, epochs=1, steps_per_epoch=20, verbose=0)
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        start = time.perf_counter()
        model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)
        wall_ms = 1e3 * (time.perf_counter() - start) / steps
        tf.profiler.experimental.stop()
        return wall_ms, op_times(logdir, steps)


def run(args) -> int:
    """Profiles the default strategy and PSStrategy on `args.replicas`
    logical CPUs, `args.steps` steps at a global batch of `args.batch`;
    prints ms per step by kind and writes `args.json`."""
    split_host_cpu(args.replicas)
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    dataset = mlp.make_dataset(
        args.batch,
        0,
        autotune=args.autotune,
        drop_remainder=not args.dynamic_batch,
        prefetch=False,
    )
    results = {}
    for name in ("default", "ps"):
        wall_ms, times = profile(name, devices, dataset, args.steps)
        kinds = collections.Counter()
        for op, ms in times.items():
            kinds[kind_of(op)] += ms
        results[name] = {"wall_ms": wall_ms, "kinds": dict(kinds), "ops": dict(times)}
    rows = [
        [
            kind,
            f"{results['default']['kinds'].get(kind, 0.0):.2f}",
            f"{results['ps']['kinds'].get(kind, 0.0):.2f}",
        ]
        for kind in [*KINDS, "other"]
    ]
    rows.append(
        [
            "wall time per step (profiled)",
            f"{results['default']['wall_ms']:.2f}",
            f"{results['ps']['wall_ms']:.2f}",
        ]
    )
    columns = [Column("ms per step", 40, "<"), Column("1 device", 9), Column("PS", 9)]
    print("\n".join(text_table(columns, rows)))
    out = write_results(args.json, {"settings": vars(args), "results": results})
    print(f"wrote {out}")
    return 0
