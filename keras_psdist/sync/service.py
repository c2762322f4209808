"""The chief's half of sync-replica training: the update service.

A thread on the chief (as TF1's `SyncReplicasOptimizer` ran its aggregation
in a queue-runner thread, so that the chief's own training is one worker
among the others and may itself be a backup). It pops tagged gradients from
the shared queue (see `protocol.py`) and, per element:

- a gradient tagged with the current global step is *fresh*: it is kept;
  once `replicas_to_aggregate` are kept, they are aggregated by the
  strategy's rule, applied with the Keras optimizer, the global step is
  incremented and every worker gets a token;
- a gradient with an older tag is *stale*: it is dropped and counted;
- `LEAVE`: the worker's `fit` ended. When too few workers remain to gather
  `replicas_to_aggregate` fresh gradients, the run is at its end: the
  remaining workers' gradients are dropped (counted as dropped at the end)
  and each is released at once, so no worker waits for an update that cannot
  come.
- the chief's own `LEAVE`: its `fit` ended, and so does the session (as
  TF1's chief stopped at its last step and closed the token queue): no update
  is made after it. The service writes `finished` and gives each worker
  still training an end token (`protocol.END`): a straggler stops at its next
  step or wait instead of running out its epochs with every gradient
  dropped, so the chief's `fit` (which waits for every worker to leave) and
  the job end without it. What it sends meanwhile is dropped at the end.
- `LOST` (sent by the chief's watchdog when a worker's heartbeat stops, see
  `cluster.liveness`): the worker no longer counts. If the others can still
  gather `replicas_to_aggregate` gradients (backup workers), the run goes on;
  else the service fails with `WorkerLostError` naming it, and every worker
  stops with that error. A lost worker whose gradients come again (it was
  restarted) counts again.

Sessions: each `fit` is a session; the service finishes a session when every
worker has left it, and keeps elements of a later session (a fast worker
already in its next `fit`) for that session.

Workers that join and leave (`SyncReplicaStrategy(max_workers=M)`, see
`resizing.py`): a gradient from a worker the session does not know is its
join; a `LEAVE` or `LOST` its leave. Each changes the counts
(`replicas_to_aggregate`, backups, `num_byzantine`) between two updates.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from keras_psdist._tf import ps_values
from keras_psdist.errors import WorkerLostError  # noqa: F401 (re-exported)
from keras_psdist.sync import protocol
from keras_psdist.sync.protocol import SyncReplicas
from keras_psdist.sync.resizing import Counts, Resizing
from keras_psdist.sync.staging import GradientStaging

# How often the service logs its counts, in seconds.
LOG_EVERY_S = 30.0
# What `log_counts` says at the end of a fit.
FIT_FINISHED = "finished a fit"
# A header `_pop_and_update` did not pop (it stopped at an earlier element).
_NOT_POPPED = -2
# The most updates `_pop_and_update` makes in one call (so the chief logs and
# its watchdog sees activity in between).
UPDATES_PER_CALL = 64


def counts_summary(
    what: str, step: int, counts: np.ndarray, name: Callable[[int], str]
) -> str:
    """One line: the updates made, and per worker its gradients applied and
    dropped, with what a drop means where there are any.

    Examples:

    >>> import numpy as np
    >>> print(counts_summary("finished a fit", 7, np.array([[7, 7], [0, 0], [0, 3]]),
    ...                      lambda w: f"worker:{w}"))
    ... # doctest: +NORMALIZE_WHITESPACE
    keras_psdist sync-replicas (finished a fit): 7 updates; gradients per
    worker (worker:0, worker:1): applied [7, 7]; dropped as stale [0, 0];
    dropped at the end [0, 3] (sent after the last update, when the chief's
    fit had ended or too few workers were still training to make another:
    not applied)
    """
    workers = ", ".join(name(w) for w in range(counts.shape[1]))
    parts = []
    for row, (label, meaning) in protocol.COUNT_NAMES.items():
        per_worker = [int(c) for c in counts[row]]
        parts.append(
            f"{label} {per_worker}"
            + (f" ({meaning})" if meaning and any(per_worker) else "")
        )
    updates = f"{step} update{'' if step == 1 else 's'}"
    return (
        f"keras_psdist sync-replicas ({what}): {updates}; gradients per worker "
        f"({workers}): " + "; ".join(parts)
    )


def say(message: str) -> None:
    """Says what is no fault as Keras says its callbacks' messages (its
    `Epoch 3: early stopping`): printed, or logged at INFO when Keras logs
    instead of printing."""
    if keras.config.is_interactive_logging_enabled():
        print(message, flush=True)
    else:
        logging.info(message)


class UpdateService:
    """Aggregates and applies workers' gradients on the chief.

    Args:
        sync: The run's shared state.
        update: `(slots, counts) -> None`: one update from the members'
            gradients, the strategy's rule over them (bound to `counts`, a
            `resizing.Counts`), applied with the Keras optimizer.
            `slots[m]` is member m's staged gradient (its slot's variables,
            on the ps task): inside the update's `tf.function`,
            `service.staging.read(slots[m])[v]` is its gradient of variable
            v (true scale, `None` where a variable has no gradient). The
            gradients stay on the ps task: see `staging.py`.
        update_in_trace: `(members, (replicas_to_aggregate,
            num_byzantine)) -> variables`, the same update's ops inside a
            `tf.function` (`members[m]`, member m's gradient list on the ps
            task), returning the variables it wrote; with it, an update of
            fresh gradients is popped, made and released in one call
            (`_pop_and_update`), straight from the popped tensors.
        scope: The context the update runs in (the strategy's scope).
        resizing: Derives the counts as workers join and leave, or None
            (the workers are fixed).
    """

    def __init__(
        self,
        sync: SyncReplicas,
        update: Callable[[list[list], Counts], None],
        resizing: Resizing | None = None,
        *,
        update_in_trace: Callable[[list[list], tuple], list] | None = None,
        scope: Callable[[], contextlib.AbstractContextManager] | None = None,
    ):
        self._sync = sync
        self._update_model = update
        self._update_in_trace = update_in_trace
        self._scope = scope or contextlib.nullcontext
        self._pop_and_update_fns: dict[tuple, Any] = {}
        self._made_an_update = False
        # Updates made by `_pop_and_update` in one call (the rest: one call
        # per popped element, and one for the update and its release).
        self.updates_in_one_call = 0
        self._resizing = resizing
        config = sync.config
        # The counts updates are made with now, and each change of them:
        # `(global step from which they hold, counts)`.
        self.counts_now = Counts(
            config.total_num_replicas, config.replicas_to_aggregate, None
        )
        self.changes: list[tuple[int, Counts]] = []
        self._pending_change = False
        workers = config.slots
        self._counts = np.zeros([3, workers], np.int64)
        self._step = int(sync.global_step.numpy())
        self._session = 0
        self._active: set[int] = set()
        self._lost: set[int] = set()
        self._members: list[tuple[int, int]] = []  # (worker, slot)
        self._later: list[tuple] = []  # elements of a later session
        self._at_end = False
        self._closed = False  # the chief's fit ended (see `_close`)
        self._session_done = threading.Condition()
        self._finished_sessions = 0
        self.error: BaseException | None = None
        self.last_activity = time.monotonic()
        self._last_log = time.monotonic()
        self._thread: threading.Thread | None = None
        self.staging: GradientStaging | None = None
        self._release_fn = None

    # ----------------------------------------------------------- control

    def start_session(self, session: int) -> None:
        """Starts (or, for a later `fit`, continues) serving `session`."""
        self._next_session = session
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="keras_psdist-sync-updates", daemon=True
            )
            self._thread.start()

    def wait_for_session(self, session: int, timeout: float) -> bool:
        """Blocks until every worker has left `session` (or the service died).

        Returns False if nothing happened for `timeout` seconds.
        """
        with self._session_done:
            while self._finished_sessions < session and self.error is None:
                if self._thread is None or not self._thread.is_alive():
                    logging.error(
                        "keras_psdist sync-replicas: the update service stopped "
                        "before session %d ended (active workers %s).",
                        session,
                        self.active_workers,
                    )
                    return False
                self._session_done.wait(timeout=1.0)
                if time.monotonic() - self.last_activity > timeout:
                    return False
        return True

    @property
    def active_workers(self) -> list[int]:
        """Workers still in the current session."""
        return sorted(self._active)

    @property
    def waiting_for(self) -> list[int]:
        """Active workers with no fresh gradient in the pending update."""
        have = {w for w, _ in self._members}
        return [w for w in sorted(self._active) if w not in have]

    # --------------------------------------------------------------- loop

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as e:  # noqa: BLE001 - reported to every worker
            self.error = e
            # With its message and stack: a TF error's repr has neither.
            logging.error(
                "keras_psdist sync-replicas: the update service failed: %r: %s",
                e,
                e,
                exc_info=True,
            )
            self._sync.poison(range(self._sync.config.slots))
        finally:
            with self._session_done:
                self._session_done.notify_all()

    def _serve(self) -> None:
        self._begin(self._next_session)
        while True:
            if self._can_pop_and_update():
                elements = self._pop_and_update()
            else:
                elements = [self._pop_element()]
            for element in elements:
                if self._process(element):
                    return

    def _process(self, element) -> bool:
        """Handles one popped element; True for SHUTDOWN (the loop ends)."""
        kind, worker, step, session, slot = element
        self.last_activity = time.monotonic()
        if kind == protocol.SHUTDOWN:
            return True
        if session > self._session:
            self._later.append(element)
            return False
        if session < self._session:
            self._late(kind, worker, session, slot)
            return False
        self._handle(kind, worker, step, slot)
        if not self._active:
            self._end_session()
            self._begin(self._session + 1)
        self._maybe_log()
        return False

    # ------------------------------------------ the common update, fused

    def _can_pop_and_update(self) -> bool:
        """Whether the next update may be popped, made and released in one
        call: nothing pending or queued aside, the counts settled, one
        gradient per worker per update, and one update made already (the
        optimizer builds its variables in its first, which cannot be in a
        branch)."""
        return (
            self._update_in_trace is not None
            and self._made_an_update
            and self.staging is not None
            and not self._members
            and not self._later
            and not self._at_end
            and not self._pending_change
            and self._sync.config.pushes_per_update == 1
            and self.counts_now.replicas_to_aggregate <= len(self._active)
        )

    def _pop_and_update(self) -> list[tuple]:
        """Pops, updates and releases on the ps task, in one call, for as
        long as each update's members come as expected.

        Each round pops up to `replicas_to_aggregate` elements; if they are
        that many fresh gradients of this step from distinct active workers
        (the common case), it makes the update and releases every worker
        (TF1's aggregate-apply-release, one graph), and the next round
        begins, still on the ps: no round trip to the chief between two
        updates. The call returns after `UPDATES_PER_CALL` updates, or at the
        first round with another element (a stale gradient, a marker: every
        event this loop must handle comes through the queue); that round
        stops popping there, and its elements are returned, to be handled
        one by one as `_pop_element`'s are.
        """
        counts = self.counts_now
        n = counts.replicas_to_aggregate
        key = (n, counts.num_byzantine)
        if key not in self._pop_and_update_fns:
            self._pop_and_update_fns[key] = self._make_pop_and_update(n, key)
        slots = [self.staging.take() for _ in range(n)]
        active = np.zeros([self._sync.config.slots], bool)
        active[sorted(self._active)] = True
        with self._scope():
            made, headers, new_counts = self._pop_and_update_fns[key](
                [self.staging.variables(slot) for slot in slots],
                tf.constant(self._step, tf.int64),
                tf.constant(self._session, tf.int64),
                tf.constant(active),
                tf.constant(self._counts),
            )
        made, headers = int(made.numpy()), headers.numpy()
        self.last_activity = time.monotonic()
        self._counts = new_counts.numpy()
        self._step += made
        self.updates_in_one_call += made
        if made:
            self._maybe_log()
        elements = []
        for (kind, worker, step, session), slot in zip(headers, slots, strict=True):
            if kind != protocol.GRADIENT:
                self.staging.give_back(slot)
            if kind != _NOT_POPPED:
                slot_or_none = slot if kind == protocol.GRADIENT else None
                elements.append(
                    (int(kind), int(worker), int(step), int(session), slot_or_none)
                )
        return elements

    def _make_pop_and_update(self, n: int, key: tuple):
        sync, staging = self._sync, self.staging
        workers = sync.config.slots
        update_in_trace = self._update_in_trace

        @tf.function
        def pop_and_update(slot_variables, step, session, active, counts):
            # On the ps task, the loop, its branches and their bookkeeping
            # too: only the inputs (known at the call) come from the chief,
            # and only the outcome goes back. A predicate or a counter on the
            # chief between the pop and the update would cost a round trip
            # each on the update's critical path.
            with tf.device(sync.device):
                # The inputs' copies on the ps. A lowered `while_loop` or
                # `cond` puts an input's `Enter` (`Switch`) beside the input:
                # one left on the chief would bring every round's predicate
                # to the chief and the value back.
                step, session, active, counts = (
                    tf.identity(t) for t in (step, session, active, counts)
                )
                # Made here, on the ps: not an input from the chief.
                not_popped = tf.fill([n, 4], tf.constant(_NOT_POPPED, tf.int64))

                def another(made, headers, step, counts, fresh):
                    return tf.logical_and(fresh, made < UPDATES_PER_CALL)

                def round_(made, headers, step, counts, fresh):
                    headers, fresh, counts = one_round(
                        slot_variables, step, session, active, counts, not_popped[0]
                    )
                    made += tf.cast(fresh, tf.int64)
                    return made, headers, step + tf.cast(fresh, tf.int64), counts, fresh

                made, headers, _, counts, fresh = tf.while_loop(
                    another,
                    round_,
                    [tf.constant(0, tf.int64), not_popped, step, counts, True],
                    parallel_iterations=1,
                )
                # Ended after `most` updates: the last round's elements are
                # applied, none is left to handle.
                return made, tf.where(fresh, not_popped, headers), counts

        def one_round(slot_variables, step, session, active, counts, not_popped_one):
            """One round: `(headers, made, counts after it)`."""
            fresh = tf.constant(True)
            seen = tf.zeros([workers], tf.bool)
            headers, popped = [], []
            for _ in slot_variables:
                header, components = tf.cond(
                    fresh,
                    staging.pop_values,
                    lambda: staging.nothing_popped(not_popped_one),
                )
                worker = tf.clip_by_value(header[1], 0, workers - 1)
                fresh = tf.reduce_all(
                    tf.stack(
                        [
                            fresh,
                            tf.equal(header[0], protocol.GRADIENT),
                            tf.equal(header[1], worker),
                            tf.equal(header[2], step),
                            tf.equal(header[3], session),
                            tf.gather(active, worker),
                            tf.logical_not(tf.gather(seen, worker)),
                        ]
                    )
                )
                seen = tf.logical_or(seen, tf.one_hot(worker, workers, True, False))
                headers.append(header)
                popped.append(components)
            stacked = tf.stack(headers)

            def update():
                # Straight from the dequeued tensors: no slot's write and
                # read on the critical path.
                written = update_in_trace(
                    [staging.unflatten(components) for components in popped], key
                )
                applied = tf.reduce_sum(
                    tf.one_hot(stacked[:, 1], workers, dtype=tf.int64), axis=0
                )
                new_counts = counts + tf.stack(
                    [applied, tf.zeros_like(applied), tf.zeros_like(applied)]
                )
                # The workers read the variables once released: after every
                # write of the update.
                with tf.control_dependencies(_reads_after_writes(written)):
                    release_ops(sync, step + 1, new_counts)
                    return tf.identity(new_counts)

            def keep():
                # Handled one by one in Python: each popped gradient waits in
                # its slot.
                for slot, header, components in zip(
                    slot_variables, headers, popped, strict=True
                ):
                    staging.write_ops(slot, header, components)
                return tf.identity(counts)

            return stacked, fresh, tf.cond(fresh, update, keep)

        return pop_and_update

    def _pop_element(self):
        if self._later and self._later[0][3] == self._session:
            return self._later.pop(0)
        if self.staging is None:
            sync = self._sync
            sync.wait_for_layout()
            self.staging = GradientStaging(
                sync.device, sync._gradient_queue, sync.layout, sync.shapes
            )
        slot = self.staging.take()
        header = self.staging.pop_into(slot)
        kind, worker, step, session = (int(c) for c in header.numpy())
        if kind != protocol.GRADIENT:
            self.staging.give_back(slot)
            slot = None
        return kind, worker, step, session, slot

    def _drop(self, row: int, worker: int, slot: int) -> None:
        """Counts a gradient dropped and frees its slot."""
        self._count(row, worker)
        self.staging.give_back(slot)

    def _late(self, kind: int, worker: int, session: int, slot) -> None:
        """An element of a session that has ended (its worker restarted after
        the others left, or left over from a failed one): nothing will be
        updated for it, so its worker gets that session's end token."""
        if kind == protocol.GRADIENT:
            self.staging.give_back(slot)
            self._count(protocol.DROPPED_AT_END, worker)
            self._wake(worker, protocol.END + session)

    def _handle(self, kind, worker, step, slot) -> None:
        if kind == protocol.LEAVE:
            self._active.discard(worker)
            if worker == self._sync.worker:
                self._close()
            else:
                self._check_end()
            return
        if kind == protocol.LOST:
            self._lose(worker)
            return
        if worker in self._lost:
            self._lost.discard(worker)
            self._active.add(worker)
            self._publish_lost()
            logging.warning(
                "keras_psdist sync-replicas: %s is back and sends gradients again.",
                self._sync.config.name(worker),
            )
            self._membership_changed(joined=True)
        elif self._resizing is not None and worker not in self._active:
            if not self._at_end:
                # Its first gradient of this session: it joins.
                self._active.add(worker)
                logging.warning(
                    "keras_psdist sync-replicas: %s joined at global step %d.",
                    self._sync.config.name(worker),
                    self._step,
                )
                self._membership_changed(joined=True)
        if self._at_end:
            self._drop(protocol.DROPPED_AT_END, worker, slot)
            self._free(worker)
            return
        if step < self._step:
            self._drop(protocol.DROPPED_STALE, worker, slot)
            # Its update has been made: wake it with the current step. (The
            # token of that update may not be in its queue: a release skips
            # a queue that still holds an older token; see
            # `SyncReplicas._wait_for_release`.)
            self._wake(worker, self._step)
            return
        if step > self._step:
            raise RuntimeError(
                f"{self._sync.config.name(worker)} sent a gradient for step "
                f"{step}, ahead of the "
                f"global step {self._step}. Is another chief running on the same "
                "parameter servers? Start each run on fresh ps tasks."
            )
        self._members.append((worker, slot))
        if len(self._members) == self.counts_now.replicas_to_aggregate:
            self._update()

    def _update(self) -> None:
        self._update_model(
            [self.staging.variables(s) for _, s in self._members], self.counts_now
        )
        self._made_an_update = True
        for worker, slot in self._members:
            self._count(protocol.APPLIED, worker)
            self.staging.give_back(slot)
        self._members = []
        self._step += 1
        if self._pending_change:
            # Between two updates: the workers released next step under
            # the new counts.
            self._derive_counts()
        self._release(self._step, self._counts)

    # ------------------------------------------------ workers join, leave

    def _membership_changed(self, joined: bool = False) -> None:
        """The active workers changed: the counts follow (see `resizing.py`).

        A join changes them after the pending update (it never waits for
        more gradients than it began with); a leave at once (it never waits
        for a worker that is gone), the update made now if it has the
        gradients the new counts ask for.
        """
        if self._resizing is None or self._at_end:
            return
        self._pending_change = True
        if joined and self._members:
            return  # Right after the pending update.
        self._derive_counts(growing=joined)
        to_aggregate = self.counts_now.replicas_to_aggregate
        if self._members and len(self._members) >= to_aggregate:
            # The first gradients make the update; any others are a
            # backup's.
            extra = self._members[to_aggregate:]
            self._members = self._members[:to_aggregate]
            self._update()
            for worker, slot in extra:
                self._drop(protocol.DROPPED_STALE, worker, slot)
                self._wake(worker, self._step)

    def _derive_counts(self, growing: bool = True) -> None:
        """The counts for the active workers. `growing` (at a session's
        start, or after a join): a rule that cannot run on so few waits for
        the fewest workers it runs on; after a leave, it stops the run."""
        if not self._active:
            return  # Nobody trains (the session is over): nothing to count.
        self._pending_change = False
        active = len(self._active)
        waiting = False
        try:
            counts = self._resizing.counts(active)
        except WorkerLostError:
            if not growing:
                raise
            counts = self._resizing.counts_to_wait_for(active)
            waiting = True
        if counts == self.counts_now:
            return
        self.counts_now = counts
        self.changes.append((self._step, counts))
        names = self._sync.config.names(sorted(self._active))
        if waiting:
            say(
                f"keras_psdist sync-replicas: {active} worker(s) ({names}) are too "
                f"few for the rule; from global step {self._step} the update "
                f"waits for the {counts.describe()} as they join."
            )
        else:
            say(
                f"keras_psdist sync-replicas: from global step {self._step}, "
                f"{counts.describe()} ({names})."
            )

    def _lose(self, worker: int) -> None:
        if worker not in self._active:
            return  # It had left, or was already lost.
        self._active.discard(worker)
        self._lost.add(worker)
        self._publish_lost()
        config = self._sync.config
        logging.error(
            "keras_psdist sync-replicas: %s is lost (no heartbeat); "
            "updates go on with %s.",
            config.name(worker),
            config.names(sorted(self._active)),
        )
        if self._at_end:
            return
        self._membership_changed()
        to_aggregate = self.counts_now.replicas_to_aggregate
        if len(self._active) * config.pushes_per_update < to_aggregate:
            raise WorkerLostError(
                f"{config.name(worker)} was lost (its heartbeat stopped), and the "
                f"remaining workers ({config.names(sorted(self._active))}) cannot "
                "make an update "
                f"of replicas_to_aggregate={to_aggregate}. "
                "Restart it (`keras-psdist launch --max-restarts`), or train with "
                "backup workers (replicas_to_aggregate < total_num_replicas) to "
                "go on without a lost worker."
            )

    def _publish_lost(self) -> None:
        mask = [int(w in self._lost) for w in range(self._sync.config.slots)]
        with tf.device(self._sync.device):
            self._sync.lost.assign(tf.constant(mask, tf.int64))

    def _check_end(self) -> None:
        config = self._sync.config
        try:
            self._membership_changed()
            too_few_for_the_rule = ""
        except WorkerLostError as e:
            # A run whose counts follow its workers, its rule unable to run
            # on those left (the median with num_byzantine=1 on 2): as with
            # too few for replicas_to_aggregate, the session is at its end.
            too_few_for_the_rule = f" ({e})"
        to_aggregate = self.counts_now.replicas_to_aggregate
        if self._at_end or (
            not too_few_for_the_rule
            and len(self._active) * config.pushes_per_update >= to_aggregate
        ):
            return
        self._at_end = True
        if self._active:
            logging.info(
                "keras_psdist sync-replicas: only workers %s are still training, "
                "too few for replicas_to_aggregate=%d%s: their remaining "
                "gradients are dropped and they are released at once.",
                sorted(self._active),
                to_aggregate,
                too_few_for_the_rule,
            )
        self._drop_pending()
        # Whoever is waiting now may be waiting for an update that will not
        # come; every later gradient gets its own free pass when popped.
        for worker in self._active:
            self._free(worker)

    def _close(self) -> None:
        """The chief's fit ended: so does the session, for every worker.

        Whoever still trains (a straggler; a worker counted lost, which may
        be alive) gets the end token: its wait ends, and its `fit` stops at
        the step's end instead of running out its epochs, every gradient of
        them dropped. `finished` is written first: a worker that flushes its
        token queue at the start of its `fit` reads it after the flush.
        """
        self._closed = True
        self._drop_pending()
        self._at_end = True
        self._sync.mark_finished(self._session)
        still = sorted(self._active | self._lost)
        for worker in still:
            self._wake(worker, protocol.END + self._session)
        if still:
            # (A worker that has just run its last step may still be here:
            # its leave is on the way.)
            say(
                f"keras_psdist sync-replicas: the chief finished its fit at "
                "global step "
                f"{self._step}: no update comes after its last, so the workers "
                f"still in this fit ({self._sync.config.names(still)}) stop at "
                "their next step; their remaining steps would only be dropped."
            )

    def _drop_pending(self) -> None:
        for worker, slot in self._members:
            self._drop(protocol.DROPPED_AT_END, worker, slot)
        self._members = []

    def _begin(self, session: int) -> None:
        self._session = session
        # A lost worker counts again once its gradients come again.
        if self._resizing is None:
            self._active = set(range(self._sync.config.total_num_replicas)) - self._lost
        else:
            # The registry's members; one that comes later joins then.
            self._active = set(self._resizing.members()) - self._lost
        for _, slot in self._members:  # (none: a session ends with none pending)
            self.staging.give_back(slot)
        self._members = []
        self._at_end = False
        self._closed = False
        if self._resizing is not None:
            self._derive_counts()

    def _end_session(self) -> None:
        self._publish()
        self.log_counts(FIT_FINISHED)
        with self._session_done:
            self._finished_sessions = self._session
            self._session_done.notify_all()

    # -------------------------------------------------------- bookkeeping

    def _count(self, row: int, worker: int) -> None:
        self._counts[row, worker] += 1
        if row != protocol.APPLIED:
            self._publish()

    def _publish(self) -> None:
        with tf.device(self._sync.device):
            self._sync.counts.assign(self._counts)

    def _release(self, step: int, counts: np.ndarray) -> None:
        """Publishes the new step and counts, then gives every worker a token."""
        if self._release_fn is None:
            self._release_fn = _make_release(self._sync)
        self._release_fn(tf.constant(step, tf.int64), tf.constant(counts))

    def _free(self, worker: int) -> None:
        """Lets `worker`'s current (or next) wait end without an update (and,
        once the chief's fit has ended, its fit too)."""
        self._wake(
            worker, protocol.END + self._session if self._closed else protocol.FREE_PASS
        )

    def _wake(self, worker: int, token: int) -> None:
        protocol.enqueue(
            self._sync.device,
            self._sync.token_queues[worker],
            [tf.constant(token, tf.int64)],
        )

    def _maybe_log(self) -> None:
        if time.monotonic() - self._last_log > LOG_EVERY_S:
            self.log_counts("progress")

    def log_counts(self, what: str) -> None:
        self._last_log = time.monotonic()
        summary = counts_summary(what, self._step, self._counts, self._sync.config.name)
        # Drops are no fault (backup workers are there to be dropped), but
        # none is silent, as TF1's were: the end of a fit is said like the
        # callbacks' summaries; progress is logged.
        if what == FIT_FINISHED:
            say(summary)
        else:
            logging.info(summary)


def _make_release(sync: SyncReplicas):
    @tf.function
    def release(step, counts):
        release_ops(sync, step, counts)

    return release


def release_ops(sync: SyncReplicas, step, counts) -> None:
    """Publishes the new step and counts, then gives every worker a token
    (in a trace)."""
    with tf.device(sync.device):
        assigned = [sync.global_step.assign(step), sync.counts.assign(counts)]
        with tf.control_dependencies(assigned):
            for queue in sync.token_queues:
                # A worker only needs one token newer than its tag; the
                # check keeps a slow worker's queue from growing.
                size = tf.raw_ops.QueueSizeV2(handle=queue)
                tf.cond(
                    tf.equal(size, 0),
                    lambda q=queue: _enqueue_op(q, step),
                    lambda: tf.no_op(),
                )


def _reads_after_writes(variables) -> list:
    """Reads of `variables` (each on its own device), after the writes
    before them in the trace: what the release waits for."""
    reads = []
    for variable in resource_variables(variables):
        with tf.device(variable.device):
            reads.append(
                tf.raw_ops.ReadVariableOp(
                    resource=variable.handle, dtype=variable.dtype
                )
            )
    return reads


def resource_variables(variables) -> list:
    """The resource variables behind model variables (a Keras variable's
    backend variable, a partitioned one's shards, a ps variable's own)."""
    out = []
    for variable in variables:
        if isinstance(variable, keras.Variable):
            variable = variable.value  # the backend's variable
        shards = getattr(variable, "shards", None)
        if shards is not None:
            out.extend(resource_variables(shards))
        elif isinstance(variable, ps_values.AggregatingVariable):
            out.extend(resource_variables([variable.get()]))
        elif hasattr(variable, "values") and not hasattr(variable, "handle"):
            out.extend(resource_variables(variable.values))
        else:
            out.append(variable)
    return out


def _enqueue_op(queue, step):
    tf.raw_ops.QueueEnqueueV2(handle=queue, components=[step])
    return tf.no_op()
