"""Tests for `keras-psdist launch` and `keras-psdist serve` (real processes).

The training scripts (`tests/scripts/fake_trainer.py`) do not import
TensorFlow, so they start at once; the servers do (a few seconds each).
Every test checks that nothing it started is left running, and kills what is
left if it fails.
"""

import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import launching  # tests/cluster_jobs, see conftest.py
import pytest
import zygote
from launching import PID_LINE

import keras_psdist as kpd
from keras_psdist.cluster import config as cluster_config
from keras_psdist.cluster.launcher import launch
from keras_psdist.cluster.launcher import run as launcher_lib

pytestmark = pytest.mark.multiprocess

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE_TRAINER = os.path.join(REPO_ROOT, "tests", "scripts", "fake_trainer.py")
FAKE_SERVER = os.path.join(REPO_ROOT, "tests", "scripts", "fake_server.py")
SERVE_RACE = os.path.join(REPO_ROOT, "tests", "scripts", "serve_race.py")
# `serve_race.py`'s exit code when gdb may not attach (no ptrace permission).
SERVE_RACE_CANNOT_ATTACH = 3


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p
    )
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not count)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] not in (b"Z", b"X")


def _wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


class _Lines:
    """A text stream that keeps whole lines and can react to each one."""

    def __init__(self, on_line=None):
        self.lines: list[str] = []
        self._partial = ""
        self._on_line = on_line

    def write(self, text: str) -> int:
        self._partial += text
        *complete, self._partial = self._partial.split("\n")
        for line in complete:
            self.lines.append(line)
            if self._on_line is not None:
                self._on_line(line)
        return len(text)

    def flush(self) -> None:
        pass

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def prefixed(self, task: str) -> list[str]:
        prefix = f"[{task}] "
        return [line[len(prefix) :] for line in self.lines if line.startswith(prefix)]


class _Processes:
    """Pids a test saw; whatever still runs at the end is killed."""

    def __init__(self):
        self.pids: set[int] = set()
        self.groups: set[int] = set()
        # Whether the test zygote's forks served (`_launch`): none may be
        # left either.
        self.forked = False

    def add_from_output(self, text: str) -> None:
        for line in text.splitlines():
            match = PID_LINE.match(line)
            if match:
                self.pids.add(int(match.group(2)))

    def add_from_reports(self, report_dir) -> dict[str, dict]:
        reports = {}
        for path in report_dir.glob("*.json"):
            report = json.loads(path.read_text())
            reports[path.stem] = report
            self.pids.add(report["pid"])
            if report["grandchild"]:
                self.pids.add(report["grandchild"])
        return reports

    def assert_all_gone(self) -> None:
        assert self.pids, "no process ids were collected"
        # Teardown waits for every process; the grace here only absorbs
        # the kernel's bookkeeping.
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and self._left():
            time.sleep(0.05)
        left = self._left()
        assert not left, f"processes left running: {left}"

    def _seen(self) -> set[int]:
        """The pids seen, and the zygote's forks when they served."""
        return self.pids | (zygote.forks() if self.forked else set())

    def _left(self) -> list[int]:
        return sorted(p for p in self._seen() if _alive(p))

    def kill_all(self) -> None:
        for group in self.groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in self._seen():
            if _alive(pid):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


@pytest.fixture
def processes():
    tracked = _Processes()
    try:
        yield tracked
    finally:
        tracked.kill_all()


def _launch(tmp_path, processes, action, out=None, **kwargs) -> tuple[int, _Lines]:
    """Launches the fake trainer (a plain interpreter: the launcher's own
    process handling is what is tested); its ps servers are forks of the
    test zygote (`launching.servers_from_zygote`: not one TensorFlow import
    each), which `assert_all_gone` then sees gone as well."""
    out = _Lines() if out is None else out
    report_dir = tmp_path / "reports"
    report_dir.mkdir(exist_ok=True)
    try:
        with launching.servers_from_zygote():
            processes.forked = zygote.enabled()
            code = launch(
                [sys.executable, FAKE_TRAINER, action, str(report_dir)],
                out=out,
                **kwargs,
            )
    finally:
        processes.add_from_output(out.text)
        processes.add_from_reports(report_dir)
    return code, out


