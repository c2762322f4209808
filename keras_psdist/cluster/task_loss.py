"""When a server task of the cluster dies or cannot be reached: an error that
says which, and why, never a hang.

A parameter-server task holds variables in its memory, and TensorFlow has no
ps failover: when a ps process dies, the variables it held are gone, and the
only way on is to restart the cluster and resume from a checkpoint
(`keras.callbacks.BackupAndRestore`). What TensorFlow itself says is a
`tf.errors.UnavailableError` ("Connection reset by peer"), and a *later* call
of a function on the dead task can wait forever (its registration on the
task never completes). So when an op fails, we look: one TCP connection to
each server task, all at once (`find_lost`). What the look finds decides
what is said:

| the server tasks                       | verdict                         |
|----------------------------------------|---------------------------------|
| refuse (a killed process's port        | `TaskLostError`: its process is |
| refuses at once)                       | gone                            |
| time out, while some other task of the | `TaskUnreachableError`: its     |
| cluster answers                        | host is cut off or down         |
| time out, and so does every other task | `DisconnectedError`: this       |
| (on at least two other hosts)          | process's own network is down   |

(A task "answers" when its host does: a refused connection is an answer.)
Then

- `model.fit`, `evaluate` and `predict` raise that error, naming the tasks,
  their addresses and what to do (`reporting_lost_tasks`);
- the sync-replica protocol, the heartbeats and the liveness reporter send
  nothing more to a lost ps (`unreachable_tasks` before each control
  message, `ServerWatch.lost`), so the process exits instead of hanging in
  its clean-up;
- and because a TensorFlow call can also wait forever *without* any op
  failing first (e.g. a worker starting an epoch's input iterator syncs its
  executors with every task, the dead one included; and a cut link makes
  every call wait, not fail), `ServerWatch` looks every second: once a task
  is lost, the process has `grace_s` (the strategy's `heartbeat_timeout`)
  to stop by itself; if it has not, the watch prints the error and ends
  the process (`os._exit(1)`): a bounded exit with the cause, never a hang.
  A refused task stays lost; tasks that only did not answer (a link down)
  are looked at again every second, and when they all answer again within
  `grace_s` the watch stands down and training goes on where it waited.

The watch's error thus comes within `period + 2 * PROBE_TIMEOUT_S + grace_s`
of a cut (a look's start, its two stages of probes, then the grace, whose
looks all end by its end): `heartbeat_timeout + 5` seconds at most
(`period` is at most 1 s).

Which tasks are looked at: the ps tasks always; in an in-graph run also the
worker tasks (servers the chief places replicas on); when some time out,
every other task of the cluster, to tell whose network is down. In a
between-graph run a lost *worker* is the heartbeats' business
(`cluster.liveness`).

Examples:

>>> from keras_psdist import cluster
>>> from keras_psdist.cluster import task_loss
>>> port = cluster.pick_free_ports(1)[0]
>>> config = cluster.from_tf_config(
...     {"cluster": {"ps": [f"127.0.0.1:{port}"], "worker": ["127.0.0.1:2"]},
...      "task": {"type": "worker", "index": 0}})
>>> task_loss.unreachable_tasks(config, ("ps",))
{'ps:0': '127.0.0.1:... (Connection refused)'}
>>> type(task_loss.find_lost(config, ("ps",))).__name__
'TaskLostError'
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import functools
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator

import tensorflow as tf
from absl import logging

from keras_psdist.cluster.config import JOB_NAMES, ClusterConfig
from keras_psdist.cluster.ports import connect_error, split_address
from keras_psdist.errors import (  # noqa: F401 (re-exported)
    DisconnectedError,
    TaskLostError,
    TaskUnreachableError,
)

# Seconds one connection attempt may take: a dead process refuses at once,
# a live server accepts within milliseconds; a host that is down or cut off
# (or this host's own link) times out.
PROBE_TIMEOUT_S = 2.0
# What a probe of a task whose port refuses says (`ConnectionRefusedError`).
REFUSED = "Connection refused"


def exit_within(grace_s: float) -> float:
    """Seconds from a cut to the exit of a process whose `ServerWatch` has
    `grace_s` (the bound in the module doc): the longest a live process may
    wait on a lost ps, its heartbeat paused, before it goes on or ends."""
    return min(1.0, grace_s / 5) + 2 * PROBE_TIMEOUT_S + grace_s


def server_jobs(mode: str) -> tuple[str, ...]:
    """The jobs whose tasks a process of a `mode` run depends on."""
    return ("ps", "worker") if mode == "in-graph" else ("ps",)


def unreachable_tasks(
    config: ClusterConfig,
    jobs: Iterable[str] = ("ps",),
    timeout_s: float = PROBE_TIMEOUT_S,
) -> dict[str, str]:
    """The tasks of `jobs` (but not this process's own) that refuse a TCP
    connection or do not answer now: task name -> `"address (why)"`."""
    lost = {}
    for name, address in _tasks(config, jobs).items():
        error = connect_error(address, timeout_s)
        if error is not None:
            lost[name] = f"{address} ({error})"
    return lost


def probe(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why `address` takes no TCP connection now, None if it takes one:
    `REFUSED` (its host answers; nothing listens: a dead process), or
    `"timed out"`, `"No route to host"`, ... (its host does not answer)."""
    host, port = split_address(address, "probe")
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=timeout_s):
            return None
    except ConnectionRefusedError:
        return REFUSED
    except OSError as e:
        return e.strerror or str(e) or type(e).__name__


