"""`keras-psdist slurm` under a real Slurm: `srun` of Debian's `slurm-wlm`,
with a one-node controller and daemon the test starts (tests/slurm_cluster.py).

tests/test_slurm.py covers Slurm's environment, recorded; here Slurm itself
sets it, starts the ranks and ends the step. Skipped, saying why, where
Slurm's and munge's commands are not installed or the test is not root
(.ci/install-system-packages installs them).
"""

import json
from pathlib import Path

import pytest
import slurm_cluster  # tests/, beside this module

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.waits,
    pytest.mark.skipif(
        slurm_cluster.unavailable() is not None,
        reason=f"no real Slurm here: {slurm_cluster.unavailable()}",
    ),
]

JOB = Path(__file__).parent / "cluster_jobs" / "slurm_job.py"
STEP_TIMEOUT_S = 150


@pytest.fixture
def slurm():
    with slurm_cluster.SlurmCluster() as cluster:
        yield cluster


@pytest.mark.timeout(240)
def test_a_real_srun_step_trains_between_graph_and_ends(slurm, tmp_path):
    """`srun --ntasks 3`: rank 0 serves ps:0, ranks 1 and 2 train as worker:0
    (the chief) and worker:1 on the ps's shared variables; the ps stops once
    they have ended, so the step ends with every rank's exit code 0."""
    port = slurm_cluster.free_port_run(3)
    code, output = slurm.srun(
        [
            "--ntasks",
            "3",
            # 3 tasks on a node of fewer CPUs; else Slurm queues the step.
            "--overcommit",
            "--kill-on-bad-exit=1",
            "--time=4",
            "keras-psdist",
            "slurm",
            "--num-ps",
            "1",
            "--mode",
            "between-graph",
            "--port",
            str(port),
            # The ps stops 3 s after the trainers end, not the default 40.
            "--serve-idle-timeout",
            "3",
            "--",
            "python",
            str(JOB),
            str(tmp_path),
        ],
        timeout_s=STEP_TIMEOUT_S,
    )
    assert code == 0, f"srun exited {code}:\n{output[-6000:]}\n{slurm.logs()}"
    node = slurm.node
    assert f"[slurm] ps:0: serving at {node}:{port}" in output
    assert "[slurm] ps:0: the training tasks have ended; stopping the server" in (
        output
    )

    reports = [json.loads((tmp_path / f"worker_{i}.json").read_text()) for i in (0, 1)]
    # One allocation, rank r+1 is worker:r, the cluster is the step's node.
    assert len({r["slurm_job_id"] for r in reports}) == 1
    assert reports[0]["slurm_job_id"] is not None
    cluster = {
        "ps": [f"{node}:{port}"],
        "worker": [f"{node}:{port + 1}", f"{node}:{port + 2}"],
    }
    for index, report in enumerate(reports):
        assert report["task"] == f"worker:{index}"
        assert report["slurm_procid"] == str(index + 1)
        assert report["tf_config"] == {
            "cluster": cluster,
            "task": {"type": "worker", "index": index},
        }
        assert report["variable_devices"] == ["/job:ps/replica:0/task:0/device:CPU:0"]
        assert report["steps"] > 0
    assert [r["is_chief"] for r in reports] == [True, False]
    # Seeded differently, both started from the chief's weights and, read
    # after both trained, both see the same trained weights: the ps's.
    assert reports[0]["initial_checksum"] == pytest.approx(
        reports[1]["initial_checksum"], rel=1e-6
    )
    assert reports[0]["final_checksum"] == reports[1]["final_checksum"]
    assert reports[0]["final_checksum"] != reports[0]["initial_checksum"]
    # Both workers' steps landed in the one shared counter (Keras increments
    # it by read-modify-write, so simultaneous increments may count once).
    steps = [r["steps"] for r in reports]
    assert reports[0]["iterations"] == reports[1]["iterations"]
    assert max(steps) < reports[0]["iterations"] <= sum(steps)
    for report in reports:
        assert report["losses"][-1] < report["losses"][0]
