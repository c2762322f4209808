"""PSStrategy's steady step against one device, with one thing changed at a
time, each case in a fresh process of its own (``strategies.py
--ablations``).

The model and data are `strategies.py`'s (MLP 64->512->512->2, Adam, global
batch 256, 4 logical CPU replicas, tf.data autotuning off). In each case's
process the single device and PSStrategy are timed interleaved, `--fits`
fits of `--steps` steps each; the table gives the median PS / 1 device.

Cases:

* ``static``: global batches of a size known when tracing (`drop_remainder`);
* ``dynamic``: of unknown size: the step carries the stand-ins for replicas
  left without data (`keras_psdist/distribute/replica_batches.py`);
* ``mirrored_built``: as ``static``, with a `MirroredStrategy` made in the
  process and a model built under it;
* ``mirrored_fit``: as ``static``, after that model ran `fit` (20 steps);
* ``mirrored_fit_released``: as ``mirrored_fit``, then that model and its
  strategy deleted and collected before the timing;
* ``static_threads``, ``mirrored_fit_threads``: as ``static`` and
  ``mirrored_fit``, with TensorFlow's inter-op thread pool 4x its default
  size (whether what `fit` leaves behind holds threads of that pool);
* ``mirrored_fit_one_device_reduce``: as ``mirrored_fit``, the
  `MirroredStrategy` made with `cross_device_ops=ReductionToOneDevice()`
  instead of its default on CPUs (`CollectiveAllReduce`);
* ``collective_reduce``: as ``static``, after a `MirroredStrategy` (its
  default `CollectiveAllReduce`) only summed one value over its replicas:
  no model, no `fit`.

Each case also records the process's native threads before timing, by
name (TensorFlow names its pools: `collective_ops`, `tf_Compute`, ...).
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import time

from .progress import log
from .results import write_results
from .tables import Column, text_table

CASES = (
    "static",
    "dynamic",
    "mirrored_built",
    "mirrored_fit",
    "mirrored_fit_released",
    "static_threads",
    "mirrored_fit_threads",
    "mirrored_fit_one_device_reduce",
    "collective_reduce",
)


def thread_names() -> dict[str, int]:
    """This process's native threads, counted by name."""
    names: dict[str, int] = {}
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/comm") as f:
            name = f.read().strip()
        names[name] = names.get(name, 0) + 1
    return dict(sorted(names.items()))


def child(case: str, fits: int, steps: int) -> dict:
    """Runs one case in this process; returns the per-fit ms/step."""
    import tensorflow as tf

    from . import mlp

    if case.endswith("_threads"):
        default = os.cpu_count() or 2
        tf.config.threading.set_inter_op_parallelism_threads(4 * default)

    from keras_psdist.devices import split_host_cpu

    split_host_cpu(4)
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    x, y = mlp.make_arrays(mlp.NUM_SAMPLES, 0)
    dataset = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .repeat()
        .batch(256, drop_remainder=case != "dynamic")
    )
    options = tf.data.Options()
    options.autotune.enabled = False
    dataset = dataset.with_options(options)
    if case == "collective_reduce":
        collective = tf.distribute.MirroredStrategy(devices)
        collective.reduce(
            tf.distribute.ReduceOp.SUM,
            collective.run(lambda: tf.constant(1.0)),
            axis=None,
        )
    if case.startswith("mirrored"):
        if case == "mirrored_fit_one_device_reduce":
            mirrored_strategy = tf.distribute.MirroredStrategy(
                devices, cross_device_ops=tf.distribute.ReductionToOneDevice()
            )
        else:
            mirrored_strategy = mlp.make_strategy("mirrored", devices)
        mirrored = mlp.build_model(mirrored_strategy, seed=0)
        if case != "mirrored_built":
            mirrored.fit(dataset, epochs=1, steps_per_epoch=20, verbose=0)
        if case == "mirrored_fit_released":
            strategy = mirrored.distribute_strategy
            del mirrored, strategy, mirrored_strategy
            gc.collect()
    models = {
        name: mlp.build_model(mlp.make_strategy(name, devices), seed=0)
        for name in ("default", "ps")
    }
    for model in models.values():
        model.fit(dataset, epochs=1, steps_per_epoch=20, verbose=0)
    times = {name: [] for name in models}
    times["native_threads"] = len(os.listdir("/proc/self/task"))
    times["thread_names"] = thread_names()
    for i in range(fits):
        order = list(models) if i % 2 else list(models)[::-1]
        for name in order:
            start = time.perf_counter()
            models[name].fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)
            times[name].append(1e3 * (time.perf_counter() - start) / steps)
    return times


def run(args, script: str) -> int:
    """Runs `args.ablations` (cases), `args.repeats` processes each, as
    children `script --ablation-child CASE`; prints the table and writes
    `args.json`."""
    results = {case: [] for case in args.ablations}
    for repeat in range(args.repeats):
        for case in args.ablations:
            log(f"run {repeat + 1}/{args.repeats}: {case}")
            command = [sys.executable, script, "--ablation-child", case,
                       "--fits", str(args.fits), "--steps", str(args.steps)]  # fmt: skip
            out = subprocess.run(
                command, capture_output=True, text=True, check=True, timeout=1200
            ).stdout.strip().splitlines()[-1]  # fmt: skip
            times = json.loads(out)
            ratio = statistics.median(times["ps"]) / statistics.median(times["default"])
            threads = times.pop("native_threads")
            names = times.pop("thread_names")
            results[case].append(
                {
                    "times_ms": times,
                    "ps_over_default": ratio,
                    "native_threads": threads,
                    "thread_names": names,
                }
            )
    rows = [
        [
            case,
            ", ".join(f"{r['ps_over_default']:.2f}x" for r in results[case]),
            ", ".join(str(r["native_threads"]) for r in results[case]),
        ]
        for case in args.ablations
    ]
    columns = [
        Column("case", 30, "<"),
        Column("PS / 1 device (median), per run", 34, "<"),
        Column("threads", 12, "<"),
    ]
    print("\n".join(text_table(columns, rows)))
    settings = {k: v for k, v in vars(args).items() if k in
                ("ablations", "repeats", "fits", "steps", "json")}  # fmt: skip
    out = write_results(args.json, {"settings": settings, "results": results})
    print(f"wrote {out}")
    return 0


def run_child(case: str, fits: int, steps: int) -> int:
    """The child's side: times `case` and prints its JSON line."""
    print(json.dumps(child(case, fits, steps)))
    return 0
