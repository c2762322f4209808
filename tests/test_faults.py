"""Faults survived: worker processes really killed (SIGKILL) mid-`fit`.

Each fixture runs `tests/cluster_jobs/fault_job.py` on a whole local cluster
(`keras_psdist.cluster.launch`, which stops every process however the run
ends, and bounds it with its timeout) and reads back what every start of
every worker wrote. See docs/reliability.md for the table these tests fill.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import launching  # tests/cluster_jobs, see conftest.py
import numpy as np
import ps_loss_job
import pytest
from launching import without_progress

pytestmark = [pytest.mark.multiprocess, pytest.mark.waits]

JOB = Path(__file__).parent / "cluster_jobs" / "fault_job.py"
PS_LOSS_JOB = Path(__file__).parent / "cluster_jobs" / "ps_loss_job.py"
CHECKPOINT_KILL_JOB = Path(__file__).parent / "scripts" / "checkpoint_kill_job.py"
LAUNCH_TIMEOUT_S = 420


# Every launch of `fault_job.py` here, by name: its config, how many workers,
# the launch's failure policy, and whether the run must end well (exit code
# 0). The tests take one through `fault_run`, launched once per module.
SCENARIOS = {
    # async: worker 1 killed at step 10, restarted, rejoins.
    "async_restart": dict(
        config={
            "strategy": "async",
            "kill_worker": 1,
            "kill_at_step": 10,
            "wait_for_rejoin_at_step": 30,
            "epochs": 3,
            "heartbeat_timeout": 3,
        },
        num_workers=2,
        launch={"max_restarts": 1},
        succeeds=True,
    ),
    # sync replicas, one backup: worker 2 lost, the run goes on, it is back.
    "sync_backup": dict(
        config={
            "strategy": "sync",
            "replicas_to_aggregate": 2,
            "kill_worker": 2,
            "kill_at_step": 10,
            "wait_for_rejoin_at_step": 25,
            "epochs": 2,
            # Long enough that a worker starved of CPU (a loaded test machine)
            # is not taken for lost a second time: the counts asserted below
            # are those of a run where only the kill loses it. (Lost again
            # near the end, its fit stops early: `test_sync_watchdog.py`.)
            "heartbeat_timeout": 8,
        },
        num_workers=3,
        launch={"max_restarts": 1},
        succeeds=True,
    ),
    # sync replicas, no backup: worker 1 killed; the launcher lets the chief
    # find out by itself (max_worker_failures=1).
    "sync_no_backup": dict(
        config={
            "strategy": "sync",
            "kill_worker": 1,
            "kill_at_step": 10,
            "epochs": 2,
            "heartbeat_timeout": 3,
        },
        num_workers=2,
        launch={"max_worker_failures": 1},
        succeeds=False,
    ),
    # sync replicas, the chief frozen: SIGSTOP, not SIGKILL, so its process
    # stays (a hung machine) and the launcher sees no exit; only the
    # heartbeats tell the others.
    "sync_frozen_chief": dict(
        config={
            "strategy": "sync",
            "freeze_worker": 0,
            "freeze_at_step": 10,
            "epochs": 3,
            "heartbeat_timeout": 3,
        },
        num_workers=2,
        launch={},
        succeeds=False,
    ),
}


def _launch(tmp_path, config, num_workers, **kwargs):
    code, log = launching.launch_job(
        JOB,
        [tmp_path, json.dumps(config)],
        num_ps=1,
        num_workers=num_workers,
        mode="between-graph",
        timeout_s=LAUNCH_TIMEOUT_S,
        **kwargs,
    )
    reports = {
        p.stem.removeprefix("worker_"): json.loads(p.read_text())
        for p in tmp_path.glob("worker_*_start_*.json")
    }
    return code, reports, log


def _failed_not_timed_out(code, log):
    """The launch ended with an error (not 0), not by its timeout (124)."""
    assert code not in (0, 124), without_progress(log)[-6000:]


@pytest.fixture(scope="module")
def fault_run(request, tmp_path_factory):
    """`(exit code, reports, log)` of the launch `SCENARIOS[request.param]`
    (tests pick it with `scenario`); one that must end well has."""
    name = request.param
    scenario = SCENARIOS[name]
    code, reports, log = _launch(
        tmp_path_factory.mktemp(name),
        scenario["config"],
        scenario["num_workers"],
        **scenario["launch"],
    )
    if scenario["succeeds"]:
        assert code == 0, without_progress(log)[-8000:]
    else:
        _failed_not_timed_out(code, log)
    return code, reports, log


def scenario(name):
    """The test reads the launch `SCENARIOS[name]` (`fault_run`)."""
    return pytest.mark.parametrize("fault_run", [name], indirect=True)


# ------------------------------------------- async: killed, restarted, rejoined


@pytest.mark.xdist_group("async_restart")
@scenario("async_restart")
def test_async_survivor_finishes_and_keeps_every_update(fault_run):
    _, reports, log = fault_run
    assert set(reports) == {"0_start_1", "1_start_1", "1_start_2"}
    killed = reports["1_start_1"]
    assert killed["steps"] == 10
    chief, restarted = reports["0_start_1"], reports["1_start_2"]
    assert chief["failure"] is None and restarted["failure"] is None
    # Every step any process applied is in the shared counter on the ps: the
    # kill lost nothing, and nothing was counted twice.
    total = chief["steps"] + killed["steps"] + restarted["steps"]
    last = max(chief["counter"], restarted["counter"])
    assert last == total, (last, chief, killed, restarted)
    assert "[launch] worker:1 exited with SIGKILL (exit code 137); restarting it" in log


@pytest.mark.xdist_group("async_restart")
@scenario("async_restart")
def test_async_chief_reports_the_lost_worker_and_its_return(fault_run):
    _, _, log = fault_run
    chief = "\n".join(
        line for line in log.splitlines() if line.startswith("[worker:0]")
    )
    assert "worker:1 is lost (no heartbeat for" in chief
    assert "worker:1 is back (its heartbeat resumed)" in chief


@pytest.mark.xdist_group("async_restart")
@scenario("async_restart")
def test_async_restarted_worker_reads_the_current_variables(fault_run):
    _, reports, _ = fault_run
    chief, restarted = reports["0_start_1"], reports["1_start_2"]
    # It joined a run in progress: the ps held at least the chief's 30 steps
    # and the killed start's 10, and weights trained that far, not the
    # initial ones the chief read at the start.
    assert restarted["initial"]["counter"] >= 30 + 10
    assert restarted["initial"]["checksum"] != pytest.approx(
        chief["initial"]["checksum"], rel=1e-6
    )
    assert restarted["steps"] > 0


# ------------------------- sync replicas, one backup: lost, run goes on, back


@pytest.mark.xdist_group("sync_backup")
@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 120)
@scenario("sync_backup")
def test_sync_goes_on_without_a_lost_backup_worker(fault_run):
    _, reports, log = fault_run
    assert set(reports) == {"0_start_1", "1_start_1", "2_start_1", "2_start_2"}
    chief = reports["0_start_1"]
    assert chief["failure"] is None and reports["1_start_1"]["failure"] is None
    assert reports["2_start_1"]["steps"] == 10
    # Updates went on while worker 2 was down: the chief reached its barrier
    # (step 25) only once worker 2 had been found lost.
    assert (
        "worker:2 is lost (no heartbeat); updates go on with worker:0, worker:1" in log
    )
    assert chief["counts"]["global_step"] >= chief["steps"] // 2


@pytest.mark.xdist_group("sync_backup")
@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 120)
@scenario("sync_backup")
def test_sync_restarted_worker_rejoins_and_counts_again(fault_run):
    _, reports, log = fault_run
    assert "worker:2 is back and sends gradients again" in log
    chief = reports["0_start_1"]
    applied_by_2 = chief["counts"]["applied"][2]
    # Its gradients were applied after the restart too, and every gradient
    # any start of worker 2 sent is accounted for.
    # (A restarted start that trains on when the chief finishes stops at its
    # next step; a step its watchdog caught first sends nothing.)
    restarted = reports["2_start_2"]
    sent_by_2 = (
        reports["2_start_1"]["steps"] + restarted["steps"] - restarted["steps_skipped"]
    )
    counted = sum(
        chief["counts"][k][2] for k in ("applied", "dropped_stale", "dropped_at_end")
    )
    assert applied_by_2 > 0
    assert sent_by_2 - 1 <= counted <= sent_by_2
    assert chief["lost"] == []  # back, so no longer lost


# ------------------------- sync replicas, no backup: a clear error, no hang


@pytest.mark.xdist_group("sync_no_backup")
@scenario("sync_no_backup")
def test_sync_without_backup_stops_with_an_error_naming_the_lost_worker(fault_run):
    _, reports, _ = fault_run  # an error, not a timeout (`fault_run`)
    chief = reports["0_start_1"]
    assert chief["failure"].startswith("WorkerLostError: worker:1 was lost"), chief
    assert "replicas_to_aggregate=2" in chief["failure"]
    assert "--max-restarts" in chief["failure"]  # and how to fix it
    assert chief["steps"] >= 10


# ------------------------------- sync replicas, the chief frozen: no hang


@scenario("sync_frozen_chief")
def test_sync_workers_stop_with_an_error_naming_a_frozen_chief(fault_run):
    _, reports, log = fault_run  # an error, not a timeout (`fault_run`)
    failure = reports["1_start_1"]["failure"] or ""
    assert failure.startswith("StalledError: worker:1: the chief (worker:0) is lost"), (
        without_progress(log)[-6000:]
    )
    assert "heartbeat_timeout=3" in failure and "BackupAndRestore" in failure
    # The frozen chief is continued after its SIGTERM, so it ends then, not
    # at the SIGKILL after the grace period.
    assert "still running" not in log, without_progress(log)[-6000:]


# ---------------------------- a ps task killed: every process names it, exits


@pytest.mark.parametrize("strategy", ["async", "sync"])
def test_a_killed_ps_stops_every_worker_with_an_error_naming_it(tmp_path, strategy):
    config = {"strategy": strategy, "lose_ps_at_step": 5, "epochs": 50}
    code, log, reports = ps_loss_job.launch_and_kill_ps(
        tmp_path,
        config,
        "ps:1",
        timeout_s=LAUNCH_TIMEOUT_S,
        num_ps=2,
        num_workers=2,
        mode="between-graph",
    )
    assert code == 1, without_progress(log)[-6000:]
    assert "[launch] ps:1 (server) exited with SIGKILL" in log
    # Each worker stopped by itself, within the launcher's grace period, with
    # an error that names the lost task, where it was, and what to do: its
    # `fit` raised it, or (when TensorFlow waited on the dead task without
    # failing) the server watch printed it and ended the process.
    for i in (0, 1):
        report = reports.get(f"worker_{i}")
        if report is not None:  # its `fit` raised
            error = report["failure"]
            assert error.startswith(
                f"TaskLostError: worker:{i}: lost ps:1 at 127.0.0.1:"
            )
        else:  # the watch ended it, after printing the error
            printed = f"[worker:{i}] keras_psdist: worker:{i}: lost ps:1 at 127.0.0.1:"
            (error,) = [line for line in log.splitlines() if line.startswith(printed)]
        assert "BackupAndRestore" in error, (i, without_progress(log)[-6000:])


@pytest.fixture(scope="module")
def ps_loss_and_resume(tmp_path_factory):
    """In-graph: ps:0 killed after epoch 2 was backed up; the whole cluster
    restarted with the same BackupAndRestore directory."""
    first = tmp_path_factory.mktemp("ps_loss_first")
    second = tmp_path_factory.mktemp("ps_loss_resumed")
    backup_dir = tmp_path_factory.mktemp("ps_loss_backup")
    config = {
        "strategy": "in-graph",
        "epochs": 4,
        "backup_dir": str(backup_dir),
        "lose_ps_after_epoch": 2,
    }
    kwargs = {"num_ps": 2, "num_workers": 2, "mode": "in-graph"}
    code, log, reports = ps_loss_job.launch_and_kill_ps(
        first, config, "ps:0", timeout_s=LAUNCH_TIMEOUT_S, **kwargs
    )
    assert code != 0, without_progress(log)[-6000:]
    # The backup the restart resumes from (BackupAndRestore deletes it once
    # a fit completes).
    saved = {p.name: p.read_bytes() for p in backup_dir.iterdir() if p.is_file()}
    config = {**config, "seed": 1}
    del config["lose_ps_after_epoch"]
    resumed, _ = launching.launch_job(
        PS_LOSS_JOB, [second, json.dumps(config)], timeout_s=LAUNCH_TIMEOUT_S, **kwargs
    )
    return first, second, reports, log, saved, resumed


@pytest.mark.xdist_group("ps_loss_and_resume")
def test_in_graph_chief_names_the_killed_ps(ps_loss_and_resume):
    _, _, reports, log, _, _ = ps_loss_and_resume
    failure = reports["chief_0"]["failure"] or ""
    assert failure.startswith("TaskLostError: chief:0: lost ps:0 at 127.0.0.1:"), (
        without_progress(log)[-6000:]
    )
    assert "[launch] ps:0 (server) exited with SIGKILL" in log


@pytest.mark.xdist_group("ps_loss_and_resume")
def test_restarted_cluster_resumes_from_the_backup(ps_loss_and_resume):
    first, second, _, _, saved, resumed = ps_loss_and_resume
    assert resumed == 0
    assert json.loads(saved["training_metadata.json"])["epoch"] == 2
    # The backup holds the weights and optimizer state at the end of epoch 2...
    at_epoch_end = np.load(first / "at_epoch_end.npz")
    from_file = ps_loss_job.state_in_weights_file(saved["latest.weights.h5"], first)
    assert len(from_file) == len(at_epoch_end.files)
    for i, value in enumerate(from_file):
        np.testing.assert_array_equal(value, at_epoch_end[f"arr_{i}"])
    # ...and the restarted run (other initial weights: seed 1) began from
    # exactly that, at epoch 2 (0-based), and trained the remaining epochs.
    restored = np.load(second / "restored.npz")
    for i, value in enumerate(from_file):
        np.testing.assert_array_equal(restored[f"arr_{i}"], value)
    assert json.loads((second / "epochs.json").read_text()) == [2, 3]


# --------------------------------------- killed while writing a checkpoint


def test_killed_during_a_checkpoint_write_leaves_the_previous_one(tmp_path):
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    env.pop("TF_CONFIG", None)
    with open(tmp_path / "log.txt", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(CHECKPOINT_KILL_JOB), str(tmp_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "writing").exists():
            assert proc.poll() is None, (tmp_path / "log.txt").read_text()[-4000:]
            assert time.monotonic() < deadline, "the second write never started"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    # The write was cut short: its temporary file is there, half written...
    partial = [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]
    assert len(partial) == 1 and partial[0].endswith("ckpt.weights.h5"), partial
    # ...and the checkpoint is the first epoch's, whole: it loads (without
    # the strategy) and holds exactly the weights after that epoch.
    import digits_job

    model = digits_job.build(tf_default_strategy())
    model.load_weights(tmp_path / "ckpt.weights.h5")
    expected = np.load(tmp_path / "epoch_0.npz")
    for i, weight in enumerate(model.get_weights()):
        np.testing.assert_array_equal(weight, expected[f"arr_{i}"])


def tf_default_strategy():
    import tensorflow as tf

    return tf.distribute.get_strategy()
