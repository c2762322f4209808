"""`cluster.task_loss`: a lost server task is named, and never hangs a process.

Unit tests against real sockets (a listening socket stands in for a task's
server; closing it is the task dying). The multiprocess tests that kill a
real ps are in test_faults.py.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
import tensorflow as tf

from keras_psdist import cluster
from keras_psdist.cluster import task_loss

pytestmark = pytest.mark.waits


@pytest.fixture
def listening():
    """A socket listening on 127.0.0.1; yields its address."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    yield server
    server.close()


def _config(ps_address, task=("worker", 0)):
    free = cluster.pick_free_ports(1)[0]
    return cluster.from_tf_config(
        {
            "cluster": {"ps": [ps_address], "worker": [f"127.0.0.1:{free}"]},
            "task": {"type": task[0], "index": task[1]},
        }
    )


def _address(server):
    host, port = server.getsockname()
    return f"{host}:{port}"


def test_unreachable_tasks_names_only_the_dead_ones(listening):
    config = _config(_address(listening))
    assert task_loss.unreachable_tasks(config, ("ps",)) == {}
    # The worker task's port has no server: lost, unless it is this task.
    assert task_loss.unreachable_tasks(config, ("worker",)) == {}
    in_graph_chief_view = config.with_task("ps", 0)
    lost = task_loss.unreachable_tasks(in_graph_chief_view, ("ps", "worker"))
    assert list(lost) == ["worker:0"] and "Connection refused" in lost["worker:0"]


def test_an_op_error_from_a_lost_ps_becomes_task_lost_error(listening):
    address = _address(listening)
    config = _config(address)
    # All reachable: TensorFlow's error passes unchanged.
    with (
        pytest.raises(tf.errors.UnavailableError),
        task_loss.reporting_lost_tasks(config, ("ps",), "worker:0"),
    ):
        raise tf.errors.UnavailableError(None, None, "connection reset")
    listening.close()
    with (
        pytest.raises(task_loss.TaskLostError) as error,
        task_loss.reporting_lost_tasks(config, ("ps",), "worker:0"),
    ):
        raise tf.errors.UnavailableError(None, None, "connection reset")
    assert isinstance(error.value.__cause__, tf.errors.UnavailableError)
    message = str(error.value)
    assert message.startswith(f"worker:0: lost ps:0 at {address} (Connection refused)")
    assert "restart the whole cluster" in message and "BackupAndRestore" in message
    assert error.value.tasks == {"ps:0": f"{address} (Connection refused)"}


def test_other_errors_pass_even_when_a_ps_is_lost():
    config = _config(f"127.0.0.1:{cluster.pick_free_ports(1)[0]}")
    with (
        pytest.raises(ValueError, match="not ours"),
        task_loss.reporting_lost_tasks(config, ("ps",), "worker:0"),
    ):
        raise ValueError("not ours")


class _Exits:
    def __init__(self):
        self.codes = []
        self.called = threading.Event()

    def __call__(self, code):
        self.codes.append(code)
        self.called.set()


def test_the_watch_ends_a_process_that_does_not_stop_by_itself(listening, capsys):
    exits = _Exits()
    watch = task_loss.ServerWatch(
        _config(_address(listening)), ("ps",), grace_s=0.3, period=0.05, exit=exits
    )
    time.sleep(0.3)
    assert not exits.called.is_set() and watch.error is None
    listening.close()  # the ps dies
    assert exits.called.wait(timeout=10), "the watch never ended the process"
    assert exits.codes == [task_loss.EXIT_CODE]
    assert "lost ps:0 at" in str(watch.error)
    assert "keras_psdist: worker:0: lost ps:0 at" in capsys.readouterr().err
    watch.stop()  # armed: stopping no longer disarms it (already fired here)


def test_a_stopped_watch_never_fires(listening):
    exits = _Exits()
    watch = task_loss.ServerWatch(
        _config(_address(listening)), ("ps",), grace_s=0.1, period=0.05, exit=exits
    )
    watch.stop()
    listening.close()
    assert not exits.called.wait(timeout=0.6)


def test_a_connection_error_waits_for_the_port_to_close(listening):
    # A killed process's connections can be reset a moment before its
    # listening socket closes: the connection error is looked at again.
    config = _config(_address(listening))
    threading.Timer(0.5, listening.close).start()
    with (
        pytest.raises(task_loss.TaskLostError, match="lost ps:0"),
        task_loss.reporting_lost_tasks(config, ("ps",), "worker:0"),
    ):
        raise tf.errors.UnavailableError(None, None, "Connection reset by peer")


def test_other_op_errors_are_not_waited_on(listening, monkeypatch):
    config = _config(_address(listening))
    sleeps = []
    monkeypatch.setattr(task_loss.time, "sleep", sleeps.append)
    with (
        pytest.raises(tf.errors.InvalidArgumentError),
        task_loss.reporting_lost_tasks(config, ("ps",), "worker:0"),
    ):
        raise tf.errors.InvalidArgumentError(None, None, "bad shape")
    assert sleeps == []  # one look, no second one


