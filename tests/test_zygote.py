"""The test zygote (`cluster_jobs/zygote.py`) runs a task as a fresh
interpreter would: its arguments, environment, directory and streams, its
exit status and signals, its network namespace; and nothing it starts
outlives its client."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import zygote  # tests/cluster_jobs, see conftest.py

pytestmark = pytest.mark.multiprocess

SCRIPT = textwrap.dedent(
    """
    import gc, json, os, sys, tempfile, time
    import tensorflow as tf
    what = sys.argv[1]
    if what == "report":
        print(json.dumps({
            "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
            "env": os.environ.get("ZYGOTE_TEST"), "main": __name__,
            "pid": os.getpid(), "sum": int(tf.constant(2) + 3),
            "frozen": gc.get_freeze_count(),
            "preloaded": "keras_psdist.strategies.ps" in sys.modules,
            "tmp": tempfile.gettempdir(),
        }), flush=True)
        print("to stderr", file=sys.stderr, flush=True)
        sys.exit(int(sys.argv[2]))
    if what == "sleep":
        print("sleeping", flush=True)
        time.sleep(60)
    if what == "kill-self":
        os.kill(os.getpid(), 9)
    if what == "raise":
        raise ValueError("from the task")
    """
)


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    zygote.ensure_running()
    path = tmp_path_factory.mktemp("zygote") / "task.py"
    path.write_text(SCRIPT)
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # (reaped between the two looks: gone)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _wait_gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_the_command_goes_through_the_zygote(script):
    command = zygote.command([str(script)])
    assert command[:5] == [sys.executable, "-S", "-E", zygote.__file__, "run"]


def test_a_task_gets_its_arguments_environment_directory_and_streams(script, tmp_path):
    import json

    result = subprocess.run(
        zygote.command([str(script), "report", "3"]),
        cwd=tmp_path,
        env=dict(os.environ, ZYGOTE_TEST="here"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 3, result.stderr
    report = json.loads(result.stdout)
    assert report["argv"] == [str(script), "report", "3"]
    assert report["cwd"] == str(tmp_path)
    assert report["path0"] == str(script.parent)
    assert report["env"] == "here" and report["main"] == "__main__"
    assert report["sum"] == 5
    assert "to stderr" in result.stderr
    # What the zygote preloaded (`zygote.preload`): the package's modules,
    # and its objects frozen out of the fork's collections.
    assert report["preloaded"] and report["frozen"] > 100_000
    # Its temporary files go in the zygote's directory, which `zygote.stop`
    # removes: a task killed before its clean-up leaves none in /tmp.
    assert report["tmp"].startswith(os.environ[zygote.DIR_ENV] + os.sep)


def test_the_zygote_runs_no_thread_of_tensorflow_s_runtime(script):
    # Its imports (`zygote.preload` too) start none: a fork of it is as
    # safe as a fresh start. The runtime's threads are named tf_*
    # (tf_Compute, tf_graph_runner, ...), as the forks' are once they run.
    names = zygote.thread_names()
    assert names, "no zygote running"
    assert not [name for name in names if name.startswith("tf_")], names


def test_a_module_runs_as_with_python_m(script):
    result = subprocess.run(
        zygote.command(["-m", "keras_psdist", "--version"]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    import keras_psdist

    assert keras_psdist.__version__ in result.stdout


def test_an_exception_exits_1_with_its_traceback(script):
    result = subprocess.run(
        zygote.command([str(script), "raise"]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "ValueError: from the task" in result.stderr


def test_a_task_killed_by_a_signal_looks_killed_by_it(script):
    result = subprocess.run(
        zygote.command([str(script), "kill-self"]), capture_output=True, timeout=60
    )
    assert result.returncode == -signal.SIGKILL


def _sleeping(script):
    proc = subprocess.Popen(
        zygote.command([str(script), "sleep"]),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout.readline().strip() == "sleeping"
    fork = next(
        int(pid)
        for pid in os.listdir("/proc")
        if pid.isdigit() and int(pid) != proc.pid and _is_fork_of(int(pid), proc.pid)
    )
    return proc, fork


def _is_fork_of(pid: int, client: int) -> bool:
    """`pid` is the zygote's fork serving `client`: its session is its
    own, and its stdout is the client's."""
    try:
        return os.getsid(pid) == pid and os.readlink(
            f"/proc/{pid}/fd/1"
        ) == os.readlink(f"/proc/{client}/fd/1")
    except OSError:
        return False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_a_signal_to_the_client_reaches_the_task(script, signum):
    proc, fork = _sleeping(script)
    try:
        os.killpg(proc.pid, signum)
        assert proc.wait(timeout=30) == -signum
        assert _wait_gone(fork), f"the fork {fork} outlived its client"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.stdout.close()


def test_a_task_enters_its_clients_network_namespace(script, tmp_path):
    import launching

    with launching.cluster_hosts(1, 0) as (hosts, _):
        if hosts is None:
            pytest.skip(f"{launching.HOSTS_ENV}=loopback")
        probe = tmp_path / "probe.py"
        probe.write_text("import os\nprint(os.stat('/proc/self/ns/net').st_ino)\n")
        inside = hosts.run("ps0", zygote.command([str(probe)]), timeout=60)
        plain = hosts.run("ps0", [sys.executable, str(probe)], timeout=60)
    assert inside.returncode == 0, inside.stderr
    assert inside.stdout == plain.stdout
    assert int(inside.stdout) != os.stat("/proc/self/ns/net").st_ino