def test_in_graph_runs_the_command_once_as_chief(tmp_path, processes):
    code, out = _launch(tmp_path, processes, "ok", num_ps=1, num_workers=1)
    assert code == 0, out.text
    chief = out.prefixed("chief:0")
    assert "started" in chief, out.text
    assert any("ps:0 listening on 127.0.0.1:" in line for line in out.prefixed("ps:0"))
    assert any("worker:0 listening" in line for line in out.prefixed("worker:0"))
    # What the open ports allow (docs/security.md), said once for the launch,
    # naming every server's port, not once per server.
    notes = [line for line in out.lines if "unauthenticated connections" in line]
    assert len(notes) == 1 and notes[0].startswith("[launch] note: "), out.text
    ports = re.findall(r"listening on 127\.0\.0\.1:(\d+)", out.text)
    assert len(ports) == 2 and all(port in notes[0] for port in ports), out.text
    assert any("stopping ps:0" in line for line in out.prefixed("ps:0")), out.text
    (tf_config,) = [line for line in chief if line.startswith("TF_CONFIG=")]
    config = cluster_config.from_tf_config(tf_config[len("TF_CONFIG=") :])
    assert (config.task_type, config.task_id) == ("chief", 0)
    assert set(config.jobs) == {"chief", "ps", "worker"}
    assert (config.num_ps, config.num_workers) == (1, 1)
    assert len(processes.add_from_reports(tmp_path / "reports")) == 1
    processes.assert_all_gone()


def test_between_graph_runs_the_command_once_per_worker(tmp_path, processes):
    # Off the main thread, where `launch` cannot install signal handlers.
    result = {}

    def run():
        result["code"], result["out"] = _launch(
            tmp_path, processes, "ok", num_ps=1, num_workers=2, mode="between-graph"
        )

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive()
    code, out = result["code"], result["out"]
    assert code == 0, out.text
    reports = processes.add_from_reports(tmp_path / "reports")
    assert sorted(reports) == ["worker:0", "worker:1"]
    for name, report in reports.items():
        config = cluster_config.from_tf_config(report["tf_config"])
        assert config.task_name == name
        assert set(config.jobs) == {"ps", "worker"}
        assert "started" in out.prefixed(name)
    assert not out.prefixed("chief:0")
    # Only the ps task runs a server.
    assert not any("listening" in line for line in out.prefixed("worker:0"))
    (port,) = re.findall(r"ps:0 listening on 127\.0\.0\.1:(\d+)", out.text)
    assert (
        f"unauthenticated connections on port {port} of every interface of this "
        "machine; keep it on a private network" in "\n".join(out.prefixed("launch"))
    ), out.text
    processes.assert_all_gone()


def test_the_evaluator_runs_beside_training_and_ends_after_it(tmp_path, processes):
    """`evaluator=True`: one more process (task evaluator:0, outside the
    training cluster, on idle CPU time only) that the launcher tells, once every
    training process has exited 0, that training has ended."""
    code, out = _launch(
        tmp_path,
        processes,
        "ok",
        num_ps=1,
        num_workers=2,
        mode="between-graph",
        evaluator=True,
    )
    assert code == 0, out.text
    reports = processes.add_from_reports(tmp_path / "reports")
    assert sorted(reports) == ["evaluator:0", "worker:0", "worker:1"]
    evaluator = reports["evaluator:0"]
    config = cluster_config.from_tf_config(evaluator["tf_config"])
    assert config.is_evaluator and set(config.jobs) == {"ps", "worker"}
    assert evaluator["scheduler"] == os.SCHED_IDLE
    assert evaluator["stopped_by_the_launcher"]
    assert evaluator["workers_done"] == ["worker:0.json", "worker:1.json"]
    launch_lines = "\n".join(out.prefixed("launch"))
    assert "told evaluator:0 that training has ended" in launch_lines, out.text
    assert "evaluator:0 finished (exit code 0)" in launch_lines, out.text
    processes.assert_all_gone()


def test_an_evaluator_failure_does_not_stop_training(tmp_path, processes):
    code, out = _launch(
        tmp_path,
        processes,
        "evaluator_fails",
        num_ps=1,
        num_workers=2,
        mode="between-graph",
        evaluator=True,
    )
    # Training finished (the workers went on for 2 s after the evaluator
    # failed); the launch's exit code is then the evaluator's.
    assert code == 5, out.text
    reports = processes.add_from_reports(tmp_path / "reports")
    assert sorted(reports) == ["worker:0", "worker:1"]
    assert (
        "[launch] evaluator:0 exited with exit code 5; training goes on without it"
        in out.text
    ), out.text
    assert "worker:0, worker:1 finished (exit code 0)" in out.text, out.text
    processes.assert_all_gone()


def _whole(line: str) -> str:
    """A pattern for a launch line: exactly `line`."""
    return re.escape(line)


def _starting(prefix: str) -> str:
    """A pattern for a launch line that starts with `prefix`."""
    return re.escape(prefix) + ".*"


def _containing(part: str) -> str:
    """A pattern for a launch line that contains `part`."""
    return ".*" + re.escape(part) + ".*"


