"""Compression across processes: an in-graph cluster (1 ps task, 2 worker
tasks) trains with top-k, each worker task compressing its replica's
gradient and keeping its residuals, and ends at the weights of the same
replicas in one process; a between-graph worker sends its gradients to the
ps task compressed, and ends at the weights of one replica in one process."""

import json
from pathlib import Path

import launching  # tests/cluster_jobs, see conftest.py
import numpy as np
import pytest

import keras_psdist as kpd

pytestmark = pytest.mark.multiprocess

JOB = Path(__file__).parent / "cluster_jobs" / "compression_job.py"


def _launch(tmp_path, mode, num_workers):
    """The job on a cluster of 1 ps task and `num_workers` worker tasks:
    its report, after the checks every mode shares."""
    code, log = launching.launch_job(
        JOB,
        [tmp_path, mode],
        num_ps=1,
        num_workers=num_workers,
        mode=mode,
        timeout_s=300,
    )
    assert code == 0, (
        f"launch exited {code}:\n{launching.without_progress(log)[-6000:]}"
    )
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["mode"] == mode
    assert report["compression"] == "TopK(ratio=0.1)"
    assert report["accuracy"] >= 0.85
    return report


def _assert_equals_one_process(
    tmp_path, devices, parameter_devices, read_dtype=None, read_compression=None
):
    """The cluster's weights are those of the same replicas in one process
    (with `read_dtype` or `read_compression`, its parameter device counting
    as another task)."""
    import digits_job

    strategy = kpd.PSStrategy(
        devices=devices,
        parameter_devices=parameter_devices,
        compression="top_k(ratio=0.1)",
        read_dtype=read_dtype,
        read_compression=read_compression,
    )
    model = digits_job.build(strategy)
    digits_job.train(model)
    cluster_weights = np.load(tmp_path / "weights.npz")
    for i, w in enumerate(model.weights):
        np.testing.assert_allclose(
            cluster_weights[f"arr_{i}"], w.numpy(), rtol=0, atol=1e-5
        )


def test_in_graph_compression_keeps_residuals_on_the_workers(tmp_path, cpu_devices):
    report = _launch(tmp_path, "in-graph", num_workers=2)
    # Three layers' kernels and biases (six), a residual each per worker task.
    tasks = sorted({d.split("/device:")[0] for d in report["state_devices"]})
    assert tasks == ["/job:worker/replica:0/task:0", "/job:worker/replica:0/task:1"]
    assert len(report["state_devices"]) == 12
    assert report["narrowed_reads"] == []  # read_dtype not set
    _assert_equals_one_process(tmp_path, cpu_devices[:2], cpu_devices[2:3])


def test_between_graph_worker_sends_compressed_and_keeps_its_residuals(
    tmp_path, cpu_devices, across_tasks
):
    """One worker task, one ps task: the worker compresses what it sends to
    the ps (residuals on the worker), the ps decompresses before the update,
    and the worker reads the variables in bfloat16 (`read_dtype`), its two
    64 x 64 kernels by their largest changes (`read_compression`, a copy on
    each side); the same top-k with error feedback and the same reads as one
    replica in one process."""
    report = _launch(tmp_path, "between-graph", num_workers=1)
    # Three layers' kernels and biases: a residual each, on the worker.
    assert len(report["state_devices"]) == 6
    assert {d.split("/device:")[0] for d in report["state_devices"]} == {
        "/job:worker/replica:0/task:0"
    }
    # The 4 other reads (the last kernel, 3 biases) of its train step and
    # of its `evaluate`'s step, each traced once, were narrowed on the ps.
    assert report["read_dtype"] == "bfloat16"
    assert len(report["narrowed_reads"]) == 8
    assert {d.split("/device:")[0] for d in report["narrowed_reads"]} == {
        "/job:ps/replica:0/task:0"
    }
    assert [
        [seen.split("/device:")[0], local.split("/device:")[0]]
        for seen, local in report["read_copies"]
    ] == [["/job:ps/replica:0/task:0", "/job:worker/replica:0/task:0"]] * 2
    # `across_tasks`: the one process reads as the worker did.
    _assert_equals_one_process(
        tmp_path,
        cpu_devices[:1],
        cpu_devices[1:2],
        read_dtype="bfloat16",
        read_compression="top_k(ratio=0.1)",
    )