def find_lost(
    config: ClusterConfig,
    jobs: Iterable[str] = ("ps",),
    timeout_s: float = PROBE_TIMEOUT_S,
    earlier: TaskLostError | None = None,
) -> TaskLostError | None:
    """What is lost of the tasks of `jobs` (not this process's own), as the
    error to raise; None while every one takes a connection.

    Every task of `jobs` is probed at once. Some refuse: `TaskLostError`
    naming them (their processes are gone). Some only do not answer: every
    other task of the cluster is probed too; if none of them answers either,
    and they are on at least two other hosts, `DisconnectedError` (this
    process's own network is down), else `TaskUnreachableError` naming the
    silent tasks and those that answered. At most `timeout_s` seconds per
    stage (and one stage only while every task answers).

    Args:
        config: The cluster, with this process's task.
        jobs: The jobs whose tasks this process needs.
        timeout_s: Seconds each connection attempt may take.
        earlier: A verdict of an earlier look: while the same tasks of `jobs`
            are silent, it stands, without asking the others again.
    """
    jobs = tuple(jobs)
    needed = _tasks(config, jobs)
    why = _probe_all(needed, timeout_s)
    failed = {name: f"{needed[name]} ({w})" for name, w in why.items() if w}
    if not failed:
        return None
    process = config.task_name
    refused = {name: where for name, where in failed.items() if why[name] == REFUSED}
    if refused:
        return TaskLostError(refused, process)
    if may_come_back(earlier) and set(failed) == set(earlier.tasks) & set(needed):
        return earlier
    others = {
        name: address
        for name, address in _tasks(config, JOB_NAMES).items()
        if name not in needed
    }
    others_why = _probe_all(others, timeout_s)
    everyone = {**needed, **others}
    why = {**why, **others_why}
    # A refused connection is an answer from the task's host.
    answering = {
        name: everyone[name] for name, w in why.items() if w is None or w == REFUSED
    }
    if answering:
        return TaskUnreachableError(failed, process, answering)
    own_host = split_address(config.task_address, "find_lost")[0]
    hosts = {split_address(a, "find_lost")[0] for a in everyone.values()} - {own_host}
    if len(hosts) < 2:
        return TaskUnreachableError(failed, process, {})
    silent = {name: f"{everyone[name]} ({why[name]})" for name in everyone}
    return DisconnectedError(silent, process, restartable=not config.is_chief)


def may_come_back(error: TaskLostError | None) -> bool:
    """Whether the tasks of `error` only did not answer (a link that may come
    back), rather than refused (a process that is gone)."""
    return isinstance(error, (TaskUnreachableError, DisconnectedError))


def whereabouts(config: ClusterConfig, task: str) -> str:
    """What a probe of `task` (e.g. `"worker:0"`) says of it, as a sentence
    for an error about a task that stopped beating: its port takes
    connections (its process is there, hung), refuses them (its process is
    gone), or its host does not answer (cut off from the network, or down).
    Empty for a `config` that is not a `ClusterConfig`."""
    job, _, index = task.partition(":")
    addresses = getattr(config, "addresses", None)
    if addresses is None:  # not a cluster's config: nothing to probe
        return ""
    address = addresses(job)[int(index)]
    why = probe(address)
    if why is None:
        return (
            f"Its port at {address} still takes connections: its process is "
            "there but does not beat (hung, frozen, or starved of CPU)."
        )
    if why == REFUSED:
        return f"Its port at {address} refuses connections: its process is gone."
    return (
        f"Its host does not answer at {address} ({why}): it is cut off from "
        "the network, or down."
    )


def _tasks(config: ClusterConfig, jobs: Iterable[str]) -> dict[str, str]:
    """Task name -> address for the tasks of `jobs`, this process's own left out."""
    return {
        f"{job}:{i}": address
        for job in jobs
        for i, address in enumerate(config.addresses(job))
        if (job, i) != (config.task_type, config.task_id)
    }