@dataclasses.dataclass(frozen=True)
class WorkerFailure:
    """A between-graph launch (1 ps) of the fake trainer in which a worker
    fails, and what the launcher does about it under its failure policy."""

    action: str  # fake_trainer.py's ACTION
    num_workers: int
    code: int  # the launch's exit code
    policy: dict = dataclasses.field(default_factory=dict)  # launch's kwargs
    launch_says: tuple[str, ...] = ()  # patterns, each matching a launch line
    launch_ends: str | None = None  # a pattern of the last launch line
    worker_1_first: str | None = None  # worker:1's first line
    worker_1_says: tuple[str, ...] = ()  # lines among worker:1's
    grandchild_of: str | None = None  # a task still running with a grandchild
    writes: tuple[str, ...] = ()  # files the trainers leave in their folder


WORKER_FAILURES = {
    "failing_worker_stops_everything_with_its_exit_code": WorkerFailure(
        "fail_worker_1",
        num_workers=2,
        code=3,
        launch_says=(_containing("worker:1 exited with exit code 3"),),
        worker_1_says=("failing on purpose",),
        # worker:0 was still running, with a grandchild, when worker:1 failed.
        grandchild_of="worker:0",
    ),
    "a_failed_worker_is_restarted_and_the_run_goes_on": WorkerFailure(
        "flaky_worker_1",
        num_workers=3,
        code=0,
        policy={"max_restarts": 1, "timeout_s": 120},
        launch_says=(
            _whole(
                "worker:1 exited with exit code 3; restarting it (restart 1; "
                "--max-restarts allows 1)."
            ),
        ),
        worker_1_first="worker:1 start 1",
        worker_1_says=("worker:1 start 2",),
        writes=("recovered",),
    ),
    "a_lost_worker_is_tolerated_and_reported": WorkerFailure(
        "lose_worker_1",
        num_workers=3,
        code=0,
        policy={"max_worker_failures": 1, "timeout_s": 120},
        launch_says=(
            _whole(
                "worker:1 exited with exit code 3; lost it and going on without it "
                "(1 lost; --max-worker-failures allows 1)."
            ),
        ),
        launch_ends=_starting(
            "worker:0, worker:2 finished (exit code 0); lost: worker:1 (exit code 3)"
        ),
    ),
    "restarts_run_out_then_the_failure_stops_everything": WorkerFailure(
        "lose_worker_1",
        num_workers=2,
        code=3,
        policy={"max_restarts": 1, "timeout_s": 120},
        launch_ends=_whole("worker:1 exited with exit code 3; stopping every task."),
        worker_1_says=("worker:1 start 2",),
    ),
    "the_chief_is_never_tolerated_to_fail": WorkerFailure(
        "fail_worker_0",
        num_workers=2,
        code=3,
        policy={"max_restarts": 1, "max_worker_failures": 1, "timeout_s": 120},
        launch_ends=_whole("worker:0 exited with exit code 3; stopping every task."),
    ),
}


@pytest.mark.parametrize("case", WORKER_FAILURES.values(), ids=WORKER_FAILURES.keys())
def test_a_worker_failure_under_each_policy(tmp_path, processes, case):
    code, out = _launch(
        tmp_path,
        processes,
        case.action,
        num_ps=1,
        num_workers=case.num_workers,
        mode="between-graph",
        **case.policy,
    )
    assert code == case.code, out.text
    launch_lines = out.prefixed("launch")
    for pattern in case.launch_says:
        assert any(re.fullmatch(pattern, line) for line in launch_lines), (
            pattern,
            out.text,
        )
    if case.launch_ends is not None:
        assert re.fullmatch(case.launch_ends, launch_lines[-1]), launch_lines[-1]
    worker_1 = out.prefixed("worker:1")
    if case.worker_1_first is not None:
        assert worker_1[:1] == [case.worker_1_first], out.text
    for line in case.worker_1_says:
        assert line in worker_1, out.text
    report_dir = tmp_path / "reports"
    reports = processes.add_from_reports(report_dir)
    if case.grandchild_of is not None:
        assert reports[case.grandchild_of]["grandchild"]
    for name in case.writes:
        assert (report_dir / name).exists()
    # Every start of a restarted worker, to check that none is left running.
    for starts in report_dir.glob("starts_*"):
        processes.pids.update(int(p) for p in starts.read_text().split())
    processes.assert_all_gone()


def test_timeout_kills_even_what_ignores_sigterm(tmp_path, processes, monkeypatch):
    monkeypatch.setattr(launcher_lib, "GRACE_S", 1.0)
    code, out = _launch(
        tmp_path,
        processes,
        "hang_ignore_term",
        num_ps=1,
        num_workers=1,
        mode="between-graph",
        timeout_s=3,
    )
    assert code == 124, out.text
    launch_lines = "\n".join(out.prefixed("launch"))
    assert "timed out after 3 s" in launch_lines
    assert "worker:0 still running 1 s after SIGTERM; sending SIGKILL" in launch_lines
    processes.assert_all_gone()


