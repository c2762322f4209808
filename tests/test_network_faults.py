"""Network faults on the multi-host test bed: links cut, restored, flapping.

Every task runs on a host of its own (a network namespace,
`launching.cluster_hosts`); a cut takes the bridge side of a host's link
down, so its packets vanish without a reset, as when a cable is pulled. The
job (`tests/cluster_jobs/net_fault_job.py`, or `ps_loss_job.py` for the
in-graph ps cut) runs under `keras_psdist.cluster.launch` in a background
thread; the test times its cuts by what the processes write (their steps)
and say (their log lines), and ends the run through a file. Each launch
covers several faults in turn: three launches by default, a fourth (the
relaunch after a ps cut) in the slow run. See docs/reliability.md (the
fault table's network rows) for what these tests show, and
`keras_psdist.cluster.task_loss` for how a process tells a dead task, a
cut-off host and its own cut link apart.

The figures each run measured (seconds from a cut to what it caused, read
off the launch's own log) are printed: `pytest -s` shows them.
"""

import contextlib
import json
import re
import time
from pathlib import Path

import launching  # tests/cluster_jobs, see conftest.py
import net_fault_job
import numpy as np
import ps_loss_job
import pytest
from launching import without_progress

from keras_psdist.cluster import task_loss

pytestmark = [pytest.mark.multiprocess, pytest.mark.hosts, pytest.mark.waits]

JOB = Path(__file__).parent / "cluster_jobs" / "net_fault_job.py"
PS_LOSS_JOB = Path(__file__).parent / "cluster_jobs" / "ps_loss_job.py"
LAUNCH_TIMEOUT_S = 540
# A flap: the link is down this long, then up again.
FLAP_S = 2.0
PROBE_TIMEOUT_S = task_loss.PROBE_TIMEOUT_S