# ------------------------------------------- refused, silent, or cut off: which


def _cluster(task=("worker", 1)):
    """Four hosts: ps:0 on .2, worker:0 (the chief) on .3, worker:1 on .4,
    worker:2 on .5."""
    return cluster.from_tf_config(
        {
            "cluster": {
                "ps": ["10.9.0.2:2222"],
                "worker": ["10.9.0.3:2222", "10.9.0.4:2222", "10.9.0.5:2222"],
            },
            "task": {"type": task[0], "index": task[1]},
        }
    )


class _Network:
    """Stands in for `task_loss.probe`: each host answers (None), refuses, or
    is silent, as `state` says (default: answers); counts the probes."""

    def __init__(self, **state):
        self.state = state  # host's last octet as "h2" -> None / why
        self.probed = []

    def __call__(self, address, timeout_s=None):
        self.probed.append(address)
        return self.state.get("h" + address.split(":")[0].rsplit(".", 1)[1])


@pytest.mark.parametrize(
    "state, task, kind, tasks",
    [
        # Every ps answers: nothing lost, and nobody else is asked.
        ({}, ("worker", 1), None, None),
        # A killed ps: refused, whatever the others do.
        (
            {"h2": task_loss.REFUSED, "h3": "timed out"},
            ("worker", 1),
            task_loss.TaskLostError,
            {"ps:0"},
        ),
        # The ps is silent while the others answer: its host is cut off.
        ({"h2": "timed out"}, ("worker", 1), task_loss.TaskUnreachableError, {"ps:0"}),
        # A worker whose port refuses still answers for its host.
        (
            {"h2": "timed out", "h3": "timed out", "h5": task_loss.REFUSED},
            ("worker", 1),
            task_loss.TaskUnreachableError,
            {"ps:0"},
        ),
        # Nobody answers: this process's own network is down.
        (
            {"h2": "timed out", "h3": "No route to host", "h5": "timed out"},
            ("worker", 1),
            task_loss.DisconnectedError,
            {"ps:0", "worker:0", "worker:2"},
        ),
    ],
)
def test_find_lost_tells_a_dead_task_a_cut_host_and_a_cut_self_apart(
    monkeypatch, state, task, kind, tasks
):
    network = _Network(**state)
    monkeypatch.setattr(task_loss, "probe", network)
    found = task_loss.find_lost(_cluster(task), ("ps",))
    if kind is None:
        assert found is None and network.probed == ["10.9.0.2:2222"]
        return
    assert type(found) is kind and set(found.tasks) == tasks
    assert isinstance(found, task_loss.TaskLostError)  # one `except` catches all
    assert "10.9.0.4:2222" not in network.probed  # never itself


def test_the_messages_say_what_is_wrong_and_what_to_do(monkeypatch):
    monkeypatch.setattr(task_loss, "probe", _Network(h2="timed out"))
    unreachable = str(task_loss.find_lost(_cluster(), ("ps",)))
    assert unreachable.startswith(
        "worker:1: ps:0 at 10.9.0.2:2222 (timed out) does not answer, while "
        "worker:0, worker:2 answer: its host is cut off from the network, or down."
    )
    assert "died" not in unreachable.split(". A task whose process died")[0]
    assert "BackupAndRestore" in unreachable

    monkeypatch.setattr(
        task_loss, "probe", _Network(h2="timed out", h3="timed out", h5="timed out")
    )
    worker = str(task_loss.find_lost(_cluster(), ("ps",)))
    assert worker.startswith(
        "worker:1 cannot reach any other task of the cluster: ps:0 at "
        "10.9.0.2:2222 (timed out), worker:0 at 10.9.0.3:2222 (timed out), "
        "worker:2 at 10.9.0.5:2222 (timed out) do not answer. This host's own "
        "network is probably down"
    )
    assert "the ps tasks and their variables are probably fine" in worker
    assert "--max-restarts" in worker and "restart the whole cluster" not in worker

    monkeypatch.setattr(
        task_loss, "probe", _Network(h2="timed out", h4="timed out", h5="timed out")
    )
    chief = task_loss.find_lost(_cluster(("worker", 0)), ("ps",))
    assert not chief.restartable and "This process is the chief" in str(chief)
    assert "BackupAndRestore" in str(chief)


def test_with_no_other_host_to_ask_it_cannot_say_whose_link_is_down(monkeypatch):
    two_hosts = cluster.from_tf_config(
        {
            "cluster": {"ps": ["10.9.0.2:2222"], "worker": ["10.9.0.3:2222"]},
            "task": {"type": "worker", "index": 0},
        }
    )
    monkeypatch.setattr(task_loss, "probe", _Network(h2="timed out"))
    found = task_loss.find_lost(two_hosts, ("ps",))
    assert type(found) is task_loss.TaskUnreachableError and not found.answering
    assert "or this host's own network is down" in str(found)


