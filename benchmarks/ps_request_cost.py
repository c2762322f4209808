"""What a ps task's CPU pays for: each tensor a step moves, or each step.

Issue 54 §3 asks for a ps CPU per update at most half of tf_keras's. The
costs table (docs/benchmarks.md, "What an update costs") found the ps's CPU
does not shrink with the bytes. This study asks what it does follow, with
TensorFlow alone (no keras_psdist in the step), on one ps task and one
worker on loopback:

* ``separate``: each step reads every variable from the ps to the worker and
  pushes one tensor per variable back, applied on the ps (``assign_sub``):
  2V tensors cross per step, as a between-graph step moves them today;
* ``packed``: the ps concatenates the variables and sends one tensor; the
  worker sends one tensor back, split on the ps: 2 tensors per step, the
  same bytes.

Both at V variables of the same total size (the scaling MLP's 296,962
float32 parameters, 1.19 MB), with K steps per call (``tf.range`` loop in
one ``tf.function``, as Keras's ``steps_per_execution``). The ps task's CPU
comes from ``/proc/<pid>/stat``; rounds alternate the layouts.

    python benchmarks/ps_request_cost.py                       # ~3 min
    python benchmarks/ps_request_cost.py --vars 6 24 96 --steps-per-call 1 10 --rounds 3

If the CPU is per tensor, packing cuts it by about (2V - 2) tensors' worth;
if per step (one remote function's run, the loop's control), not at all.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402

PARAMETERS = 296_962  # benchmarks/scaling.py's MLP
PS = "/job:ps/replica:0/task:0/device:CPU:0"
WORKER = "/job:worker/replica:0/task:0/device:CPU:0"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(cluster: dict) -> None:
    import tensorflow as tf

    spec = tf.train.ClusterSpec(cluster)
    tf.distribute.Server(spec, job_name="ps", task_index=0, protocol="grpc").join()


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _steps(tf, num_vars: int, per_call: int):
    """`{layout: tf.function}` running `per_call` steps over `num_vars`
    variables on the ps that hold `PARAMETERS` values in all."""
    sizes = [PARAMETERS // num_vars] * num_vars
    sizes[-1] += PARAMETERS - sum(sizes)
    with tf.device(PS):
        variables = [tf.Variable(tf.ones([n])) for n in sizes]

    def separate():
        with tf.device(WORKER):
            grads = [v.read_value() * 1.0001 for v in variables]
        for v, g in zip(variables, grads, strict=True):  # each push lands on v's device
            v.assign_sub(g * 1e-9)

    def packed():
        with tf.device(PS):
            flat = tf.concat([v.read_value() for v in variables], 0)
        with tf.device(WORKER):
            grad = flat * 1.0001
        with tf.device(PS):
            for v, g in zip(variables, tf.split(grad, sizes), strict=True):
                v.assign_sub(g * 1e-9)

    def looped(step):
        @tf.function
        def run():
            for _ in tf.range(per_call):
                step()

        return run

    return {"separate": looped(separate), "packed": looped(packed)}


def main() -> int:
    parser = harness.BenchmarkParser(__doc__.split("\n\n")[0], name="ps_request_cost")
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("--cluster", help=argparse.SUPPRESS)
    parser.add_argument(
        "--vars", type=harness.positive, nargs="+", default=[1, 6, 24, 96]
    )
    parser.add_argument(
        "--steps-per-call", type=harness.positive, nargs="+", default=[1, 10]
    )
    parser.add_argument(
        "--steps", type=harness.positive, default=300, help="timed steps per run"
    )
    parser.add_argument("--rounds", type=harness.positive, default=3)
    args = parser.parse_args()
    if args.role == "ps":
        _serve(json.loads(args.cluster))
        return 0

    harness.prepare_tensorflow()
    cluster = {
        "ps": [f"127.0.0.1:{_free_port()}"],
        "worker": [f"127.0.0.1:{_free_port()}"],
    }
    ps = subprocess.Popen(
        [sys.executable, __file__, "--role", "ps", "--cluster", json.dumps(cluster)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        import tensorflow as tf

        tf.config.experimental_connect_to_cluster(
            tf.train.ClusterSpec(cluster), job_name="worker", task_index=0
        )
        rows, raw = [], {}
        for num_vars in args.vars:
            for per_call in args.steps_per_call:
                steps = _steps(tf, num_vars, per_call)
                calls = max(1, args.steps // per_call)

                def run_one(
                    layout, _round, steps=steps, calls=calls, per_call=per_call
                ):
                    for _ in range(max(2, 20 // per_call)):  # trace and warm up
                        steps[layout]()
                    cpu, wall = _cpu_seconds(ps.pid), time.perf_counter()
                    for _ in range(calls):
                        steps[layout]()
                    n = calls * per_call
                    return {"ps_cpu_ms": (_cpu_seconds(ps.pid) - cpu) / n * 1e3,
                            "wall_ms": (time.perf_counter() - wall) / n * 1e3}  # fmt: skip

                rounds = harness.interleaved_rounds(
                    ["separate", "packed"], run_one, args.rounds
                )
                cpu = {k: [s["ps_cpu_ms"] for s in rounds.samples(k)] for k in steps}
                wall = {k: [s["wall_ms"] for s in rounds.samples(k)] for k in steps}
                ratio = harness.median_or_none(harness.paired_ratios(
                    dict(enumerate(cpu["packed"])), dict(enumerate(cpu["separate"]))
                ))  # fmt: skip
                med = {k: harness.median_or_none(v) for k, v in cpu.items()}
                rows.append([
                    num_vars, per_call, 2 * num_vars, f"{med['separate']:.2f}",
                    f"{med['packed']:.2f}", f"{ratio:.2f}x",
                    f"{harness.median_or_none(wall['separate']):.2f}",
                    f"{harness.median_or_none(wall['packed']):.2f}",
                ])  # fmt: skip
                raw[f"{num_vars}x{per_call}"] = {"ps_cpu_ms": cpu, "wall_ms": wall}
                harness.log(f"vars {num_vars}, {per_call} steps/call: {rows[-1]}")
        columns = ["variables", "steps per call", "tensors per step (separate)",
                   "ps CPU ms/step, separate", "packed", "packed / separate",
                   "worker wall ms/step, separate", "packed"]  # fmt: skip
        print(harness.markdown_table(rows, columns))
        out = harness.write_results(args.json, {"parameters": PARAMETERS, "runs": raw,
                                                "settings": vars(args)})  # fmt: skip
        print(f"wrote {out}")
    finally:
        ps.kill()
        ps.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
