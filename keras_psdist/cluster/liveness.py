"""Which worker processes of a between-graph run are alive: heartbeats.

A worker killed with SIGKILL says nothing: the others only see that its
gradients stop coming. In a between-graph run (`PSStrategy(mode="between-graph")`,
`SyncReplicaStrategy`) every training process therefore beats: a thread
adds 1 to its own slot of an int64 vector on the first ps task, every
`timeout / 5` seconds (at most every second). A process that reads the vector
declares a worker lost when its count, once it has started, has not moved for
`timeout` seconds, and back when it moves again (a restarted worker, which
opens the same vector).

What each mode does with it:

| mode                 | a lost worker                                        |
|----------------------|------------------------------------------------------|
| async                | the chief logs it (and its return); nobody waits for |
|                      | it anyway                                            |
| async, max_staleness | no longer counts as the slowest: the others stop     |
|                      | waiting for it                                       |
| sync replicas        | the chief stops waiting for it: with backup workers  |
|                      | the run goes on; without, every worker stops with an |
|                      | error naming it. A lost chief stops every worker     |
|                      | with an error naming the chief.                      |

The beat is a plain eager `ResourceScatterAdd` (it never blocks on the ps),
from a daemon thread stopped at exit.

The chief's `LossReporter` logs what every look at the beats in its process
finds, whoever looks (its own thread each second, the staleness bound between
steps): a worker the process treated as lost is logged, even when it came
back before the reporter's next look.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable, Sequence

import tensorflow as tf
from absl import logging

from keras_psdist.cluster import task_loss
from keras_psdist.cluster.shared_variables import SharedVariables


class _Background:
    """A daemon thread of this object's, stopped by `stop()` or at exit."""

    def _start_thread(self, target, name: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=target, name=name, daemon=True)
        self._thread.start()
        atexit.register(self.stop)

    def stop(self) -> None:
        """Stops the thread (waits up to 5 s for it)."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)


class Heartbeats(_Background):
    """This process's heartbeat, and its view of every worker's.

    Args:
        shared: Opens (or, on the chief, creates) the shared vector.
        device: Where it lives (the first parameter device).
        worker: This process's index among the training processes.
        num_workers: How many processes train.
        timeout: Seconds without a beat after which a worker is lost.
        server_watch: This process's `cluster.task_loss.ServerWatch`: while
            it finds a ps lost, this process does not beat (a beat would
            wait on the lost ps); it beats again if the ps answers again (a
            link that came back). Defaults to `None`: beats go on however
            they fail.
        names: The workers' task names by index (`"chief:0"`, `"worker:0"`,
            ...), for messages (`Topology.training_task_names`).
        start: Whether to start beating now; else `start()` does.
    """

    def __init__(
        self,
        shared: SharedVariables,
        device: str,
        worker: int,
        num_workers: int,
        timeout: float,
        *,
        names: Sequence[str],
        server_watch: task_loss.ServerWatch | None = None,
        start: bool = True,
    ):
        self.worker = worker
        self.names = tuple(names)
        self._server_watch = server_watch
        self.num_workers = num_workers
        self.timeout = float(timeout)
        self.period = min(1.0, self.timeout / 5)
        self._device = device
        self.beats = shared.create_int64(
            device, "keras_psdist/liveness/beats", [0] * num_workers
        )
        # Held for a whole look (read included): looks applied out of order
        # would move a count back and forth, and a silent worker would seem
        # to beat again. Re-entrant: `on_change` callbacks may ask `silent_for`.
        self._lock = threading.RLock()
        now = time.monotonic()
        self._last_count = [None] * num_workers
        self._last_change = [now] * num_workers
        self._cached = None
        self._lost: list[int] = []
        self._callbacks: list[Callable[[list[int], list[int]], None]] = []
        # Elastic membership: the slots to watch (members), else every one.
        self.members: Callable[[], Sequence[int]] | None = None
        if start:
            self.start()

    def start(self) -> None:
        """Starts beating (at construction, unless `start=False`: an
        elastic worker beats once it is admitted)."""
        self._start_thread(self._beat_forever, "keras_psdist-heartbeat")

    @property
    def servers_lost(self) -> dict[str, str]:
        """The ps tasks the server watch found lost (task -> where, why)."""
        return {} if self._server_watch is None else self._server_watch.lost

    def _beat_forever(self) -> None:
        while not self._stop.is_set():
            # While a ps is lost the watch reports it (or stands down when it
            # answers again); a beat would wait on it.
            if not self.servers_lost:
                try:
                    self.beat()
                except tf.errors.OpError as e:  # a dead ps: the watch reports it
                    logging.warning("keras_psdist heartbeat failed: %s", e)
            self._stop.wait(self.period)

    def beat(self) -> None:
        """One beat of this process."""
        with tf.device(self._device):
            tf.raw_ops.ResourceScatterAdd(
                resource=self.beats.handle,
                indices=tf.constant([self.worker]),
                updates=tf.constant([1], tf.int64),
            )

    def on_change(self, callback: Callable[[list[int], list[int]], None]) -> None:
        """Calls `callback(newly_lost, back)` from each look (`lost()`, in
        whichever thread) that finds a worker newly lost or back, in the
        order of the looks, before that look returns."""
        with self._lock:
            self._callbacks.append(callback)

    def lost(self) -> list[int]:
        """Workers (other than this one) that have beaten, but not for
        `timeout` seconds. A worker that has not started yet is not lost:
        `step_timeout` covers one that never comes."""
        with self._lock:
            # Called between steps: a fresh read every half period is enough.
            now = time.monotonic()
            if self._cached is not None and now - self._cached[0] < self.period / 2:
                return list(self._cached[1])
            counts = self.beats.numpy()
            watched = None if self.members is None else set(self.members())
            lost = []
            for w, count in enumerate(counts.tolist()):
                if watched is not None and w not in watched:
                    # Not a member (free, or left cleanly): not lost.
                    self._last_count[w] = count
                    self._last_change[w] = now
                    continue
                if count != self._last_count[w]:
                    self._last_count[w] = count
                    self._last_change[w] = now
                elif (
                    w != self.worker
                    and count > 0
                    and now - self._last_change[w] > self.timeout
                ):
                    lost.append(w)
            self._cached = (now, lost)
            newly_lost = [w for w in lost if w not in self._lost]
            back = [w for w in self._lost if w not in lost]
            self._lost = lost
            if newly_lost or back:
                for callback in self._callbacks:
                    callback(newly_lost, back)
            return list(lost)

    def never_started(self) -> list[int]:
        """Workers (other than this one) that have not beaten once, as of the
        last `lost()`."""
        with self._lock:
            if self.members is not None:
                return []  # Elastic: a slot nobody took is not missing.
            return [
                w
                for w, count in enumerate(self._last_count)
                if w != self.worker and not count
            ]

    def silent_for(self, worker: int) -> float:
        """Seconds since `worker`'s count last moved (as of the last `lost()`)."""
        with self._lock:
            return time.monotonic() - self._last_change[worker]


