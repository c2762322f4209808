"""One vocabulary for how a cluster trains, and no run in the wrong one.

`keras-psdist launch --mode in-graph|between-graph` and
`PSStrategy(mode="in-graph"|"between-graph")` use the same words; a strategy
started by a launch of the other mode (or in a role its mode cannot use)
fails at once, naming what it found and the command that would work, instead
of training on a share of the data or waiting for workers that only serve.
"""

import sys
import textwrap
import time
import warnings

import pytest
from launching import launch_job

import keras_psdist as kpd
from keras_psdist import callbacks, cluster
from keras_psdist.cluster import runtime
from keras_psdist.cluster.config import LAUNCH_MODE_ENV
from keras_psdist.cluster.liveness import LossReporter
from keras_psdist.sync import protocol
from keras_psdist.sync.protocol import SyncConfig

# Addresses nothing listens on: every check below fails before connecting.
IN_GRAPH_JOBS = {
    "ps": ["127.0.0.1:1"],
    "worker": ["127.0.0.1:2", "127.0.0.1:3"],
    "chief": ["127.0.0.1:4"],
}
BETWEEN_GRAPH_JOBS = {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]}


def test_between_graph_strategy_under_an_in_graph_launch_names_the_fix(monkeypatch):
    monkeypatch.setenv(LAUNCH_MODE_ENV, "in-graph")
    chief = cluster.ClusterConfig(IN_GRAPH_JOBS, "chief", 0)
    with pytest.raises(ValueError) as e:
        kpd.PSStrategy(cluster_resolver=chief, mode="between-graph")
    message = str(e.value)
    assert "1/3 of the data" in message
    assert "keras-psdist launch --mode between-graph --num-ps 1 --num-workers 2" in (
        message
    )
    assert "PSStrategy()" in message


def test_sync_replicas_under_an_in_graph_launch_fail_at_once(monkeypatch):
    monkeypatch.setenv(LAUNCH_MODE_ENV, "in-graph")
    chief = cluster.ClusterConfig(IN_GRAPH_JOBS, "chief", 0)
    # Before anything about the replica count: the launch is what is wrong.
    with pytest.raises(ValueError) as e:
        kpd.SyncReplicaStrategy(cluster_resolver=chief, total_num_replicas=2)
    message = str(e.value)
    assert message.startswith("SyncReplicaStrategy trains between-graph")
    assert "keras-psdist launch --mode between-graph --num-ps 1 --num-workers 2" in (
        message
    )
    assert "PSStrategy()" not in message


@pytest.mark.parametrize("task_id", [0, 1])
def test_in_graph_strategy_under_a_between_graph_launch_names_the_fix(
    monkeypatch, task_id
):
    monkeypatch.setenv(LAUNCH_MODE_ENV, "between-graph")
    worker = cluster.ClusterConfig(BETWEEN_GRAPH_JOBS, "worker", task_id)
    with pytest.raises(ValueError) as e:
        kpd.PSStrategy(cluster_resolver=worker)
    message = str(e.value)
    assert f"this process is worker:{task_id}" in message
    assert "launch --mode between-graph" in message
    assert "keras-psdist launch --num-ps 1 --num-workers 2 -- python" in message
    assert "PSStrategy(mode='between-graph')" in message
    assert "SyncReplicaStrategy()" in message


def test_the_suggested_command_keeps_the_replica_count():
    # In-graph, every worker task holds replicas and the chief only drives
    # them; between-graph, every task that runs the script is one.
    in_graph = cluster.ClusterConfig(IN_GRAPH_JOBS, "chief", 0)
    assert runtime.launch_command_line(in_graph, "between-graph").startswith(
        "keras-psdist launch --mode between-graph --num-ps 1 --num-workers 2 -- "
    )
    between = cluster.ClusterConfig(BETWEEN_GRAPH_JOBS, "worker", 0)
    assert runtime.launch_command_line(between, "in-graph").startswith(
        "keras-psdist launch --num-ps 1 --num-workers 2 -- python "
    )


