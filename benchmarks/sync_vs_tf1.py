"""SyncReplicaStrategy against TF1's SyncReplicasOptimizer: updates/s.

What it measures
----------------
Updates per second of synchronous training between worker processes, 1 ps
task and W workers on this machine's loopback, each run a fresh
``keras_psdist.cluster.launch(mode="between-graph")`` of
``benchmarks/_sync_vs_tf1_job.py``:

- ``tf1``: ``tf.compat.v1.train.SyncReplicasOptimizer`` (still in TF 2),
  graph mode, ``replica_device_setter``, ``MonitoredTrainingSession`` with
  the optimizer's hook, as TF's docs set it up;
- ``ours``: ``SyncReplicaStrategy()`` with Keras's ``model.fit``.

The same MLP (784-512-512-10), plain SGD, ``--batch`` examples per worker
and step, ``replicas_to_aggregate = W`` on both sides. The rate is the
chief's: (global step at its last step - at step ``--warmup``) / the time
between the two, so tracing and start-up are left out. The sides alternate
(tf1, ours, tf1, ours, ...) for ``--rounds`` rounds at each W, and the ratio
ours / tf1 is taken round by round; the table gives the median of each.

How to run
----------
From the repository root::

    python benchmarks/sync_vs_tf1.py              # W = 1, 2; ~6 min
    python benchmarks/sync_vs_tf1.py --workers 1,2,4 --rounds 5

It writes ``benchmarks/results/sync_vs_tf1.json``.

``--update-only`` measures instead the ps's update alone, in this process:
Keras's ``SGD.apply`` (a multiply and a subtract per variable) against the
sync service's ``keras_psdist.sync.plain_sgd.apply`` (TF1's one
``ResourceApplyGradientDescent`` per variable), each in a ``tf.function``,
alternating, for this benchmark's MLP and for 4 variables of 2048 x 2048::

    python benchmarks/sync_vs_tf1.py --update-only --json benchmarks/results/sync_update.json
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness
from harness import log

JOB = Path(__file__).resolve().parent / "_sync_vs_tf1_job.py"
SIDES = ("tf1", "ours")
PACKED = "ours_packed"  # ours with Keras's steps_per_execution
RUN_TIMEOUT_S = 600


def rate(steps: list, warmup: int) -> dict:
    """Updates/s, and CPU ms per update of the chief and of the ps task,
    from the chief's `(time, global step, its CPU s, the ps's CPU s)` at
    each step end, between step `warmup` and the last."""
    start = next(i for i, entry in enumerate(steps) if entry[1] >= warmup)
    (t0, s0, c0, p0), (t1, s1, c1, p1) = steps[start], steps[-1]
    updates = s1 - s0
    return {
        "rate": updates / (t1 - t0),
        "chief_cpu_ms": (c1 - c0) / updates * 1e3,
        "ps_cpu_ms": None if p0 is None or p1 is None else (p1 - p0) / updates * 1e3,
    }


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _ms(value) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def sides(args) -> tuple[str, ...]:
    """The sides measured: TF1, ours as the other benchmarks run Keras (one
    step per call), and with ``--steps-per-execution N`` > 1 ours again with
    Keras's ``steps_per_execution=N``."""
    return SIDES + ((PACKED,) if args.steps_per_execution > 1 else ())


def run_one(work: Path, side: str, workers: int, args) -> dict:
    from keras_psdist.cluster.launcher import run

    out_dir, log_path = harness.run_dir(work, f"{side}_w{workers}_")
    server_command = run.SERVER_COMMAND
    if side == "tf1":
        run.SERVER_COMMAND = (sys.executable, str(JOB), "--serve-ps")
    try:
        code = _launch(out_dir, log_path, side, workers, args)
    finally:
        run.SERVER_COMMAND = server_command
    [report] = harness.read_reports(out_dir, 1, log_path, code, "chief.json")
    return rate(report["steps"], args.warmup)


def _launch(out_dir, log_path, side, workers, args) -> int:
    return harness.launch_logged(
        [
            sys.executable,
            str(JOB),
            "--side",
            "ours" if side == PACKED else side,
            "--steps-per-execution",
            str(args.steps_per_execution if side == PACKED else 1),
            "--out-dir",
            str(out_dir),
            "--steps",
            str(args.steps),
            "--batch",
            str(args.batch),
        ],
        log_path,
        num_ps=1,
        num_workers=workers,
        mode="between-graph",
        timeout_s=RUN_TIMEOUT_S,
    )


UPDATE_MODELS = {
    "MLP 784-512-512-10 (0.67M)": [
        (784, 512),
        (512,),
        (512, 512),
        (512,),
        (512, 10),
        (10,),
    ],
    "4 x 2048x2048 (16.8M)": [(2048, 2048)] * 4,
}


def _update_call(side, optimizer, grads, variables):
    """A traced update of `side` ("keras" or "fused")."""
    import tensorflow as tf

    from keras_psdist.sync import plain_sgd

    if side == "keras":
        return tf.function(lambda: optimizer.apply(grads, variables))
    return tf.function(lambda: plain_sgd.apply(optimizer, grads, variables))


def update_costs(args) -> int:
    """ms per update of Keras's SGD and of the fused kernel, alternating."""
    harness.prepare_tensorflow()
    import keras
    import numpy as np
    import tensorflow as tf

    rows = []
    for model, shapes in UPDATE_MODELS.items():
        rng = np.random.default_rng(0)
        initial = [rng.normal(size=s).astype(np.float32) for s in shapes]
        grads = [tf.constant(rng.normal(size=s).astype(np.float32)) for s in shapes]
        calls = {}
        for side in ("keras", "fused"):
            variables = [keras.Variable(v) for v in initial]
            optimizer = keras.optimizers.SGD(0.01)
            optimizer.build(variables)
            calls[side] = _update_call(side, optimizer, grads, variables)
            calls[side]()  # traced
        n = max(20, int(2e8 / sum(int(np.prod(s)) for s in shapes)))
        times = {"keras": [], "fused": []}
        for _ in range(args.rounds * 2):
            for side, call in calls.items():
                start = time.perf_counter()
                for _ in range(n):
                    call()
                times[side].append((time.perf_counter() - start) / n * 1e3)
        keras_ms, fused_ms = (statistics.median(times[s]) for s in ("keras", "fused"))
        log(f"{model}: keras {keras_ms:.3f} ms, fused {fused_ms:.3f} ms")
        rows.append(
            {
                "variables": model,
                "Keras SGD ms": f"{keras_ms:.3f}",
                "fused ms": f"{fused_ms:.3f}",
                "fused / Keras": f"{fused_ms / keras_ms:.2f}",
            }
        )
    print(harness.markdown_table(rows, list(rows[0])))
    harness.write_results(args.json, {"args": vars(args) | {"json": None}})
    return 0


def main(argv=None) -> int:
    parser = harness.BenchmarkParser(__doc__.split("\n")[0], name="sync_vs_tf1")
    parser.add_argument("--workers", type=harness.int_list, default=[1, 2])
    parser.add_argument("--rounds", type=harness.positive, default=3)
    parser.add_argument("--steps", type=harness.positive, default=200)
    parser.add_argument("--warmup", type=harness.positive, default=30)
    parser.add_argument("--batch", type=harness.positive, default=128)
    parser.add_argument(
        "--steps-per-execution",
        type=harness.positive,
        default=1,
        help="N > 1 adds a third side: ours compiled with steps_per_execution=N",
    )
    parser.add_argument(
        "--update-only",
        action="store_true",
        help="time the ps's SGD update alone (Keras's against the fused kernel)",
    )
    args = parser.parse_args(argv)
    if args.update_only:
        return update_costs(args)
    runs = []
    with tempfile.TemporaryDirectory() as work:
        for workers in args.workers:
            for round_ in range(args.rounds):
                pair = {}
                for side in sides(args):
                    pair[side] = run_one(Path(work), side, workers, args)
                    log(
                        f"W={workers} round {round_}: {side} "
                        f"{pair[side]['rate']:.1f} updates/s, ps CPU "
                        f"{_ms(pair[side]['ps_cpu_ms'])} ms/update"
                    )
                runs.append(
                    {
                        "workers": workers,
                        **{side: pair[side]["rate"] for side in pair},
                        "cpu_ms": {
                            side: {k: v for k, v in pair[side].items() if k != "rate"}
                            for side in pair
                        },
                        "ratio": pair["ours"]["rate"] / pair["tf1"]["rate"],
                        **(
                            {"ratio_packed": pair[PACKED]["rate"] / pair["tf1"]["rate"]}
                            if PACKED in pair
                            else {}
                        ),
                    }
                )
    rows = []
    for workers in args.workers:
        mine = [r for r in runs if r["workers"] == workers]
        rows.append(
            {
                "W": workers,
                "TF1 updates/s": f"{statistics.median(r['tf1'] for r in mine):.1f}",
                "ours updates/s": f"{statistics.median(r['ours'] for r in mine):.1f}",
                "ours / TF1": f"{statistics.median(r['ratio'] for r in mine):.2f}",
                **(
                    {
                        f"ours, steps_per_execution={args.steps_per_execution}, "
                        "updates/s": f"{statistics.median(r[PACKED] for r in mine):.1f}",
                        "its / TF1": (
                            f"{statistics.median(r['ratio_packed'] for r in mine):.2f}"
                        ),
                    }
                    if args.steps_per_execution > 1
                    else {}
                ),
                **{
                    f"{name} CPU ms/update, {label}": _ms(
                        _median(r["cpu_ms"][side][key] for r in mine)
                    )
                    for name, key in (("ps", "ps_cpu_ms"), ("chief", "chief_cpu_ms"))
                    for side, label in (("tf1", "TF1"), ("ours", "ours"))
                },
            }
        )
    print(harness.markdown_table(rows, list(rows[0])))
    harness.write_results(
        args.json, {"runs": runs, "args": vars(args) | {"json": None}}
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