def test_in_graph_the_workers_are_needed_and_witnesses(monkeypatch):
    in_graph = cluster.from_tf_config(
        {
            "cluster": {
                "ps": ["10.9.0.2:2222", "10.9.0.3:2222"],
                "worker": ["10.9.0.4:2222"],
                "chief": ["10.9.0.5:2222"],
            },
            "task": {"type": "chief", "index": 0},
        }
    )
    jobs = task_loss.server_jobs("in-graph")
    monkeypatch.setattr(task_loss, "probe", _Network(h2="timed out"))
    assert set(task_loss.find_lost(in_graph, jobs).answering) == {"ps:1", "worker:0"}
    monkeypatch.setattr(
        task_loss, "probe", _Network(h2="timed out", h3="timed out", h4="timed out")
    )
    assert type(task_loss.find_lost(in_graph, jobs)) is task_loss.DisconnectedError


def test_whereabouts_of_a_silent_task(monkeypatch):
    monkeypatch.setattr(task_loss, "probe", _Network(h3="timed out"))
    assert task_loss.whereabouts(_cluster(), "worker:0") == (
        "Its host does not answer at 10.9.0.3:2222 (timed out): it is cut off "
        "from the network, or down."
    )
    monkeypatch.setattr(task_loss, "probe", _Network(h3=task_loss.REFUSED))
    assert "its process is gone" in task_loss.whereabouts(_cluster(), "worker:0")
    monkeypatch.setattr(task_loss, "probe", _Network())
    assert "hung, frozen" in task_loss.whereabouts(_cluster(), "worker:0")


def test_the_watch_stands_down_when_a_silent_ps_answers_again(monkeypatch, caplog):
    network = _Network(h2="timed out")
    monkeypatch.setattr(task_loss, "probe", network)
    exits = _Exits()
    watch = task_loss.ServerWatch(
        _cluster(), ("ps",), grace_s=2.0, period=0.05, exit=exits
    )
    try:
        _wait_for(lambda: watch.lost, "the silent ps found")
        assert list(watch.lost) == ["ps:0"]
        network.state = {}  # the link is back
        _wait_for(lambda: not watch.lost, "the watch to stand down")
        # And it keeps watching: a second cut is found again.
        network.state = {"h2": "timed out"}
        _wait_for(lambda: watch.lost, "the second cut found")
        network.state = {}
        _wait_for(lambda: not watch.lost, "the watch to stand down again")
        assert not exits.called.wait(timeout=2.5)  # past grace_s: never fired
    finally:
        watch.stop()
    logged = caplog.text
    assert "ps:0 at 10.9.0.2:2222 (timed out) does not answer" in logged
    assert "ends in 2 s unless it stops first or they answer again" in logged
    assert "worker:1: ps:0 answers again; this process goes on." in logged


def test_a_refused_ps_stays_lost_even_if_its_port_answers_again(monkeypatch, capsys):
    # Its variables died with it: a new process on that port holds none.
    network = _Network(h2=task_loss.REFUSED)
    monkeypatch.setattr(task_loss, "probe", network)
    exits = _Exits()
    watch = task_loss.ServerWatch(
        _cluster(), ("ps",), grace_s=0.5, period=0.05, exit=exits
    )
    _wait_for(lambda: watch.lost, "the refused ps found")
    network.state = {}
    assert exits.called.wait(timeout=10)
    assert (
        "worker:1: lost ps:0 at 10.9.0.2:2222 (Connection refused): its process is gone"
        in (capsys.readouterr().err)
    )


def test_a_silent_ps_that_stays_silent_ends_the_process_with_its_error(
    monkeypatch, capsys
):
    monkeypatch.setattr(
        task_loss, "probe", _Network(h2="timed out", h3="timed out", h5="timed out")
    )
    exits = _Exits()
    task_loss.ServerWatch(_cluster(), ("ps",), grace_s=0.3, period=0.05, exit=exits)
    assert exits.called.wait(timeout=10)
    assert exits.codes == [task_loss.EXIT_CODE]
    assert (
        "keras_psdist: worker:1 cannot reach any other task" in capsys.readouterr().err
    )


def test_an_op_error_while_cut_off_says_so(monkeypatch):
    monkeypatch.setattr(
        task_loss, "probe", _Network(h2="timed out", h3="timed out", h5="timed out")
    )
    with (
        pytest.raises(
            task_loss.DisconnectedError, match="own network is probably down"
        ),
        task_loss.reporting_lost_tasks(_cluster(), ("ps",), "worker:1"),
    ):
        raise tf.errors.UnavailableError(None, None, "Socket closed")


def _wait_for(done, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.01)