def _print_timings(name, timings):
    print(f"\n{name}: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))


@contextlib.contextmanager
def _hosts(num_ps, num_workers, chief=False):
    """`launching.cluster_hosts`; a cut needs hosts of their own, so the
    loopback fallback skips these tests."""
    with launching.cluster_hosts(num_ps, num_workers, chief) as (hosts, task_hosts):
        if hosts is None:
            pytest.skip(
                f"network faults need hosts of their own; {launching.HOSTS_ENV} "
                "asks for loopback"
            )
        yield hosts, task_hosts


@contextlib.contextmanager
def _explained(hosts):
    """A failed wait says, besides the log, what the hosts' network looks
    like (neighbours, sockets): a host that cannot reach another shows."""
    try:
        yield
    except AssertionError as e:
        raise AssertionError(
            f"{e}\n\nThe network then:\n{hosts.network_state()}"
        ) from None


def _worker_lines(log, task):
    return [line for line in log.splitlines() if line.startswith(f"[{task}]")]


# ------------- async: a flapping ps link, a worker cut off briefly, then long


@pytest.fixture(scope="module")
def async_run(tmp_path_factory):
    """`PSStrategy(mode="between-graph")`, 1 ps and 2 workers, each on its
    own host, `heartbeat_timeout=6`, `--max-restarts 1`. In turn: the ps's
    link flaps (down 2 s); worker:1 is cut off until its watch has found
    itself cut off, then restored; worker:1 is cut off until it exits, then
    restored (the launcher restarts it); the run is ended."""
    out = tmp_path_factory.mktemp("async_net")
    config = {"strategy": "async", "heartbeat_timeout": 6}
    timings = {}
    with _hosts(1, 2) as (hosts, task_hosts):
        run = net_fault_job.Launch(
            JOB,
            out,
            [out, json.dumps(config)],
            num_ps=1,
            num_workers=2,
            mode="between-graph",
            hosts=task_hosts,
            max_restarts=1,
            timeout_s=LAUNCH_TIMEOUT_S,
        )
        with _explained(hosts):
            code, steps_before = _async_faults(run, hosts, timings)
    _print_timings("async run", timings)
    return code, run, steps_before


def _flap_the_ps_link(run, hosts, workers, timings):
    """Takes ps0's link down for `FLAP_S`, then up; returns once every one
    of `workers` ("worker_0", ...) is 10 steps further and each worker's
    watch that found the ps silent during the flap has stood down.

    Standing down must come before the next cut: else that cut finds the
    watch still armed from the flap, and it exits at the flap's deadline (a
    look started in the flap ends by one probe timeout after it; training
    resumes sooner)."""
    flap_at = time.monotonic()
    hosts.cut("ps0")
    time.sleep(FLAP_S)
    hosts.restore("ps0")
    for task in workers:
        run.wait_steps(task, 10, "after the ps's link flapped")
    timings["ps flap: every worker 10 steps on after"] = time.monotonic() - flap_at
    time.sleep(max(0.0, flap_at + FLAP_S + PROBE_TIMEOUT_S + 1.0 - time.monotonic()))
    for task in (w.replace("_", ":") for w in workers):
        if run.line(rf"^\[{task}\] .*ps:0 .* does not answer", flap_at):
            at, _ = run.wait_line(
                rf"^\[{task}\] .*{task}: ps:0 answers again",
                f"{task}'s watch standing down after the flap",
                after=flap_at,
            )
            timings[f"ps flap: {task}'s watch stands down"] = at - flap_at


def _assert_the_flap_was_survived(log, workers):
    """No task was taken for dead, and what a worker's watch said if it
    looked during the flap: the ps does not answer while another task
    does; then that it answers again."""
    assert "lost ps:0" not in log and "TaskLostError" not in log
    for task in workers:
        lines = _worker_lines(log, task)
        said = [
            line
            for line in lines
            if "ps:0 at 10.231.0.2:2222 (timed out) does not answer" in line
        ]
        for line in said:
            assert re.search(
                r"while [a-z:0-9, ]+ answers?: its host is cut off", line
            ), line
        if said:
            assert any(f"{task}: ps:0 answers again" in line for line in lines)


def _async_faults(run, hosts, timings):
    """The async run's faults, in turn (see `async_run`)."""
    for task in ("worker_0", "worker_1"):
        run.wait_steps(task, 5, "at the start")

    # 1. The ps's link flaps: both workers go on.
    _flap_the_ps_link(run, hosts, ("worker_0", "worker_1"), timings)

    # 2. worker:1 cut off until its watch says so, then back: it goes on.
    cut_at = time.monotonic()
    hosts.cut("worker1")
    at, _ = run.wait_line(
        r"^\[worker:1\] .*worker:1 cannot reach any other task",
        "worker:1's watch finding itself cut off",
        after=cut_at,
    )
    timings["short cut: worker:1 finds itself cut off"] = at - cut_at
    # Meanwhile the chief trains on.
    run.wait_steps("worker_0", 10, "while worker:1 is cut off")
    restored_at = time.monotonic()
    hosts.restore("worker1")
    at, _ = run.wait_line(
        r"^\[worker:1\] .*worker:1: ps:0, worker:0 answer again",
        "worker:1's watch standing down",
        after=restored_at,
    )
    timings["short cut: restore -> worker:1's watch stands down"] = at - restored_at
    run.wait_steps("worker_1", 10, "after its link came back", start=1)
    timings["short cut: restore -> worker:1 10 steps on"] = (
        time.monotonic() - restored_at
    )

    # 3. worker:1 cut off for good: it exits, saying why; the launcher
    # restarts it, and once its link is back it rejoins.
    cut_at = time.monotonic()
    steps_before = run.steps("worker_1")[1]
    hosts.cut("worker1")
    run.wait_steps("worker_0", 10, "while worker:1 is cut off for good")
    at, _ = run.wait_line(
        r"^\[launch\] worker:1 exited with exit code 1; restarting it",
        "worker:1 exiting",
        after=cut_at,
    )
    timings["long cut: worker:1 exits"] = at - cut_at
    at, _ = run.line(r"^\[worker:1\] keras_psdist: worker:1 cannot reach", cut_at)
    timings["long cut: worker:1's error printed"] = at - cut_at
    restored_at = time.monotonic()
    hosts.restore("worker1")
    run.wait_steps("worker_1", 10, "after its restart", start=2)
    timings["long cut: restore -> restarted worker:1 10 steps on"] = (
        time.monotonic() - restored_at
    )
    code = run.stop()
    return code, steps_before


@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 120)
@pytest.mark.xdist_group("async_net")
def test_a_flapping_ps_link_does_not_end_the_run(async_run):
    code, run, _ = async_run
    log = run.log
    assert code == 0, without_progress(log)[-8000:]
    reports = run.reports()
    assert reports["worker_0_start_1"]["failure"] is None
    # No process ended but worker:1 at its long cut.
    assert log.count("[launch] worker:1 exited with") == 1
    assert "[launch] worker:0 exited with" not in log
    # Never taken for dead: a ps that does not answer is not "lost".
    _assert_the_flap_was_survived(log, ("worker:0", "worker:1"))


