"""The cost model's constants, and the measurements each one came from.

`benchmarks/plan_check.py --fit RESULTS.json...` fits them again from
`benchmarks/scaling.py` runs and prints a `Costs(...)` to paste here.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Costs:
    """Calibrated costs of one step, update and transfer (all in ms).

    The defaults come from the committed results of this repository's
    benchmarks, refitted on 2026-12-07 (`FIT` below) from four runs of
    `benchmarks/scaling.py` that record each host's CPU per update: two
    models (the 6-variable MLP and a 48-variable one), async, sync, in-graph
    and tf_keras at W = 1, 2, 4, with Keras's step loop without its branch
    (`integration/step_loop.py`) and before it:

        python benchmarks/scaling.py --only workers --workers 1 2 4 \
            --kinds async sync in-graph tf_keras --steps 60 --epochs 2 \
            --rounds 2 --json benchmarks/results/scaling_step_loop.json
        # the same with --depth 23 --hidden 128: scaling_step_loop_deep.json
        # (scaling_ps_threads.json, scaling_ps_threads_deep.json: the same
        # models before the step loop, without sync)
        python benchmarks/plan_check.py --keep ps_ms_per_mb --fit \
            benchmarks/results/scaling_step_loop.json \
            benchmarks/results/scaling_step_loop_deep.json \
            benchmarks/results/scaling_ps_threads.json \
            benchmarks/results/scaling_ps_threads_deep.json

    In sample, the median error of updates/s is 11 % (27 async runs), 9 %
    (12 sync) and 9 % (27 in-graph). All were measured on one 2-core
    machine (AMD EPYC, TF 2.21, Keras 3.15) whose tasks shared its cores.
    The MLP of `benchmarks/scaling.py` is 64-512-512-2 (296,962 parameters,
    1.19 MB, Adam); its `--depth 23 --hidden 128` model has 48 variables
    and 0.36M parameters. That of `benchmarks/sync_vs_tf1.py` is
    784-512-512-10 (669,706 parameters, 2.68 MB, plain SGD).

    Attributes:
        flops_per_core_ms: FLOPs one core computes per ms, for `step_ms`'s
            estimate `6 * params * batch / flops_per_core_ms`. 5.369e7: the
            mean over FIT's four files of the model's own step (one device,
            one process, batch 128, the whole Keras step on every thread;
            4.4 to 7.4 CPU ms, the noisiest input). The kernels alone
            (`benchmarks/results/profile_step.json`) give 1.076e8.
        worker_overhead_ms: A worker's CPU per step beyond its forward and
            backward pass (Keras's and TensorFlow's per-step work, the gRPC
            calls, reading and sending the bytes). 1.294: FIT's median async
            worker CPU per step (read from the worker hosts' processes) less
            the model's own step.
        rtt_ms: Network round trips per worker step. 0.2: assumed (a few
            round trips inside a data centre); nothing here measures it
            apart.
        ps_fixed_ms: A ps task's CPU per update that grows neither with
            the bytes, the variables nor the worker steps. 0.244: FIT's
            least squares (no constant below 0) over 66 runs' ps CPU per
            update, read from the ps host's processes, less the optimizer's
            update (`ps_apply_ms_per_mparam`) and the tensors
            (`ps_tensor_ms`).
        ps_request_ms: A ps task's CPU per worker step it serves (the
            step's calls, not its tensors nor its bytes). 1.553: the same
            least squares.
        ps_tensor_ms: A ps task's CPU per tensor a worker step moves to or
            from it (one read per variable it holds, one gradient pushed
            back), on the paths that do not pack them. 0.0625: TensorFlow
            alone, one ps and one worker on loopback, 10 steps per call, 2
            to 192 tensors of the same 1.19 MB in all: (14.60 - 2.73 ms) /
            190 more tensors (`python benchmarks/ps_request_cost.py --rounds
            3`, `benchmarks/results/ps_request_cost.json`).
        ps_ms_per_mb: A ps task's CPU per MB it serves or receives. 0.2081:
            kept from the runs that moved different bytes with the same
            calls (`python benchmarks/scaling.py --only workers --workers 1
            2 4 --workers-compression fp16@bfloat16 --steps 60 --epochs 2
            --rounds 2`, `benchmarks/results/scaling_costs.json`: 16-bit
            reads and gradients halve the bytes and barely move the ps's
            CPU, 6.08 and 6.88 ms per update at W = 1, 5.48 and 4.79 at W =
            4). FIT's runs move bytes in step with calls and cannot split
            the two: fitted free, this constant takes the calls' cost
            (2.03 ms per MB, 0 per call).
        ps_apply_ms_per_mparam: CPU per million parameters of the
            optimizer's update on the ps (Adam). 3.27: the PS column's
            "optimizer update and other elementwise", 0.97 ms per step for
            the scaling MLP's 0.297M (`benchmarks/results/profile_step.json`).
            Plain SGD is about 0.65 (`benchmarks/results/sync_update.json`:
            0.434 ms for 0.67M, fused).
        ps_apply_ms_per_variable: A ps task's CPU per variable it holds per
            update (the optimizer's ops for that variable, its slots and the
            step counter, each a kernel launch and an executor node).
            0.033: FIT's least squares, which only a second model with 8
            times the variables can tell from the per-update costs.
        sync_critical_path_ms: What a sync update waits for beyond the
            workers' step and the ps's share (the protocol's calls, the
            chief's release; on one machine's shared cores, also the time
            they sit idle at the update's barrier). 4.45: the least-squares
            fit of log updates/s to FIT's 12 sync runs, the other constants
            kept.
        in_graph_chief_ms: The in-graph chief's time per worker per step
            (it drives each worker's part of the step; with the step on the
            first worker, the critical path per worker rather than the
            chief's own CPU, 0.6 to 1.1 ms per update in FIT). 4.45: the
            least-squares fit of log updates/s to FIT's 27 in-graph runs.
        compress_ms_per_mparam: CPU per million parameters to select a
            top-k, on the worker for its gradient and on the ps and the
            worker for a read of the changes. 12.4: the median extra async
            worker CPU per step with `top_k(ratio=0.01)` against the same
            run without it, 3.7 ms for 0.297M (scaling_compression.json,
            scaling_reads.json, scaling_delta_reads.json).
        shared_core_use: The share of a machine's cores that tasks sharing
            them keep busy (the rest is lost to waiting on each other). 0.84:
            the least-squares fit of log updates/s to FIT's async runs on
            unlimited links, before the critical paths; only the runs of
            `benchmarks/plan_check.py` and `benchmarks/scaling.py`, whose
            tasks share one machine, use it (`machine_cores`).
    """

    flops_per_core_ms: float = 5.369e7
    worker_overhead_ms: float = 1.294
    rtt_ms: float = 0.2
    ps_fixed_ms: float = 0.244
    ps_request_ms: float = 1.553
    ps_tensor_ms: float = 0.0625
    ps_ms_per_mb: float = 0.2081
    ps_apply_ms_per_mparam: float = 3.27
    ps_apply_ms_per_variable: float = 0.033
    sync_critical_path_ms: float = 4.45
    in_graph_chief_ms: float = 4.45
    compress_ms_per_mparam: float = 12.4
    shared_core_use: float = 0.84

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            positive = field.name in ("flops_per_core_ms", "shared_core_use")
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not (
                (0 < value if positive else 0 <= value) and value < float("inf")
            ):
                raise ValueError(
                    f"`Costs.{field.name}` must be a finite number "
                    f"{'> 0' if positive else '>= 0'}. Received: "
                    f"{field.name}={value!r}"
                )
