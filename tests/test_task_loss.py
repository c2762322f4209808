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