@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 120)
@pytest.mark.xdist_group("async_net")
def test_a_worker_cut_off_briefly_says_so_and_goes_on(async_run):
    code, run, _ = async_run
    lines = _worker_lines(run.log, "worker:1")
    (armed, *_) = [
        line for line in lines if "worker:1 cannot reach any other task" in line
    ]
    assert (
        "ps:0 at 10.231.0.2:2222 (timed out), worker:0 at 10.231.0.3:2222 "
        "(timed out) do not answer. This host's own network is probably down"
    ) in armed
    assert "the ps tasks and their variables are probably fine" in armed
    assert "ends in 6 s unless it stops first or they answer again" in armed
    assert any("worker:1: ps:0, worker:0 answer again" in line for line in lines)


@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 120)
@pytest.mark.xdist_group("async_net")
def test_a_worker_cut_off_for_good_exits_saying_why_and_rejoins_when_restarted(
    async_run,
):
    code, run, steps_before = async_run
    log = run.log
    assert code == 0, without_progress(log)[-8000:]
    # The watch printed the error and ended the process.
    printed = [
        line
        for line in _worker_lines(log, "worker:1")
        if line.startswith("[worker:1] keras_psdist: worker:1 cannot reach any other")
    ]
    assert len(printed) == 1, without_progress(log)[-8000:]
    assert "--max-restarts" in printed[0] and "probably fine" in printed[0]
    assert "restarting it (restart 1; --max-restarts allows 1)" in log
    reports = run.reports()
    restarted = reports["worker_1_start_2"]
    assert restarted["failure"] is None and restarted["steps"] >= 10
    # It opened the shared variables as they were: the steps both workers
    # had counted on the ps, not a fresh start.
    assert restarted["initial_counter"] >= steps_before
    # The chief trained on throughout, and saw worker:1 lost and back.
    chief = "\n".join(_worker_lines(log, "worker:0"))
    assert "worker:1 is lost (no heartbeat for" in chief
    assert "worker:1 is back (its heartbeat resumed)" in chief
    assert reports["worker_0_start_1"]["failure"] is None


# ---------------------- in-graph: a ps cut off, then the cluster relaunched


@pytest.fixture(scope="module")
def ps_cut_run(tmp_path_factory):
    """In-graph (`PSStrategy()`, `heartbeat_timeout=3`), 2 ps and 2 workers,
    each task on its own host: ps:0's link is cut after epoch 2 was backed
    up (`BackupAndRestore`), and stays cut. Yields with the hosts still up
    (the link restored), for a relaunch on them."""
    first = tmp_path_factory.mktemp("ps_cut_first")
    backup_dir = tmp_path_factory.mktemp("ps_cut_backup")
    config = {
        "strategy": "in-graph",
        "epochs": 4,
        "backup_dir": str(backup_dir),
        "lose_ps_after_epoch": 2,
    }
    kwargs = {"num_ps": 2, "num_workers": 2, "mode": "in-graph"}
    with _hosts(2, 2, chief=True) as (hosts, task_hosts):
        run = net_fault_job.Launch(
            PS_LOSS_JOB,
            first,
            [first, json.dumps(config)],
            hosts=task_hosts,
            timeout_s=LAUNCH_TIMEOUT_S,
            **kwargs,
        )
        with _explained(hosts):
            run.wait(
                lambda: (first / "kill_ps").exists(), "the chief asking for the cut"
            )
            cut_at = time.monotonic()
            hosts.cut("ps0")
            code = run.join(LAUNCH_TIMEOUT_S)
        timings = {}
        for what, pattern in (
            (
                "the chief's error",
                r"^\[chief:0\] (keras_psdist: chief:0: ps:0|.*Unreachable)",
            ),
            ("the chief exits", r"^\[launch\] chief:0 exited with"),
        ):
            found = run.line(pattern, cut_at)
            if found:
                timings[f"ps:0 cut -> {what}"] = found[0] - cut_at
        _print_timings("in-graph ps cut", timings)
        # The backup the relaunch resumes from (BackupAndRestore deletes it
        # once a fit completes).
        saved = {p.name: p.read_bytes() for p in backup_dir.iterdir() if p.is_file()}
        hosts.restore("ps0")
        yield {
            "first": first,
            "config": config,
            "kwargs": kwargs,
            "code": code,
            "run": run,
            "saved": saved,
            "task_hosts": task_hosts,
        }