def _probe_all(tasks: dict[str, str], timeout_s: float) -> dict[str, str | None]:
    """`probe` of every task at once: task name -> why not (None: it answers)."""
    if not tasks:
        return {}
    with concurrent.futures.ThreadPoolExecutor(len(tasks)) as pool:
        futures = {
            name: pool.submit(probe, address, timeout_s)
            for name, address in tasks.items()
        }
    return {name: future.result() for name, future in futures.items()}


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
    error: BaseException, look: Callable[[], TaskLostError | None]
) -> TaskLostError | None:
    """`look()` (what is lost), looked at again for up to `SETTLE_S` when
    `error` is a connection error and nothing is lost yet."""
    lost = look()
    if lost is not None or not isinstance(error, _CONNECTION_ERRORS):
        return lost
    deadline = time.monotonic() + SETTLE_S
    while lost is None and time.monotonic() < deadline:
        time.sleep(0.1)
        lost = look()
    return lost


@contextlib.contextmanager
def reporting_lost_tasks(
    config: ClusterConfig, jobs: Iterable[str], process: str
) -> Iterator[None]:
    """Re-raises a TensorFlow op error as `TaskLostError` (or one of its
    subclasses, see `find_lost`) when it came from a lost task (so the error
    names it and says why); any other error passes unchanged."""
    try:
        yield
    except tf.errors.OpError as e:
        lost = _lost_after(e, functools.partial(find_lost, config, tuple(jobs)))
        if lost is None:
            raise
        raise lost from e


# Exit code of a process the watch ends (its error on stderr before it).
EXIT_CODE = 1


class ServerWatch:
    """Ends this process, with the error, when a server task is lost and
    the process has not stopped by itself within `grace_s`; stands down when
    tasks that only did not answer answer again within it.

    Args:
        config: The cluster (this process's task set).
        jobs: The jobs whose tasks this process depends on (`server_jobs`).
        grace_s: Seconds from the loss to the exit.
        period: Seconds between looks. Defaults to `min(1, grace_s / 5)`.
        exit: Called with `EXIT_CODE` to end the process. Defaults to
            `os._exit` (no clean-up: TensorFlow's may wait on the lost task).
        probe_timeout_s: Seconds each connection attempt may take. Defaults
            to `PROBE_TIMEOUT_S`.
    """

    def __init__(
        self,
        config: ClusterConfig,
        jobs: Iterable[str],
        grace_s: float,
        period: float | None = None,
        exit: Callable[[int], None] = os._exit,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
    ):
        self._config = config
        self._jobs = tuple(jobs)
        self.grace_s = float(grace_s)
        self._period = min(1.0, self.grace_s / 5) if period is None else period
        self._exit = exit
        self._probe_timeout_s = probe_timeout_s
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
        error = self.error
        return {} if error is None else error.tasks

    def stop(self) -> None:
        """Stops watching, once no task is lost (while one is, the exit stays
        armed: the interpreter's own clean-up may wait on it)."""
        self._stop.set()

    def _look(self, timeout_s: float | None = None) -> TaskLostError | None:
        timeout_s = self._probe_timeout_s if timeout_s is None else timeout_s
        return find_lost(self._config, self._jobs, timeout_s, self.error)

    def _watch(self) -> None:
        while not self._stop.wait(self._period):
            self.error = self._look()
            if self.error is not None and self._armed():
                return

    def _armed(self) -> bool:
        """From a loss to the exit, or to the lost tasks' answering again
        (then False: the watch goes on)."""
        lost_at = time.monotonic()
        logging.error(
            "keras_psdist: %s This process ends in %g s unless it stops first%s.",
            self.error,
            self.grace_s,
            " or they answer again" if may_come_back(self.error) else "",
        )
        while True:
            left = lost_at + self.grace_s - time.monotonic()
            if left <= 0:
                break
            if not may_come_back(self.error):
                time.sleep(left)  # Not `self._stop`: nothing disarms it.
                continue
            time.sleep(min(self._period, left))
            # A look ends by the deadline, so the exit comes on time (a task
            # that answers does so within milliseconds).
            left = lost_at + self.grace_s - time.monotonic()
            if left <= 0:
                break
            found = self._look(min(self._probe_timeout_s, left))
            if found is None:
                logging.warning(
                    "keras_psdist: %s: %s answer%s again; this process goes on.",
                    self._config.task_name,
                    ", ".join(self.error.tasks),
                    "" if len(self.error.tasks) > 1 else "s",
                )
                self.error = None
                return False
            self.error = found
        print(f"keras_psdist: {self.error}", file=sys.stderr, flush=True)
        self._exit(EXIT_CODE)
        return True


def watch(topology, grace_s: float) -> ServerWatch | None:
    """A `ServerWatch` for a process of a cluster run, else None."""
    if topology.config is None:
        return None
    return ServerWatch(topology.config, server_jobs(topology.mode), grace_s)


def reporting(method):
    """Wraps Keras's `fit` / `evaluate` / `predict`: for a model under a
    keras_psdist strategy on a cluster, errors from a lost task become
    `TaskLostError` (or one of its subclasses)."""

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
