"""Bounded staleness for async training: `PSStrategy(mode="between-graph", max_staleness=s)`.

`BoundedStaleness` is one worker's part (a `keras_psdist.modes.Training`,
built by `keras_psdist.modes.bounded_staleness`).

Stale synchronous parallel (Ho et al., "More Effective Distributed ML via a
Stale Synchronous Parallel Parameter Server", NeurIPS 2013), on two int64
variables on the first ps task that every worker opens by name:

- `clocks[w]`: how many steps worker w has finished;
- `active[w]`: 1 while worker w is in its `fit`, 0 once it has left.

Before each step, a worker whose clock is more than `s` ahead of the slowest
active worker's waits (polling, in Python, between steps: nothing blocks on
the ps). When it applies the gradient of its step `c`, the gradient's
*staleness* is how many steps beyond `c` the fastest active worker has
finished: the gradient is applied only if that is at most `s`, else dropped
and counted.
Keras's own apply runs otherwise unchanged, on this worker, as in plain async.

With the wait in place no gradient is dropped: every worker is at most `s`
ahead of this worker's clock while this worker computes. The check is the
guarantee itself, not a heuristic: a gradient older than `s` is never
applied, and `counts()` says whether any was dropped.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import tensorflow as tf
from absl import logging

from keras_psdist.cluster.shared_variables import SharedVariables
from keras_psdist.sync import per_worker
from keras_psdist.sync.protocol import local_variable
from keras_psdist.variables.staged_merge import in_replica_control_flow

_POLL_S = 0.005


class BoundedStaleness:
    """One worker's part in bounded-staleness async training.

    Args:
        strategy: The `PSStrategy`.
        max_staleness: The bound s, in steps.
        worker: This process's index among the training processes.
        num_workers: How many processes train.
        device: Where the shared clocks live (the first parameter device).
        shared: Opens (or, on the chief, creates) shared variables.
        local_device: This process's CPU, for its private counters.
        step_timeout: Seconds a worker waits for the slowest before raising.
        heartbeats: This process's `cluster.liveness.Heartbeats`: a lost
            worker is not waited for. None: every active worker counts.
        names: The workers' task names by index, for messages
            (`Topology.training_task_names`).
        namespace: The prefix of the clocks' shared names: one per run of
            a script (`cluster.shared_variables.run_namespace`).
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        max_staleness: int,
        worker: int,
        num_workers: int,
        device: str,
        shared: SharedVariables,
        local_device: str,
        step_timeout: float,
        heartbeats=None,
        *,
        names,
        namespace: str = "keras_psdist/staleness",
    ):
        self._strategy = strategy
        self.names = tuple(names)
        self.max_staleness = max_staleness
        self.worker = worker
        self.num_workers = num_workers
        self._step_timeout = step_timeout
        self._heartbeats = heartbeats
        self.clocks = shared.create_int64(
            device, f"{namespace}/clocks", [0] * num_workers
        )
        self.active = shared.create_int64(
            device, f"{namespace}/active", [1] * num_workers
        )
        with tf.init_scope(), tf.device(local_device):
            # applied, dropped, waits, largest staleness applied
            self._stats = local_variable(tf.zeros([4], tf.int64), "staleness_stats")
        self._in_session = False

    # ----------------------------------------------------- inside the step

    def worker_apply(self, optimizer, apply, grads, variables):
        """Applies this worker's gradient with Keras's `apply` if it is fresh."""
        if in_replica_control_flow():
            raise ValueError(
                "max_staleness checks each gradient once per step, outside "
                "control flow; this optimizer applies them inside a `cond` "
                f"({type(optimizer).__name__}). Use a plain optimizer."
            )
        return per_worker.once_per_worker(
            lambda grads, variables: self._apply_if_fresh(apply, grads, variables),
            grads,
            variables,
        )

    def _apply_if_fresh(self, apply, grads, variables):
        clocks = self.clocks.read_value()
        active = self.active.read_value()
        own = clocks[self.worker]
        fastest = tf.reduce_max(tf.where(active > 0, clocks, own))
        # Others' steps finished beyond this one: a worker at clock c + 1 has
        # finished step c, this gradient's own step, concurrently.
        staleness = tf.maximum(fastest - own - 1, 0)
        fresh = staleness <= self.max_staleness

        def apply_fresh():
            apply(grads, variables)
            return self._count(0, staleness)

        def drop():
            return self._count(1, staleness)

        return tf.cond(fresh, apply_fresh, drop)

    def _count(self, row, staleness):
        added = self._stats.assign_add(tf.one_hot(row, 4, dtype=tf.int64))
        if row == 0:
            largest = tf.maximum(added[3], staleness)
            with tf.control_dependencies(
                [self._stats.scatter_nd_update([[3]], [largest])]
            ):
                return tf.identity(staleness)
        with tf.control_dependencies([added]):
            return tf.identity(staleness)

    # ------------------------------------------------- between the steps

    @contextlib.contextmanager
    def session(self, model=None):
        """One `fit`: this worker is active until it leaves."""
        if self._in_session:
            yield
            return
        self._catch_up()
        self._set(self.active, 1)
        self._in_session = True
        try:
            yield
        finally:
            self._in_session = False
            self._set(self.active, 0)
            stats = self.counts()
            logging.info(
                "keras_psdist max_staleness=%d: %s applied %d gradients, "
                "dropped %d as older than the bound, waited %d times for slower "
                "workers; largest staleness applied %d.",
                self.max_staleness,
                self.names[self.worker],
                stats["applied"],
                stats["dropped_stale"],
                stats["waits"],
                stats["largest_staleness"],
            )

    def _alive_active(self):
        """`active`, with lost workers (no heartbeat) left out."""
        active = self.active.numpy().copy()
        if self._heartbeats is not None:
            for w in self._heartbeats.lost():
                active[w] = 0
        return active

    def _catch_up(self) -> None:
        """A worker that (re)joins behind the slowest active one starts at
        its clock: it was not there for the steps in between (a restarted
        worker), and the others must not wait for it to redo them."""
        clocks = self.clocks.numpy()
        active = self._alive_active()
        active[self.worker] = 0
        others = clocks[active > 0]
        if others.size and others.min() > clocks[self.worker]:
            self._set(self.clocks, int(others.min()))

    def check_steps(self, steps: int) -> None:
        """Any number of steps works: every step applies its own update."""

    def before_step(self) -> None:
        """Waits while this worker is more than `max_staleness` ahead."""
        deadline = None
        while True:
            clocks = self.clocks.numpy()
            active = self._alive_active()
            own = clocks[self.worker]
            others = clocks[active > 0]
            slowest = others.min() if others.size else own
            if own - slowest <= self.max_staleness:
                return
            if deadline is None:
                deadline = time.monotonic() + self._step_timeout
                self._stats.assign_add(tf.constant([0, 0, 1, 0], tf.int64))
            if time.monotonic() > deadline:
                behind = [
                    w
                    for w in range(self.num_workers)
                    if active[w] and own - clocks[w] > self.max_staleness
                ]
                raise TimeoutError(
                    f"{self.names[self.worker]} (at step {own}) waited "
                    f"{self._step_timeout:g} s for "
                    f"{', '.join(self.names[w] for w in behind)} (at steps "
                    f"{[int(clocks[w]) for w in behind]}) to come within "
                    f"max_staleness={self.max_staleness}. Are they running? "
                    "Raise PSStrategy(step_timeout=...) if their steps "
                    "legitimately take this long."
                )
            time.sleep(_POLL_S)

    def progress(
        self, steps_run: int | None = None, steps_planned: int | None = None
    ) -> bool:
        """Advances this worker's clock after a finished step (the step
        counts are `SyncTraining.progress`'s, unused here); never stops the
        `fit`."""
        tf.raw_ops.ResourceScatterAdd(
            resource=self.clocks.handle,
            indices=tf.constant([self.worker]),
            updates=tf.constant([1], tf.int64),
        )
        return False

    def checkpointed(self) -> dict[str, tf.Module]:
        """Nothing beyond the weights: the clocks are shared, the counts
        this process's own."""
        return {}

    def counts(self) -> dict[str, Any]:
        """This worker's counts: applied, dropped as stale, waits, and the
        largest staleness of an applied gradient."""
        applied, dropped, waits, largest = (int(x) for x in self._stats.numpy())
        return {
            "applied": applied,
            "dropped_stale": dropped,
            "waits": waits,
            "largest_staleness": largest,
        }

    def _set(self, variable, value):
        tf.raw_ops.ResourceScatterUpdate(
            resource=variable.handle,
            indices=tf.constant([self.worker]),
            updates=tf.constant([value], tf.int64),
        )