@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 120)
@pytest.mark.xdist_group("ps_cut")
def test_a_cut_off_ps_stops_the_chief_with_an_error_saying_it_does_not_answer(
    ps_cut_run,
):
    run = ps_cut_run["run"]
    log = run.log
    assert ps_cut_run["code"] == 1, without_progress(log)[-8000:]
    expected = (
        "chief:0: ps:0 at 10.231.0.2:2222 (timed out) does not answer, while "
        "ps:1, worker:0, worker:1 answer: its host is cut off from the network, "
        "or down."
    )
    # Its `fit` raised it (TensorFlow's op failed), or the watch printed it
    # and ended the process (TensorFlow kept waiting): either way the error
    # says the ps does not answer, not that it died.
    report = ps_cut_run["first"] / "chief_0.json"
    if report.exists():  # its `fit` raised
        error = json.loads(report.read_text())["failure"]
        assert error.startswith(f"TaskUnreachableError: {expected}"), error
    else:
        (error,) = [
            line
            for line in log.splitlines()
            if line.startswith(f"[chief:0] keras_psdist: {expected}")
        ]
    assert "BackupAndRestore" in error and "its process may still be running" in error
    assert "lost ps:0" not in log
    # Within the documented bound: the watch gave the process its grace
    # (heartbeat_timeout=3), once.
    armed = [line for line in log.splitlines() if "This process ends in 3 s" in line]
    assert len(armed) == 1 and "or they answer again" in armed[0], armed


@pytest.mark.slow
@pytest.mark.timeout(2 * LAUNCH_TIMEOUT_S + 120)
@pytest.mark.xdist_group("ps_cut")
def test_after_the_link_is_back_the_relaunched_cluster_resumes_from_the_backup(
    ps_cut_run, tmp_path
):
    saved = ps_cut_run["saved"]
    assert json.loads(saved["training_metadata.json"])["epoch"] == 2
    config = {**ps_cut_run["config"], "seed": 1}
    del config["lose_ps_after_epoch"]
    started = time.monotonic()
    code, log = launching.launch_job(
        PS_LOSS_JOB,
        [tmp_path, json.dumps(config)],
        hosts=ps_cut_run["task_hosts"],
        timeout_s=LAUNCH_TIMEOUT_S,
        **ps_cut_run["kwargs"],
    )
    _print_timings("in-graph relaunch", {"launch": time.monotonic() - started})
    assert code == 0, without_progress(log)[-8000:]
    # The relaunch (other initial weights: seed 1) began from exactly what
    # the backup holds (the weights and optimizer state at the end of epoch
    # 2, as the first run held them), at epoch 2, and trained the rest.
    first = ps_cut_run["first"]
    at_epoch_end = np.load(first / "at_epoch_end.npz")
    from_file = ps_loss_job.state_in_weights_file(saved["latest.weights.h5"], tmp_path)
    restored = np.load(tmp_path / "restored.npz")
    assert len(from_file) == len(at_epoch_end.files)
    for i, value in enumerate(from_file):
        np.testing.assert_array_equal(value, at_epoch_end[f"arr_{i}"])
        np.testing.assert_array_equal(restored[f"arr_{i}"], value)
    assert json.loads((tmp_path / "epochs.json").read_text()) == [2, 3]


# ------------------- sync replicas: the chief cut off, every process stops