def test_old_spellings_work_with_a_deprecation_warning(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.warns(DeprecationWarning, match="mode='in-graph'"):
        strategy = kpd.PSStrategy(mode="sync", devices=["/cpu:0"])
    assert strategy.extended.topology.mode == "local"
    with pytest.warns(DeprecationWarning, match="mode='between-graph'"):
        with pytest.raises(ValueError, match="needs a cluster"):
            kpd.PSStrategy(mode="async")


def test_current_spellings_do_not_warn(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        kpd.PSStrategy(mode="in-graph", devices=["/cpu:0"])


def test_unknown_mode_lists_both_and_what_they_mean():
    # The launcher's words (tests/test_launch.py), and what each mode does.
    with pytest.raises(ValueError) as e:
        kpd.PSStrategy(mode="ring")
    message = str(e.value)
    assert message.startswith(
        "Unknown mode 'ring'. Expected one of: in-graph, between-graph. ("
    )
    assert "in-graph: one client, the chief" in message
    assert "between-graph: every worker task runs the script" in message


def test_workers_are_named_by_their_tasks():
    with_chief = cluster.ClusterConfig(IN_GRAPH_JOBS, "chief", 0)
    assert runtime.training_task_names(with_chief) == (
        "chief:0",
        "worker:0",
        "worker:1",
    )
    config = SyncConfig(2, 3, 1.0, worker_names=("chief:0", "worker:0", "worker:1"))
    assert config.names([1, 2]) == "worker:0, worker:1"
    # Without names (a between-graph launch has no chief): index i is worker:i.
    assert SyncConfig(2, 3, 1.0).names([1, 2]) == "worker:1, worker:2"
    # SyncReplicaReport's summary line says the same.
    label, meaning = protocol.COUNT_NAMES[protocol.DROPPED_STALE]
    assert (
        callbacks._total(label, meaning, [0, 17, 2], config.name)
        == f"dropped as stale 19 (most from worker:0: 17; {meaning})"
    )


class _SilentWorkers:
    """Heartbeats where worker:0 and worker:1 never beat (only serve)."""

    names = ("chief:0", "worker:0", "worker:1")
    timeout = 0.2
    servers_lost = {}

    def on_change(self, callback):
        pass

    def lost(self):
        return []

    def never_started(self):
        return [1, 2]


def test_the_chief_warns_about_workers_that_never_start(caplog):
    """Without the launcher's word (a cluster started by hand), the chief of a
    between-graph run still says when the other tasks never run the script."""
    reporter = LossReporter(_SilentWorkers(), every=0.05)
    try:
        deadline = time.monotonic() + 10
        while "not started training" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        reporter.stop()
    assert "after the chief: worker:0, worker:1. Every" in caplog.text
    assert "PSStrategy() (mode='in-graph')" in caplog.text
    assert caplog.text.count("not started training") == 1


WRONG_MODE_SCRIPT = textwrap.dedent(
    """
    import sys
    import keras_psdist as kpd

    if sys.argv[1] == "between-graph":
        kpd.PSStrategy(mode="between-graph")
    elif sys.argv[1] == "sync-replicas":
        kpd.SyncReplicaStrategy()
    else:
        kpd.PSStrategy()
    print("TRAINED")
    """
)


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "strategy, launch_mode, fix",
    [
        (
            "between-graph",
            "in-graph",
            "keras-psdist launch --mode between-graph --num-ps 1 --num-workers 1",
        ),
        (
            "in-graph",
            "between-graph",
            "keras-psdist launch --num-ps 1 --num-workers 1 -- python",
        ),
    ],
)
def test_a_launch_of_the_other_mode_stops_at_once(tmp_path, strategy, launch_mode, fix):
    """The issue's case: `PSStrategy(mode="between-graph")` under the default
    launch trained on the chief alone, on a third of the data, and exited 0."""
    script = tmp_path / "train.py"
    script.write_text(WRONG_MODE_SCRIPT)
    start = time.monotonic()
    code, log = launch_job(
        script, [strategy], num_ps=1, num_workers=1, mode=launch_mode, timeout_s=120
    )
    elapsed = time.monotonic() - start
    assert code not in (0, 124), log
    assert "TRAINED" not in log, log
    assert fix in log, log
    # Well before any step_timeout or init_timeout would have ended it.
    assert elapsed < 100, (elapsed, log)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