class LossReporter(_Background):
    """Logs, on the chief of an async run, when a worker is lost or back.

    It logs what any look at `heartbeats` finds (`Heartbeats.on_change`), and
    looks itself every `every` seconds so that someone does.

    Args:
        heartbeats: This process's `Heartbeats`.
        every: Seconds between its own looks.
    """

    def __init__(self, heartbeats: Heartbeats, every: float = 1.0):
        self._heartbeats = heartbeats
        self._every = every
        self.lost: set[int] = set()
        self.ever_lost: set[int] = set()
        self._started = time.monotonic()
        self._checked_start = False
        heartbeats.on_change(self._report)
        self._start_thread(self._watch, "keras_psdist-liveness")

    def _watch(self) -> None:
        while not self._stop.wait(self._every):
            if self._heartbeats.servers_lost:
                continue  # Reading the beats would wait on the lost ps.
            try:
                self.check()
            except tf.errors.OpError as e:  # a dead ps is reported elsewhere
                logging.warning("keras_psdist liveness check failed: %s", e)

    def check(self) -> None:
        """One look at the heartbeats (which reports what it finds); once,
        `timeout` seconds in, a warning for workers that never started."""
        self._heartbeats.lost()
        if self._checked_start:
            return
        if time.monotonic() - self._started < self._heartbeats.timeout:
            return
        self._checked_start = True
        missing = self._heartbeats.never_started()
        if missing:
            names = ", ".join(self._heartbeats.names[w] for w in missing)
            logging.warning(
                "keras_psdist: not started training %.0f s after the chief: "
                "%s. Every worker task of a between-graph run must run "
                "this script (`keras-psdist launch --mode between-graph`). If "
                "those tasks run `keras-psdist serve`, the cluster is an "
                "in-graph one: use PSStrategy() (mode='in-graph') there. "
                "Until they start, this run sees only its own share of the "
                "data.",
                self._heartbeats.timeout,
                names,
            )

    def _report(self, newly_lost: list[int], back: list[int]) -> None:
        for w in newly_lost:
            logging.error(
                "keras_psdist: %s is lost (no heartbeat for %.0f s); "
                "training goes on without it.",
                self._heartbeats.names[w],
                self._heartbeats.silent_for(w),
            )
        for w in back:
            logging.warning(
                "keras_psdist: %s is back (its heartbeat resumed).",
                self._heartbeats.names[w],
            )
        self.ever_lost.update(newly_lost)
        self.lost = (self.lost | set(newly_lost)) - set(back)