@pytest.fixture(scope="module")
def sync_chief_cut_run(tmp_path_factory):
    """`SyncReplicaStrategy` (every worker's gradient in each update), 1 ps
    and 3 workers, each on its own host. In turn: the ps's link flaps (down
    2 s); then the chief's (worker:0's) link is cut and stays cut.

    The launcher stops every task when the chief exits, which a cluster
    without it (each machine on its own) would not do; so that the test sees
    what each process does by itself, the workers are let go
    (`max_worker_failures=2`) and the chief is given the longer grace
    (`heartbeat_timeout` 24 s against the workers' 4 s): its own exit comes
    after theirs. (With 12 s, a worker whose fit had already raised its
    `StalledError` was once still tearing down when the chief exited, in a
    full suite on 2 busy cores.)"""
    out = tmp_path_factory.mktemp("sync_chief_cut")
    config = {"strategy": "sync", "heartbeat_timeout": 4, "chief_heartbeat_timeout": 24}
    workers = ("worker_0", "worker_1", "worker_2")
    timings = {}
    with _hosts(1, 3) as (hosts, task_hosts):
        run = net_fault_job.Launch(
            JOB,
            out,
            [out, json.dumps(config)],
            num_ps=1,
            num_workers=3,
            mode="between-graph",
            hosts=task_hosts,
            max_worker_failures=2,
            timeout_s=LAUNCH_TIMEOUT_S,
        )
        with _explained(hosts):
            for task in workers:
                run.wait_steps(task, 5, "at the start")
            # First the ps's link flaps: every worker goes on.
            _flap_the_ps_link(run, hosts, workers, timings)
            cut_at = time.monotonic()
            hosts.cut("worker0")
            code = run.join(LAUNCH_TIMEOUT_S)
    for task in ("worker:1", "worker:2"):
        found = run.line(rf"^\[{task}\] .*the chief \(worker:0\) is lost", cut_at)
        if found:
            timings[f"chief cut -> {task}'s error"] = found[0] - cut_at
    for what, pattern in (
        ("the chief's error", r"^\[worker:0\] keras_psdist: worker:0 cannot reach"),
        ("the chief exits", r"^\[launch\] worker:0 exited with"),
    ):
        found = run.line(pattern, cut_at)
        if found:
            timings[f"chief cut -> {what}"] = found[0] - cut_at
    _print_timings("sync chief cut", timings)
    return code, run


@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 120)
@pytest.mark.xdist_group("sync_chief_cut")
def test_a_flapping_ps_link_does_not_end_a_sync_run(sync_chief_cut_run):
    """Every update waits for every worker's gradient, through the chief's
    queues on the ps: a 2 s flap stalls each update and ends none."""
    _, run = sync_chief_cut_run
    log = run.log
    # The one error of the run is the chief's cut, after the flap (and its
    # `StalledError`s): no process ended before it, nobody was taken for lost.
    _assert_the_flap_was_survived(log, ("worker:0", "worker:1", "worker:2"))
    assert "WorkerLostError" not in log
    reports = run.reports()
    assert all(f"worker_{i}_start_2" not in reports for i in range(3)), sorted(reports)


@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 120)
@pytest.mark.xdist_group("sync_chief_cut")
def test_sync_workers_stop_naming_the_unreachable_chief_and_every_process_exits(
    sync_chief_cut_run,
):
    code, run = sync_chief_cut_run
    log = run.log
    assert code == 1, without_progress(log)[-8000:]  # an error, not a hang (124)
    reports = run.reports()
    for i in (1, 2):
        failure = reports[f"worker_{i}_start_1"]["failure"] or ""
        assert failure.startswith(
            f"StalledError: worker:{i}: the chief (worker:0) is lost: no heartbeat for"
        ), without_progress(log)[-8000:]
        assert (
            "Its host does not answer at 10.231.0.3:2222 (timed out): it is cut "
            "off from the network, or down."
        ) in failure
        assert "BackupAndRestore" in failure
        assert f"[launch] worker:{i} exited with exit code 1; lost it" in log
    # The chief, cut off, says that it is, and that it is the chief.
    (printed,) = [
        line
        for line in log.splitlines()
        if line.startswith("[worker:0] keras_psdist: worker:0 cannot reach any other")
    ]
    assert "ps:0 at 10.231.0.2:2222 (timed out)" in printed
    assert "This process is the chief" in printed
    assert "[launch] worker:0 exited with exit code 1; stopping every task." in log
    # Every process ended by itself or at the launcher's SIGTERM.
    assert "still running" not in log