@pytest.mark.parametrize("worker_dies_too", [False, True], ids=["alone", "with_worker"])
def test_server_death_during_training_stops_everything(
    tmp_path, processes, monkeypatch, worker_dies_too
):
    # alone: the hanging trainer never stops on its own; it is stopped after
    # the grace period the training processes get to report the lost server.
    # with_worker: the worker dies of the lost ps before the launcher looks;
    # the launcher names the cause (the ps), not the worker's exit.
    monkeypatch.setattr(launcher_lib, "SERVER_LOSS_GRACE_S", 1.0)
    pids: dict[str, int] = {}

    def kill_ps_once_training_runs(line: str) -> None:
        match = PID_LINE.match(line)
        if match:
            pids[match.group(1)] = int(match.group(2))
        if line == "[worker:0] started":
            os.kill(pids["ps:0"], signal.SIGKILL)
            if worker_dies_too:
                # SIGKILL returns before the process is gone: the worker
                # dies once the ps has, as a worker failing on it does.
                _wait_until_dead(pids["ps:0"])
                os.kill(pids["worker:0"], signal.SIGKILL)

    code, out = _launch(
        tmp_path,
        processes,
        "hang",
        out=_Lines(kill_ps_once_training_runs),
        num_ps=1,
        num_workers=1,
        mode="between-graph",
    )
    assert code == 1, out.text
    launch_lines = "\n".join(out.prefixed("launch"))
    assert (
        "ps:0 (server) exited with SIGKILL (exit code 137) while training ran; "
        "waiting up to 1 s for the training processes to stop." in launch_lines
    ), out.text
    assert (
        "ps:0 (server) exited with SIGKILL (exit code 137) while training ran; "
        "stopping every task." in launch_lines
    ), out.text
    assert "worker:0 exited" not in launch_lines, out.text
    processes.assert_all_gone()


