"""When a server task of the cluster dies: an error that names it, never a hang.

A parameter-server task holds variables in its memory, and TensorFlow has no
ps failover: when a ps process dies, the variables it held are gone, and the
only way on is to restart the cluster and resume from a checkpoint
(`keras.callbacks.BackupAndRestore`). What TensorFlow itself says is a
`tf.errors.UnavailableError` ("Connection reset by peer"), and a *later* call
of a function on the dead task can wait forever (its registration on the
task never completes). So when an op fails, we look: one TCP connection to
each server task (a killed process's port refuses at once) tells which are
gone, and then

- `model.fit`, `evaluate` and `predict` raise `TaskLostError` naming the
  lost tasks, their addresses and what to do (`reporting_lost_tasks`);
- the sync-replica protocol, the heartbeats and the liveness reporter send
  nothing more to a lost ps (`unreachable_tasks` before each control
  message), so the process exits instead of hanging in its clean-up;
- and because a TensorFlow call can also wait forever *without* any op
  failing first (e.g. a worker starting an epoch's input iterator syncs its
  executors with every task, the dead one included), `ServerWatch` looks
  every second: once a task is lost, the process has `grace_s` (the
  strategy's `heartbeat_timeout`) to stop by itself; if it has not, the
  watch prints the `TaskLostError` and ends the process (`os._exit(1)`):
  a bounded exit with the cause, never a hang.

Which tasks are looked at: the ps tasks always; in an in-graph run also the
worker tasks (servers the chief places replicas on). In a between-graph run a
lost *worker* is the heartbeats' business (`cluster.liveness`).

Examples:

>>> from keras_psdist import cluster
>>> from keras_psdist.cluster import task_loss
>>> port = cluster.pick_free_ports(1)[0]
>>> config = cluster.from_tf_config(
...     {"cluster": {"ps": [f"127.0.0.1:{port}"], "worker": ["127.0.0.1:2"]},
...      "task": {"type": "worker", "index": 0}})
>>> task_loss.unreachable_tasks(config, ("ps",))
{'ps:0': '127.0.0.1:... (Connection refused)'}
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator

import tensorflow as tf
from absl import logging

from keras_psdist.cluster.config import ClusterConfig
from keras_psdist.cluster.ports import connect_error
from keras_psdist.errors import TaskLostError  # noqa: F401 (re-exported)

# Seconds one connection attempt may take: a dead process refuses at once,
# a live server accepts within milliseconds; a host that is down times out.
PROBE_TIMEOUT_S = 2.0


def server_jobs(mode: str) -> tuple[str, ...]:
    """The jobs whose tasks a process of a `mode` run depends on."""
    return ("ps", "worker") if mode == "in-graph" else ("ps",)


def unreachable_tasks(
    config: ClusterConfig,
    jobs: Iterable[str] = ("ps",),
    timeout_s: float = PROBE_TIMEOUT_S,
) -> dict[str, str]:
    """The tasks of `jobs` (but not this process's own) that refuse a TCP
    connection now: task name -> `"address (why)"`."""
    lost = {}
    for job in jobs:
        for i, address in enumerate(config.addresses(job)):
            if (job, i) == (config.task_type, config.task_id):
                continue
            error = connect_error(address, timeout_s)
            if error is not None:
                lost[f"{job}:{i}"] = f"{address} ({error})"
    return lost


def lost_task_error(
    config: ClusterConfig, jobs: Iterable[str], process: str
) -> TaskLostError | None:
    """A `TaskLostError` if some task of `jobs` is unreachable, else None."""
    lost = unreachable_tasks(config, jobs)
    return TaskLostError(lost, process) if lost else None


# How long a connection error may precede the lost task's port closing: a
# killed process's connections can be reset a moment before its listening
# socket is closed (longer on a loaded machine).
SETTLE_S = 2.0
_CONNECTION_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.AbortedError,
    tf.errors.CancelledError,
)


def _lost_after(
    error: BaseException, probe: Callable[[], dict[str, str]]
) -> dict[str, str]:
    """`probe()` (the lost tasks), looked at again for up to `SETTLE_S` when
    `error` is a connection error and nothing is lost yet."""
    lost = probe()
    if lost or not isinstance(error, _CONNECTION_ERRORS):
        return lost
    deadline = time.monotonic() + SETTLE_S
    while not lost and time.monotonic() < deadline:
        time.sleep(0.1)
        lost = probe()
    return lost


@contextlib.contextmanager
def reporting_lost_tasks(
    config: ClusterConfig, jobs: Iterable[str], process: str
) -> Iterator[None]:
    """Re-raises a TensorFlow op error as `TaskLostError` when it came from a
    lost task (so the error names it); any other error passes unchanged."""
    try:
        yield
    except tf.errors.OpError as e:
        lost = _lost_after(e, functools.partial(unreachable_tasks, config, tuple(jobs)))
        if not lost:
            raise
        raise TaskLostError(lost, process) from e


# Exit code of a process the watch ends (its error on stderr before it).
EXIT_CODE = 1


class ServerWatch:
    """Ends this process, with the error, when a server task is lost and
    the process has not stopped by itself within `grace_s`.

    Args:
        config: The cluster (this process's task set).
        jobs: The jobs whose tasks this process depends on (`server_jobs`).
        grace_s: Seconds from the loss to the exit.
        period: Seconds between looks. Defaults to `min(1, grace_s / 5)`.
        exit: Called with `EXIT_CODE` to end the process. Defaults to
            `os._exit` (no clean-up: TensorFlow's may wait on the dead task).
    """

    def __init__(
        self,
        config: ClusterConfig,
        jobs: Iterable[str],
        grace_s: float,
        period: float | None = None,
        exit: Callable[[int], None] = os._exit,
    ):
        self._config = config
        self._jobs = tuple(jobs)
        self.grace_s = float(grace_s)
        self._period = min(1.0, self.grace_s / 5) if period is None else period
        self._exit = exit
        self.error: TaskLostError | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, name="keras_psdist-server-watch", daemon=True
        )
        self._thread.start()
        atexit.register(self.stop)

    @property
    def lost(self) -> dict[str, str]:
        """The tasks found lost (task -> where, why); empty while all answer."""
        return {} if self.error is None else self.error.tasks

    def stop(self) -> None:
        """Stops watching, unless a task is already lost (then the exit
        stays armed: the interpreter's own clean-up may wait on it)."""
        if self.error is None:
            self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self._period):
            self.error = lost_task_error(
                self._config, self._jobs, self._config.task_name
            )
            if self.error is not None:
                break
        else:
            return
        logging.error(
            "keras_psdist: %s This process ends in %g s unless it stops first.",
            self.error,
            self.grace_s,
        )
        # Not `self._stop`: once armed, nothing disarms it.
        threading.Event().wait(self.grace_s)
        print(f"keras_psdist: {self.error}", file=sys.stderr, flush=True)
        self._exit(EXIT_CODE)


def watch(topology, grace_s: float) -> ServerWatch | None:
    """A `ServerWatch` for a process of a cluster run, else None."""
    if topology.config is None:
        return None
    return ServerWatch(topology.config, server_jobs(topology.mode), grace_s)


def reporting(method):
    """Wraps Keras's `fit` / `evaluate` / `predict`: for a model under a
    keras_psdist strategy on a cluster, errors from a lost task become
    `TaskLostError`."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        topology = getattr(
            getattr(getattr(self, "distribute_strategy", None), "extended", None),
            "topology",
            None,
        )
        config = getattr(topology, "config", None)
        if config is None:
            return method(self, *args, **kwargs)
        with reporting_lost_tasks(config, server_jobs(topology.mode), config.task_name):
            return method(self, *args, **kwargs)

    return wrapper
