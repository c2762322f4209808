"""`keras-psdist slurm`: each rank of a Slurm job step runs its task.

Slurm's environment is recorded here; the last test runs a step's three
ranks as `srun` would, on this machine. tests/test_slurm_real.py runs a step
under a real Slurm.
"""

import json
import os
import subprocess
import sys

import pytest
import slurm_cluster  # tests/, beside this module

from keras_psdist.cluster.config import ClusterConfig
from keras_psdist.cluster.slurm import (
    _serve_while_training,
    expand_hostlist,
    expand_tasks_per_node,
    from_slurm,
)

pytestmark = pytest.mark.waits

FAKE_TRAINER = os.path.join(os.path.dirname(__file__), "scripts", "fake_trainer.py")

# `srun --nodes 3 --ntasks-per-node 2` on node01..node03 (Slurm 23.02).
STEP = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "node[01-03]",
    "SLURM_TASKS_PER_NODE": "2(x3)",
    "SLURM_NTASKS": "6",
    "SLURM_STEP_NODELIST": "node[01-03]",
    "SLURM_STEP_TASKS_PER_NODE": "2(x3)",
    "SLURM_STEP_NUM_TASKS": "6",
    "SLURM_DISTRIBUTION": "block",
}


def _rank(rank, **changes):
    return {**STEP, "SLURM_PROCID": str(rank), **changes}


@pytest.mark.parametrize(
    "hostlist, hosts",
    [
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("gpu[08-10],cpu5", ["gpu08", "gpu09", "gpu10", "cpu5"]),
        ("a[1,3-4],b[2]", ["a1", "a3", "a4", "b2"]),
        ("10.0.0.1,10.0.0.2", ["10.0.0.1", "10.0.0.2"]),
    ],
)
def test_host_lists_expand_in_order(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize("bad", ["node[1-", "node[3-1]", "node[a-b]", "n[1]x"])
def test_bad_host_lists_are_named(bad):
    with pytest.raises(ValueError, match="Cannot read Slurm's host list"):
        expand_hostlist(bad)


def test_tasks_per_node_expand():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(ValueError, match="expected e.g. 2"):
        expand_tasks_per_node("2x3")


def test_between_graph_ranks_are_the_ps_tasks_then_the_workers():
    names = [
        from_slurm(2, "between-graph", environ=_rank(r)).task_name for r in range(6)
    ]
    assert names == ["ps:0", "ps:1", "worker:0", "worker:1", "worker:2", "worker:3"]
    config = from_slurm(2, "between-graph", environ=_rank(3))
    # A node's tasks are consecutive ranks, on consecutive ports.
    assert config.addresses("ps") == ("node01:8888", "node01:8889")
    assert config.addresses("worker") == (
        "node02:8888",
        "node02:8889",
        "node03:8888",
        "node03:8889",
    )
    assert config.task_address == "node02:8889"


def test_in_graph_rank_0_is_the_chief():
    names = [
        from_slurm(1, "in-graph", port=2222, environ=_rank(r)).task_name
        for r in range(6)
    ]
    assert names == ["chief:0", "ps:0", "worker:0", "worker:1", "worker:2", "worker:3"]
    assert from_slurm(1, "in-graph", port=2222, environ=_rank(0)).task_address == (
        "node01:2222"
    )


def test_the_job_s_variables_serve_when_the_step_s_are_missing():
    env = {k: v for k, v in _rank(1).items() if not k.startswith("SLURM_STEP")}
    assert from_slurm(1, "between-graph", environ=env).task_name == "worker:0"


@pytest.mark.parametrize(
    "env, match",
    [
        ({}, "SLURM_PROCID is not set: run this under `srun`"),
        (
            _rank(0, SLURM_DISTRIBUTION="cyclic"),
            "needs the block distribution.*--distribution=block",
        ),
        (
            _rank(0, SLURM_STEP_TASKS_PER_NODE="2(x2)"),
            "lists 3 node.*tasks per node for 2",
        ),
        (_rank(0, SLURM_STEP_NUM_TASKS="5"), "step has 5 tasks but its nodes list 6"),
        (_rank(9), "SLURM_PROCID=9 is outside the step's 6 tasks"),
    ],
)
def test_bad_slurm_environments_are_named(env, match):
    with pytest.raises(ValueError, match=match):
        from_slurm(1, "between-graph", environ=env)


def test_too_few_tasks_say_how_many_to_ask_for():
    env = _rank(
        0,
        SLURM_STEP_TASKS_PER_NODE="1",
        SLURM_STEP_NODELIST="node1",
        SLURM_STEP_NUM_TASKS="1",
    )
    with pytest.raises(ValueError, match="Ask srun for 2 or more tasks"):
        from_slurm(1, "between-graph", environ=env)
    env = _rank(
        0,
        SLURM_STEP_TASKS_PER_NODE="2",
        SLURM_STEP_NODELIST="node1",
        SLURM_STEP_NUM_TASKS="2",
    )
    with pytest.raises(ValueError, match="besides the chief.*Ask srun for 3"):
        from_slurm(1, "in-graph", environ=env)


@pytest.mark.timeout(120)
def test_a_step_s_ranks_run_their_tasks_and_the_ps_stops_after_training(tmp_path):
    """Three ranks on one node, as `srun --ntasks 3` starts them: rank 0
    serves ps:0 (a real `keras-psdist serve`), ranks 1 and 2 run the command
    as worker:0 and worker:1; once the workers have ended, the ps stops and
    every rank exits 0 (Slurm's step ends when every rank has)."""
    port = slurm_cluster.free_port_run(3)
    reports = tmp_path / "reports"
    reports.mkdir()
    ranks = []
    for rank in range(3):
        env = dict(
            os.environ,
            SLURM_PROCID=str(rank),
            SLURM_STEP_NODELIST="127.0.0.1",
            SLURM_STEP_TASKS_PER_NODE="3",
            SLURM_STEP_NUM_TASKS="3",
        )
        ranks.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "keras_psdist",
                    "slurm",
                    "--num-ps",
                    "1",
                    "--mode",
                    "between-graph",
                    "--port",
                    str(port),
                    "--serve-idle-timeout",
                    "5",
                    "--",
                    sys.executable,
                    FAKE_TRAINER,
                    "listen_briefly",
                    str(reports),
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        )
    try:
        outputs = [r.communicate(timeout=90)[0] for r in ranks]
    finally:
        for r in ranks:
            if r.poll() is None:
                os.killpg(r.pid, 9)
    assert [r.returncode for r in ranks] == [0, 0, 0], outputs
    assert f"ps:0: serving at 127.0.0.1:{port}" in outputs[0]
    assert "the training tasks have ended; stopping the server" in outputs[0]
    for rank, name in ((1, "worker:0"), (2, "worker:1")):
        report = json.loads((reports / f"{name}.json").read_text())
        config = json.loads(report["tf_config"])
        assert config["task"] == {"type": "worker", "index": rank - 1}
        assert config["cluster"]["ps"] == [f"127.0.0.1:{port}"]
        assert "started" in outputs[rank]