def _wait_until_dead(pid: int, timeout_s: float = 10.0) -> None:
    """Until `pid` can be reaped: a zombie whose every thread has exited
    (the main thread's zombie comes first), or gone."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            threads = len(os.listdir(f"/proc/{pid}/task"))
        except FileNotFoundError:
            return
        if state in ("Z", "X") and threads <= 1:
            return
        time.sleep(0.001)
    raise AssertionError(f"pid {pid} still alive {timeout_s} s after SIGKILL")


@pytest.mark.parametrize("races", [1, 3])
def test_port_taken_before_the_server_binds_it(tmp_path, processes, monkeypatch, races):
    # The first `races` layouts give ps:0 a port another process holds; the
    # launcher retries with new ports up to 3 times. Fake servers (no
    # TensorFlow) keep this quick.
    monkeypatch.setattr(launcher_lib, "SERVER_COMMAND", (sys.executable, FAKE_SERVER))
    real_pick = launcher_lib.pick_free_ports
    layouts = []

    def pick_with_a_taken_port(n, host="127.0.0.1"):
        ports = real_pick(n, host)
        if n > 1:  # A cluster layout, not the check of `host`.
            layouts.append(ports)
            if len(layouts) <= races:
                ports[0] = taken
        return ports

    monkeypatch.setattr(launcher_lib, "pick_free_ports", pick_with_a_taken_port)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        code, out = _launch(
            tmp_path, processes, "ok", num_ps=1, num_workers=1, mode="between-graph"
        )
    launch_lines = "\n".join(out.prefixed("launch"))
    if races < launcher_lib.MAX_ATTEMPTS:
        assert code == 0, out.text
        assert (
            "ps:0 could not bind its port. Retrying with new ports (attempt 2 of 3)"
            in launch_lines
        )
        assert "started" in out.prefixed("worker:0")
    else:
        assert code == 1, out.text
        assert "Gave up after 3 attempts with new ports" in launch_lines
        assert not out.prefixed("worker:0")
    processes.assert_all_gone()


def test_a_command_that_does_not_exist_exits_127(tmp_path, processes, monkeypatch):
    monkeypatch.setattr(launcher_lib, "SERVER_COMMAND", (sys.executable, FAKE_SERVER))
    out = _Lines()
    code = launch(
        [str(tmp_path / "no-such-program")],
        num_ps=1,
        num_workers=1,
        mode="between-graph",
        out=out,
    )
    processes.add_from_output(out.text)
    assert code == 127, out.text
    assert "cannot start worker:0" in "\n".join(out.prefixed("launch"))
    processes.assert_all_gone()


@pytest.mark.parametrize(
    "command, kwargs, message",
    [
        (["python"], {"num_ps": 0}, "`num_ps` must be an integer >= 1"),
        (["python"], {"num_workers": 0}, "`num_workers` must be an integer >= 1"),
        ([], {}, "`command` is empty"),
        ("python x.py", {}, "Received the string 'python x.py'"),
        (["python"], {"mode": "ring"}, "Unknown mode 'ring'. Expected one of"),
        (
            ["python"],
            {"host": "10.255.255.1"},
            "Cannot open ports on host '10.255.255.1'",
        ),
        (
            ["python"],
            {"num_workers": 2, "max_restarts": -1},
            "`max_restarts` must be an integer >= 0",
        ),
        (
            ["python"],
            {"num_workers": 2, "max_worker_failures": 1},
            "applies to between-graph runs",
        ),
        (
            ["python"],
            {"num_workers": 2, "mode": "between-graph", "max_worker_failures": 2},
            "at most num_workers - 1 = 1",
        ),
        (
            ["python"],
            {"mode": "between-graph", "min_workers": 1},
            "min_workers` applies to a job whose workers join and leave",
        ),
        (
            ["python"],
            {
                "num_workers": 2,
                "mode": "between-graph",
                "max_workers": 4,
                "min_workers": 3,
            },
            r"from 1 \(the chief\) to the starting number of workers \(2\)",
        ),
        (
            ["python"],
            {
                "mode": "between-graph",
                "max_workers": 2,
                "host_discovery": "/no/such/discover.sh",
            },
            "host discovery script must be an executable file.*does not exist",
        ),
    ],
    ids=[
        "num_ps",
        "num_workers",
        "empty_command",
        "string_command",
        "mode",
        "host",
        "max_restarts",
        "max_worker_failures_in_graph",
        "max_worker_failures_all",
        "min_workers_without_max",
        "min_workers_above_start",
        "discovery_script_missing",
    ],
)
def test_invalid_arguments_fail_fast(command, kwargs, message):
    with pytest.raises(ValueError, match=message):
        launch(command, **{"num_ps": 1, "num_workers": 1, **kwargs})


def _start_cli(args, out_path, **env) -> subprocess.Popen:
    with open(out_path, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "keras_psdist", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=REPO_ROOT,
            env=_env(**env),
            start_new_session=True,
        )


def test_sigint_to_the_launcher_stops_everything(tmp_path, processes):
    report_dir = tmp_path / "reports"
    report_dir.mkdir()
    out_path = tmp_path / "launch.log"
    launcher = _start_cli(
        [
            *("launch", "--num-ps", "1", "--num-workers", "1"),
            *("--mode", "between-graph", "--"),
            *(sys.executable, FAKE_TRAINER, "hang", str(report_dir)),
        ],
        out_path,
    )
    processes.groups.add(launcher.pid)
    processes.pids.add(launcher.pid)
    try:
        _wait_until(
            lambda: (report_dir / "worker:0.json").exists(), 120, "training to start"
        )
        processes.add_from_output(out_path.read_text())
        processes.add_from_reports(report_dir)
        launcher.send_signal(signal.SIGINT)
        code = launcher.wait(timeout=60)
    finally:
        processes.add_from_output(out_path.read_text())
    output = out_path.read_text()
    assert code == 130, output
    assert "[launch] received SIGINT; stopping every task" in output
    assert len(processes.pids) >= 4, output  # launcher, ps, worker, grandchild
    processes.assert_all_gone()


def test_serve_rejects_bad_tf_config(tmp_path, processes):
    (port,) = kpd.cluster.pick_free_ports(1)
    cases = {
        "invalid_json": ("{oops", "TF_CONFIG is not valid JSON"),
        "bad_index": (
            json.dumps(
                {
                    "cluster": {"ps": [f"127.0.0.1:{port}"], "worker": ["h:2"]},
                    "task": {"type": "ps", "index": 4},
                }
            ),
            "Task index 4 (from TF_CONFIG) is out of range",
        ),
    }
    running = {}
    for name, (tf_config, _) in cases.items():
        env = {"TF_CONFIG": tf_config} if tf_config else {}
        running[name] = _start_cli(["serve"], tmp_path / f"{name}.log", **env)
        processes.pids.add(running[name].pid)
    for name, (_, expected) in cases.items():
        code = running[name].wait(timeout=120)
        output = (tmp_path / f"{name}.log").read_text()
        assert code == 2, output
        assert f"keras-psdist: error: {expected}" in output, output
        assert "Traceback" not in output
    processes.assert_all_gone()


def _ps_tf_config(port: int) -> str:
    (other,) = kpd.cluster.pick_free_ports(1)
    return json.dumps(
        {
            "cluster": {"ps": [f"127.0.0.1:{port}"], "worker": [f"127.0.0.1:{other}"]},
            "task": {"type": "ps", "index": 0},
        }
    )


def test_serve_port_in_use_is_a_clear_error(tmp_path, processes):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        server = _start_cli(
            ["serve"], tmp_path / "serve.log", TF_CONFIG=_ps_tf_config(port)
        )
        processes.pids.add(server.pid)
        code = server.wait(timeout=120)
    output = (tmp_path / "serve.log").read_text()
    assert code != 0, output
    assert f"Port {port} (address 127.0.0.1:{port}) is already in use" in output
    assert "Traceback" not in output
    processes.assert_all_gone()


def test_serve_stops_on_sigterm(tmp_path, processes):
    # TF_CONFIG names worker:0; --job/--task pick ps:0 instead.
    ports = kpd.cluster.pick_free_ports(2)
    tf_config = json.dumps(
        {
            "cluster": {
                "ps": [f"127.0.0.1:{ports[0]}"],
                "worker": [f"127.0.0.1:{ports[1]}"],
            },
            "task": {"type": "worker", "index": 0},
        }
    )
    log = tmp_path / "serve.log"
    server = _start_cli(
        ["serve", "--job", "ps", "--task", "0"], log, TF_CONFIG=tf_config
    )
    processes.pids.add(server.pid)
    _wait_until(lambda: "listening on" in log.read_text(), 120, "the server")
    assert f"keras-psdist serve: ps:0 listening on 127.0.0.1:{ports[0]} (pid " in (
        log.read_text()
    )
    kpd.cluster.wait_reachable([f"127.0.0.1:{ports[0]}"], timeout_s=10)
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=60) == 0, log.read_text()
    assert "keras-psdist serve: stopping ps:0 (SIGTERM)" in log.read_text()
    # Started alone, the server says itself what its open port allows.
    assert (
        "keras-psdist serve: note: TensorFlow's gRPC server takes unauthenticated "
        f"connections on port {ports[0]} of every interface" in log.read_text()
    )
    processes.assert_all_gone()


def test_serve_imports_tensorflow_without_keras():
    # A fresh process, as `keras-psdist serve` is: TensorFlow's own eager
    # Keras import is skipped (the servers start in half the time), and
    # Keras can still be imported afterwards.
    code = (
        "import sys\n"
        "from keras_psdist.cluster.server import import_tensorflow_without_keras\n"
        "tf = import_tensorflow_without_keras()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'keras'))\n"
        "server = tf.distribute.Server.create_local_server()\n"
        "import keras\n"
        "print(keras.ops.add(1, 2).numpy())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.splitlines() == ["[]", "3"], result.stdout


@pytest.mark.slow  # About 80 s under gdb; the slow run (`-m slow`) has it.
def test_a_ps_keeps_its_collective_executor_manager_when_workers_connect(tmp_path):
    """The TensorFlow crash `serve` avoids (`cluster.server.start_server`): a
    server with no eager context of its own replaces its collective executor
    manager at a connection, and two workers connecting at once leave one
    context with a deleted manager. gdb counts the replacements: a ps served
    by `keras-psdist serve` makes none, whatever the timing (a bare
    `tf.distribute.Server` makes one per connection that finds it with no
    context: `tests/scripts/serve_race.py --server bare`)."""
    if shutil.which("gdb") is None:
        pytest.skip("needs gdb")
    results = tmp_path / "results.json"
    run = subprocess.run(
        [
            *(sys.executable, SERVE_RACE, "--check", "gdb", "--server", "serve"),
            *("--workers", "2", "--keep", str(tmp_path), "--json", str(results)),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO_ROOT,
        env=_env(),
    )
    if run.returncode == SERVE_RACE_CANNOT_ATTACH:
        pytest.skip(f"gdb cannot attach here: {run.stderr[-300:]}")
    assert run.returncode == 0, run.stdout + run.stderr
    (result,) = json.loads(results.read_text())
    assert result == {"server died": None, "clients": [0, 0], "replacements": 0}


@pytest.fixture
def cli():
    from keras_psdist.cli import main as cli_lib

    try:
        yield cli_lib
    finally:
        cli_lib.FLAGS.unparse_flags()


def _run_main(cli, argv: list[str]) -> int:
    return cli._main(cli._parse_flags(argv))


def test_cli_launch_flags_and_command_after_double_dash(cli):
    argv = ["keras-psdist", "launch", "--num-ps=2", "--num_workers", "3", "--"]
    positional = cli._parse_flags([*argv, "python", "t.py", "--num-ps", "5"])
    command = ["python", "t.py", "--num-ps", "5"]
    assert positional == ["keras-psdist", "launch", "--", *command]
    assert (cli.FLAGS.num_ps, cli.FLAGS.num_workers) == (2, 3)
    assert cli.FLAGS.mode == "in-graph"


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["launch", "--num-ps", "0", "--", "python"],
            "`--num-ps` must be >= 1. Received: --num-ps=0",
        ),
        (
            ["launch", "--num-workers", "0", "--", "python"],
            "`--num-workers` must be >= 1. Received: --num-workers=0",
        ),
        (["launch", "python", "t.py"], "unexpected arguments before `--`: python"),
        (["launch"], "`command` is empty"),
        (["launch", "--"], "`command` is empty"),
        (
            ["launch", "--mode", "ring", "--", "python"],
            "Unknown mode 'ring'. Expected one of: in-graph, between-graph.",
        ),
        (["launch", "--timeout", "0", "--", "python"], "`--timeout` must be > 0"),
        (
            ["demo", "--num-workers", "2"],
            "`--num-workers` is a flag of `keras-psdist launch`, not of "
            "`keras-psdist demo`",
        ),
        (["demo", "--", "python"], "unexpected arguments: python"),
        (
            ["launch", "python", "t.py"],
            "Put the command to run after `--`: keras-psdist launch --num-ps 1 "
            "--num-workers 2 -- python train.py",
        ),
        (
            ["launch", "--max-restarts", "2", "--", "python"],
            "Received: --max-restarts 2, --mode in-graph. Use --mode between-graph.",
        ),
        (
            ["launch", "--max-restarts", "2", "--", "python"],
            "`--max-restarts` applies to between-graph runs",
        ),
        (
            ["launch", "--mode", "between-graph", "--max-worker-failures=1", "--"],
            "`--max-worker-failures` must leave the chief (worker:0), which is "
            "never tolerated to fail: at most --num-workers - 1 = 0. Received: "
            "--max-worker-failures 1, --num-workers 1.",
        ),
        (["launch", "--startup-timeout", "0", "--", "x"], "`--startup-timeout` must"),
        (["demo", "--attack", "sign_flip"], "set --num-byzantine to how many"),
        (["serve", "--task", "-1"], "`--task` must be >= 0. Received: --task=-1"),
    ],
)
def test_cli_argument_errors_exit_2(cli, capsys, argv, expected):
    assert _run_main(cli, ["keras-psdist", *argv]) == 2
    assert expected in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["launch", "--num-ps", "abc"],
            "flag --num-ps=abc: invalid literal for int()",
        ),
        (
            ["launch", "--num-pss", "2"],
            "Unknown flag --num-pss. Did you mean --num-ps?",
        ),
        (["demo", "--batch-size"], "Missing value for flag --batch-size"),
    ],
)
def test_cli_flag_parse_errors_use_the_hyphen_spelling(cli, capsys, argv, expected):
    with pytest.raises(SystemExit) as info:
        cli._parse_flags(["keras-psdist", *argv])
    assert info.value.code == 2
    assert expected in capsys.readouterr().err


def test_cli_accepts_the_underscore_spelling_too(cli):
    argv = ["keras-psdist", "launch", "--num_ps=2", "--max_worker_failures", "1"]
    cli._parse_flags([*argv, "--", "x"])
    assert (cli.FLAGS.num_ps, cli.FLAGS.max_worker_failures) == (2, 1)


@pytest.mark.parametrize(
    "tf_config, flags, expected",
    [
        (None, [], "`serve` needs the cluster in TF_CONFIG"),
        (
            {"cluster": {"ps": ["h:1"], "worker": ["h:2"]}},
            [],
            'TF_CONFIG has no "task"',
        ),
        (
            {"cluster": {"ps": ["h:1"], "worker": ["h:2"]}},
            ["--job", "chief"],
            "pass both --job and --task",
        ),
        (
            {"cluster": {"ps": ["h:1"], "worker": ["h:2"]}},
            ["--job=chief", "--task=0"],
            "Task type 'chief' (from --job/--task)",
        ),
    ],
    ids=["no_tf_config", "no_task", "job_without_task", "unknown_job"],
)
def test_cli_serve_needs_tf_config(
    cli, capsys, monkeypatch, tf_config, flags, expected
):
    if tf_config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    assert _run_main(cli, ["keras-psdist", "serve", *flags]) == 2
    assert expected in capsys.readouterr().err


def test_cli_help_per_command(cli, capsys):
    with pytest.raises(SystemExit) as info:
        cli._parse_flags(["keras-psdist", "launch", "--help"])
    assert info.value.code == 0
    usage = capsys.readouterr().out
    assert "usage: keras-psdist launch [--flags] -- COMMAND [ARGS...]" in usage
    assert "--num-workers" in usage and "--replicas" not in usage
    with pytest.raises(SystemExit):
        cli._parse_flags(["keras-psdist", "--help"])
    usage = capsys.readouterr().out
    for flag in ("--replicas", "--num-ps", "--job", "--task", "--timeout"):
        assert flag in usage
    # One spelling: hyphens, as the docs and torchrun / horovodrun.
    for flag in ("--num-byzantine", "--batch-size", "--max-worker-failures"):
        assert flag in usage
    assert not re.search(r"--[a-z]+_", usage), usage
    with pytest.raises(SystemExit) as info:
        cli._parse_flags(["keras-psdist", "--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"keras-psdist {kpd.__version__}\n"
    # `--help` after `--` belongs to the command.
    assert cli._parse_flags(["keras-psdist", "launch", "--", "x", "--help"])[-1] == (
        "--help"
    )


# ------------------------------------------------------ elastic launches


def _in_thread(tmp_path, processes, **kwargs):
    """`_launch` of the `elastic` fake trainer in a thread; returns the
    thread, its result dict and the output."""
    out, result = _Lines(), {}

    def run():
        result["code"], _ = _launch(tmp_path, processes, "elastic", out=out, **kwargs)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result, out


def _address(tmp_path, task):
    report = json.loads((tmp_path / "reports" / f"{task}.json").read_text())
    config = cluster_config.from_tf_config(report["tf_config"])
    return config.addresses("worker")[config.task_id]


@pytest.mark.timeout(120)
def test_host_discovery_starts_and_stops_workers_as_hosts_come_and_go(
    tmp_path, processes
):
    hosts = ["127.0.0.1"]
    thread, result, out = _in_thread(
        tmp_path,
        processes,
        num_ps=1,
        num_workers=1,
        mode="between-graph",
        max_workers=3,
        host_discovery=lambda: list(hosts),
    )
    reports = tmp_path / "reports"
    _wait_until(lambda: (reports / "worker:0.json").exists(), 60, "worker:0")
    hosts[:] = ["127.0.0.1", "127.0.0.2", "127.0.0.3:1"]
    _wait_until(
        lambda: (
            (reports / "worker:1.json").exists()
            and (reports / "worker:2.json").exists()
        ),
        30,
        "workers on the two new hosts",
    )
    assert _address(tmp_path, "worker:1").startswith("127.0.0.2:")
    assert _address(tmp_path, "worker:2").startswith("127.0.0.3:")
    hosts[:] = ["127.0.0.1", "127.0.0.3"]  # 127.0.0.2 is taken back
    _wait_until(
        lambda: (
            "asked worker:1 to leave after its current step (127.0.0.2 is no "
            "longer discovered)." in out.text
        ),
        30,
        "worker:1 asked to leave",
    )
    hosts[:] = ["127.0.0.1", "127.0.0.3", "127.0.0.4"]  # slot 1 taken again
    _wait_until(
        lambda: "adding worker:1 at 127.0.0.4:" in out.text, 30, "a new worker:1"
    )
    _wait_until(
        lambda: _address(tmp_path, "worker:1").startswith("127.0.0.4:"),
        30,
        "its report",
    )
    (reports / "stop").touch()
    thread.join(timeout=60)
    assert result["code"] == 0, out.text
    assert out.text.count("adding worker:") == 3, out.text
    processes.assert_all_gone()


@pytest.mark.timeout(120)
def test_min_workers_keeps_the_job_through_a_loss_and_stops_below_it(
    tmp_path, processes
):
    thread, result, out = _in_thread(
        tmp_path,
        processes,
        num_ps=1,
        num_workers=3,
        mode="between-graph",
        max_workers=3,
        min_workers=2,
    )
    reports = tmp_path / "reports"
    _wait_until(
        lambda: all((reports / f"worker:{k}.json").exists() for k in range(3)),
        60,
        "three workers",
    )
    (reports / "fail-worker:2").touch()
    _wait_until(lambda: "the job goes on with 2 workers" in out.text, 30, "a loss")
    (control,) = re.findall(r"`touch (\S+)/add-worker`", out.text)
    open(os.path.join(control, "remove-worker-1"), "w").close()
    _wait_until(
        lambda: "fewer than --min-workers 2 workers; it stays" in out.text,
        30,
        "a refusal",
    )
    (reports / "fail-worker:1").touch()
    thread.join(timeout=60)
    assert result["code"] == 1, out.text
    assert (
        "worker:1 exited with exit code 3; 1 workers are left, fewer than "
        "--min-workers 2: stopping every task." in out.text
    )
    processes.assert_all_gone()


@pytest.mark.parametrize(
    "lines, hosts",
    [
        (["a", "b:2", " ", "# c"], ["a", "b", "b"]),
        (["[::1]", "[::1]:2"], ["[::1]", "[::1]", "[::1]"]),
    ],
)
def test_discovered_hosts_are_one_entry_per_slot(lines, hosts):
    from keras_psdist.cluster.launcher.discovery import parse_hosts

    assert parse_hosts(lines) == hosts


def test_a_discovery_script_s_bad_line_or_failure_is_named(tmp_path, monkeypatch):
    from keras_psdist.cluster.launcher.discovery import parse_hosts, script_discovery

    with pytest.raises(ValueError, match=r"cannot read 'a:b'.*host:slots"):
        parse_hosts(["a:b"])
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho 10.0.0.1:2\necho broken >&2\nexit ${FAIL:-0}\n")
    script.chmod(0o755)
    assert script_discovery(str(script))() == ["10.0.0.1", "10.0.0.1"]
    monkeypatch.setenv("FAIL", "4")
    with pytest.raises(RuntimeError, match="exited with 4: broken"):
        script_discovery(str(script))()
