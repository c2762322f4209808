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
    benchmarks (refitted on 2026-12-06 from the cost run, `COSTS RUN` below:
    `python benchmarks/scaling.py --only workers --workers 1 2 4
    --workers-compression fp16@bfloat16 --steps 60 --epochs 2 --rounds 2`,
    `benchmarks/results/scaling_costs.json`, which records each host's CPU
    per update, with `python benchmarks/plan_check.py --fit
    benchmarks/results/scaling_costs.json`), measured on one 2-core machine (AMD EPYC, TF 2.21, Keras
    3.15) whose tasks shared its cores; each constant below names the
    command and the JSON it came from. The MLP of `benchmarks/scaling.py` is
    64-512-512-2 (296,962 parameters, 1.19 MB, Adam); that of
    `benchmarks/sync_vs_tf1.py` 784-512-512-10 (669,706 parameters, 2.68 MB,
    plain SGD), whose worker reads 2.68 MB and sends 2.68 MB per step.

    Attributes:
        flops_per_core_ms: FLOPs one core computes per ms, for `step_ms`'s
            estimate `6 * params * batch / flops_per_core_ms`. 5.645e7: the
            COSTS RUN's one-device step of the scaling MLP at batch 128, 5.01
            CPU ms (the whole Keras step, every thread; the kernels alone,
            `benchmarks/results/profile_step.json`, gave 1.076e8).
        worker_overhead_ms: A worker's CPU per step beyond its forward and
            backward pass (Keras's and TensorFlow's per-step work, the
            gRPC calls, reading and sending the bytes). 3.71: the COSTS
            RUN's median async worker CPU per step (read from the worker
            hosts' processes) less the model's own step. Before: 6.0, the median
            async worker's CPU per step, 8.13 ms (cpu_fraction x workers /
            updates/s, over the 8 async runs on unlimited links without
            compression), less the MLP's 2.12 ms of `flops_per_core_ms` at
            batch 128 (`python benchmarks/scaling.py --rounds 1` and its
            `--only mbit` runs: `benchmarks/results/scaling.json`,
            `scaling_compression.json`, `scaling_reads.json`,
            `scaling_delta_reads.json`). The same constant gives
            sync_vs_tf1's chief 10.8 ms per step; it measured 10.0 to 10.2.
        rtt_ms: Network round trips per worker step. 0.2: assumed (a few
            round trips inside a data centre); nothing here measures it
            apart.
        ps_fixed_ms: A ps task's CPU per update that grows neither with
            the bytes nor with the worker steps. 1.388: least squares over
            the COSTS RUN's 18 runs of ours (ps CPU per update read from the
            ps host's processes, at full and at 16-bit bytes). Before: 1.55,
            the intercept, 1.99
            ms, of a least-squares line through the sync service's ps CPU
            per update against W (9 runs, W = 1, 2, 4: `python
            benchmarks/sync_vs_tf1.py --workers 1,2,4 --rounds 3 --steps 600
            --warmup 50`, `benchmarks/results/sync_vs_tf1.json`,
            `cpu_ms.ours.ps_cpu_ms`), less that run's fused SGD apply, 0.434
            ms (`python benchmarks/sync_vs_tf1.py --update-only --rounds 3`,
            `benchmarks/results/sync_update.json`).
        ps_request_ms: A ps task's CPU per worker step it serves (the
            step's calls, not its tensors nor its bytes). 2.65: the 3.40 ms
            per worker step split from `ps_ms_per_mb` below (measured with
            the 6-variable MLPs on one ps task), less what that step's 12
            tensors take (12 x `ps_tensor_ms`, 0.75 ms).
        ps_tensor_ms: A ps task's CPU per tensor a worker step moves to or
            from it (one read per variable it holds, one gradient pushed
            back). 0.0625: TensorFlow alone, one ps and one worker on
            loopback, 10 steps per call, 2 to 192 tensors of the same 1.19
            MB in all: (14.60 - 2.73 ms) / 190 more tensors (`python
            benchmarks/ps_request_cost.py --rounds 3`,
            `benchmarks/results/ps_request_cost.json`). A model of many
            variables costs the ps more per step than one of the same bytes
            in few.
        ps_ms_per_mb: A ps task's CPU per MB it serves or receives. 0.2081:
            the same least squares (16-bit reads and gradients halve the
            bytes and barely move the ps's CPU: 6.08 and 6.88 ms per update
            at W = 1, 5.48 and 4.79 at W = 4). Before: 0.21.
            The sync line's slope, 4.53 ms per worker, is `ps_request_ms +
            5.36 MB * ps_ms_per_mb` (a worker reads and sends 5.36 MB per
            update); one model size cannot split the two, so a second
            equation comes from the async runs on unlimited links of
            scaling_compression.json and scaling_delta_reads.json (the
            quietest, load 0.8 and 1.1): the machine's CPU per update (busy
            fraction x 2 cores / updates/s, 14.0 and 14.2 ms) less the
            worker's (7.5 and 7.8 ms) leaves 6.42 ms for the ps, which is
            `ps_fixed_ms + ps_request_ms + 2.38 MB * ps_ms_per_mb` plus the
            Adam apply (0.97 ms). Together: 3.40 ms per request and 0.21 ms
            per MB. The 6.42 ms also holds the launcher's and the
            benchmark's sampler's CPU, so 3.40 is an upper bound. It is the
            least-known constant here, and the one that bounds sync
            training on many workers: `plan_check.py --fit` splits it from
            runs that record `ps_cpu_ms_per_update` at several ps counts.
        ps_apply_ms_per_mparam: CPU per million parameters of the
            optimizer's update on the ps (Adam). 3.27: the PS column's
            "optimizer update and other elementwise", 0.97 ms per step for
            the scaling MLP's 0.297M (profile_step.json). Plain SGD is about
            0.65 (sync_update.json: 0.434 ms for 0.67M, fused).
        sync_critical_path_ms: What a sync update waits for beyond the
            workers' step and the ps's share (the protocol's calls, the
            chief's release). 4.906: the least-squares fit of log updates/s
            to the COSTS RUN's 6 sync runs (Adam, 10 steps per call, on
            namespaces). Before: 0.5, the least-squares fit of this model's
            sync updates/s to the 9 runs of sync_vs_tf1.json (1 ps, W = 1, 2,
            4 on loopback, 2 shared cores, SGD; predictions 81, 61 and 32
            updates/s against medians of 80, 55 and 30). The sync runs of
            scaling*.json (2026-11-28) predate that protocol and are left
            out.
        in_graph_chief_ms: The in-graph chief's time per worker per step
            (it drives each worker's part of the step). 4.673: the
            least-squares fit of log updates/s to the 9 in-graph runs of
            scaling_packed.json (the step on the first worker, packed reads
            and pushes; the other constants kept), which predicts them with
            a median error of 17 %, the 6 of scaling_packed_deep.json (48
            variables) with 8 % and the 9 of scaling_step_device.json with
            17 % (6.262 gave 26 %, 14 % and 12 %). Before: 6.262, the same
            fit to the COSTS RUN's 6 in-graph runs; its chief's own CPU per
            update there was 4.8, 6.1 and 11.5 ms at W = 1, 2, 4. Before: 7.3, the
            least-squares fit of this model's in-graph updates/s to the 7
            in-graph runs on unlimited links without compression
            (scaling.json at W = 1, 2, 4, 8, and scaling_compression.json,
            scaling_reads.json, scaling_delta_reads.json at W = 2; errors
            -21 % to +25 %). The chief's own CPU per update there grew by
            about 2.4 ms per worker; the rest of its 7.3 ms is waiting, on
            2 shared cores. Since the step runs on the first worker (the
            chief's CPU per update 0.8 to 1.4 ms), it is the critical path
            per worker rather than the chief's: the 9 in-graph runs of
            scaling_step_device.json are predicted with a median error of
            6 % by these constants, and 9 % after a refit (4.906), so they
            stay.
        compress_ms_per_mparam: CPU per million parameters to select a
            top-k, on the worker for its gradient and on the ps and the
            worker for a read of the changes. 12.4: the median extra async
            worker CPU per step with `top_k(ratio=0.01)` against the same
            run without it, 3.7 ms for 0.297M (scaling_compression.json,
            scaling_reads.json, scaling_delta_reads.json).
    """

    flops_per_core_ms: float = 5.645e7
    worker_overhead_ms: float = 3.71
    rtt_ms: float = 0.2
    ps_fixed_ms: float = 1.388
    ps_request_ms: float = 2.65
    ps_tensor_ms: float = 0.0625
    ps_ms_per_mb: float = 0.2081
    ps_apply_ms_per_mparam: float = 3.27
    sync_critical_path_ms: float = 4.906
    in_graph_chief_ms: float = 4.673
    compress_ms_per_mparam: float = 12.4

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            positive = field.name == "flops_per_core_ms"  # divides
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not (
                (0 < value if positive else 0 <= value) and value < float("inf")
            ):
                raise ValueError(
                    f"`Costs.{field.name}` must be a finite number "
                    f"{'> 0' if positive else '>= 0'}. Received: "
                    f"{field.name}={value!r}"
                )