def test_the_cli_says_what_is_missing(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    result = subprocess.run(
        [sys.executable, "-m", "keras_psdist", "slurm", "--num-ps", "1", "--", "true"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "SLURM_PROCID is not set: run this under `srun`" in result.stderr


class _Server:
    """A `keras-psdist serve` process that runs until it is stopped."""

    returncode = None

    def poll(self):
        return None


def _ps_of(worker_port):
    return ClusterConfig(
        {"ps": ["127.0.0.1:1"], "worker": [f"127.0.0.1:{worker_port}"]}, "ps", 0
    )


@pytest.mark.timeout(60)
def test_a_server_that_no_training_task_ever_reaches_stops_saying_so(capsys):
    # Nothing listens at the worker's address: the training never came up.
    port = slurm_cluster.free_port_run(1)
    config = _ps_of(port)
    code = _serve_while_training(_Server(), config, "between-graph", 40.0, 1.0)
    said = capsys.readouterr().out
    assert code == 1
    assert f"ps:0: no training task came up within 1 s (127.0.0.1:{port})" in said
    assert "--serve-start-timeout" in said


@pytest.mark.timeout(60)
def test_a_server_stops_once_the_training_tasks_are_gone_for_its_setting(capsys):
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    config = _ps_of(listener.getsockname()[1])
    # The worker answers for a while, then ends.
    threading.Timer(1.5, listener.close).start()
    code = _serve_while_training(_Server(), config, "between-graph", 1.0, 600.0)
    said = capsys.readouterr().out
    assert code == 0
    assert (
        "ps:0: the training tasks have ended; stopping the server (none has "
        "answered for 1 s)" in said
    )
