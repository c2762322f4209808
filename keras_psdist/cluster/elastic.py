"""Workers that join and leave a running between-graph async job:
`PSStrategy(mode="between-graph", max_workers=M)`.

TensorFlow's runtime fixes nothing here: a ps task's server knows only its
own address, and each worker connects to the ps tasks and itself, so a
worker at a new address can reach the variables at any time. What fixed
the set of workers was ours: every per-worker structure (heartbeats, the
pieces of each batch) was sized by the TF_CONFIG's worker list. With
`max_workers=M` they are sized by M, and who trains is data on the first
ps task, the `SlotTable`:

- `state[M]`: each slot (`worker:k`) free, a member, or left;
- `applied[M]`: the updates each slot has applied (counted in the same step
  function as the update, so the count is the update's);
- `holder[M]`, `epoch[M]`: each slot's holder (a random token of the
  process that took it) and its number of changes;
- `version`: one more at every change.

A process joins by starting with a TF_CONFIG that lists its own address as
`worker:k` (k < M; the workers before it may be listed with any address,
they are not dialled). Before it beats or touches any shared state, it is
admitted (`SlotTable.admit`): refused with a `JoinRefusedError` naming why
if k >= M, if the registry was made for another M, or if slot k (the chief's
slot included) belongs to a worker whose heartbeat still moves; a slot
whose holder left, or stopped beating for longer than a live process can
be silent (`heartbeat_timeout`, plus the time its server watch takes to
find a ps back or end it: heartbeats pause meanwhile), is taken over. The
take-over is a compare-and-swap on the ps (one critical section): of two
processes that find a slot free at once, one takes it and the other is
refused; a process whose slot was taken over may not rejoin it. It then
reads the current variables (they live on the ps tasks) and trains; each
step it takes its piece of the batch as piece k of M, so a worker's batch
does not change as others come and go.

A worker leaves at the end of its `fit` (`state[k]` = left), or when asked
to: the file named by `KERAS_PSDIST_LEAVE_FILE` (the launcher sets it) exists,
or `SlotTable.ask_to_leave(k)` ran; its `fit` then stops after the step it is
in. A worker that dies is lost, as before (the chief logs it from the
heartbeats), and its slot may be taken over.

The chief's `MembershipWatcher` logs every change with the slots it finds
members, and `keras_psdist.callbacks.MembershipReport` writes the number of
workers to the `fit` history and to TensorBoard at the step of each change.

Not elastic: in-graph runs (their replicas are fixed when the client
connects), `SyncReplicaStrategy` and bounded staleness (their counts are
fixed for a run); each refuses `max_workers`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from absl import logging

from keras_psdist.cluster import task_loss
from keras_psdist.cluster.config import LEAVE_FILE_ENV, MAX_WORKERS_ENV
from keras_psdist.cluster.shared_variables import SharedVariables
from keras_psdist.errors import JoinRefusedError, TaskLostError

__all__ = ["LEAVE_FILE_ENV", "MAX_WORKERS_ENV"]

FREE, MEMBER, LEFT = 0, 1, 2
_STATES = {FREE: "free", MEMBER: "member", LEFT: "left"}


class SlotTable:
    """Who trains, on the first ps task (see the module doc).

    Args:
        shared: Opens (or, on the chief, creates) the shared variables.
        device: The first parameter device.
        slot: This process's slot (its worker index).
        max_workers: M.
        names: The slots' task names, for messages.
    """

    def __init__(
        self,
        shared: SharedVariables,
        device: str,
        slot: int,
        max_workers: int,
        *,
        names: Sequence[str],
    ):
        self.slot = slot
        self.max_workers = max_workers
        self.names = tuple(names)
        self._device = device
        try:
            self.state = shared.create_int64(
                device, "keras_psdist/membership/state", [FREE] * max_workers
            )
        except ValueError as e:
            if "shape" not in str(e):
                raise
            raise JoinRefusedError(
                f"This process runs with max_workers={max_workers}, but the job "
                "it joins was started with another max_workers (the ps tasks "
                "hold its membership for that many). Every process of a job "
                "must pass the same max_workers (`keras-psdist launch "
                "--max-workers` gives every worker the same)."
            ) from None
        self.applied = shared.create_int64(
            device, "keras_psdist/membership/applied", [0] * max_workers
        )
        self.version = shared.create_int64(device, "keras_psdist/membership/version", 0)
        self.leave = shared.create_int64(
            device, "keras_psdist/membership/leave", [0] * max_workers
        )
        # Each slot's holder (a process's random token, 0: none) and epoch
        # (one more at each change of the slot): a take-over is a
        # compare-and-swap on them (`_swap`).
        self.holder = shared.create_int64(
            device, "keras_psdist/membership/holder", [0] * max_workers
        )
        self.epoch = shared.create_int64(
            device, "keras_psdist/membership/epoch", [0] * max_workers
        )
        self._mutex = shared.critical_section(device, "keras_psdist/membership/mutex")
        self.token = int.from_bytes(os.urandom(8), "little") % (2**62 - 1) + 1
        scalar = tf.TensorSpec([], tf.int64)
        self._swap_fn = tf.function(self._swap_on_ps, input_signature=[scalar] * 5)
        self._look_fn = tf.function(self._look_on_ps, input_signature=[scalar])

    # ------------------------------------------------------------ reads

    def states(self) -> list[int]:
        """Each slot's state (`FREE`, `MEMBER`, `LEFT`)."""
        return self.state.numpy().tolist()

    def members(self) -> list[int]:
        """The slots that are members now."""
        return [k for k, s in enumerate(self.states()) if s == MEMBER]

    def applied_counts(self) -> list[int]:
        """The updates each slot has applied."""
        return self.applied.numpy().tolist()

    def look(self, slot: int) -> tuple[int, int, int]:
        """Slot `slot`'s `(state, holder, epoch)`, read together."""
        state, holder, epoch = self._look_fn(tf.constant(slot, tf.int64)).numpy()
        return int(state), int(holder), int(epoch)

    # ----------------------------------------------------------- changes

    def admit(self, beats: tf.Variable, period: float, timeout: float) -> None:
        """Takes this process's slot, or raises `JoinRefusedError`.

        Args:
            beats: The heartbeat vector (not yet beaten by this process).
            period: Seconds between two beats of a live process.
            timeout: The run's `heartbeat_timeout`: seconds without a beat
                after which the others count a worker lost.
        """
        slot, name = self.slot, self.names[self.slot]
        state, _, epoch = self.look(slot)
        if state == MEMBER:
            # A member slot: taken over only if its holder stopped beating
            # for longer than a live process can be silent: `timeout` (the
            # chief's), and its beats pause while it finds a ps lost, until
            # its server watch either sees the ps again or ends it.
            before = int(beats.numpy()[slot])
            deadline = time.monotonic() + period + task_loss.exit_within(timeout)
            while time.monotonic() < deadline:
                time.sleep(period / 2)
                if int(beats.numpy()[slot]) != before:
                    raise JoinRefusedError(
                        f"This process starts as {name}, but {name} is already "
                        "training in this job (its heartbeat moves). A joining "
                        "worker needs a slot of its own: give it the next free "
                        f"worker index below max_workers={self.max_workers} in "
                        "its TF_CONFIG (`keras-psdist launch --max-workers` "
                        "does), or stop the other process first."
                    )
        # Taken only if nobody changed the slot since the look above (another
        # joiner, or its holder coming back). The slot's count goes on from
        # its last holder's.
        if not self._swap(slot, epoch=epoch, state=MEMBER):
            raise JoinRefusedError(
                f"This process starts as {name}, but another process took "
                f"{name} while this one was being admitted (both found it "
                "free, or its holder gone, at the same time). A joining worker "
                "needs a slot of its own: give it the next free worker index "
                f"below max_workers={self.max_workers} in its TF_CONFIG "
                "(`keras-psdist launch --max-workers` does), or start it again "
                "once the other has left."
            )
        logging.warning("keras_psdist: %s joined the job (elastic membership).", name)

    def left(self) -> None:
        """Marks this process's slot as left (unless another process has
        taken it over since)."""
        if not self._swap(self.slot, holder=self.token, state=LEFT):
            logging.warning(
                "keras_psdist: %s: another process holds this slot now; it is "
                "left as it is.",
                self.names[self.slot],
            )
            return
        with tf.device(self._device):
            tf.raw_ops.ResourceScatterUpdate(
                resource=self.leave.handle,
                indices=tf.constant([self.slot]),
                updates=tf.constant([0], tf.int64),
            )

    def rejoin(self) -> None:
        """Marks this process's slot a member again (a new `fit`), or raises
        `JoinRefusedError` if another process has taken it since."""
        if self._swap(self.slot, holder=self.token, state=MEMBER):
            return
        name = self.names[self.slot]
        raise JoinRefusedError(
            f"This process trained as {name} in an earlier fit, but another "
            f"process has taken {name} since (a slot is free once its fit "
            "ends). Two processes must not train as one worker: end this one, "
            "or start it again with a free worker index below "
            f"max_workers={self.max_workers} in its TF_CONFIG."
        )

    def ask_to_leave(self, slot: int) -> None:
        """Asks the worker in `slot` to leave after its current step."""
        with tf.device(self._device):
            tf.raw_ops.ResourceScatterUpdate(
                resource=self.leave.handle,
                indices=tf.constant([slot]),
                updates=tf.constant([1], tf.int64),
            )

    def asked_to_leave(self, leave_file: str | None = None) -> bool:
        """Whether this process was asked to leave: `leave_file` (the
        launcher's, `KERAS_PSDIST_LEAVE_FILE`) exists, or `ask_to_leave` ran."""
        if leave_file and os.path.exists(leave_file):
            return True
        return bool(self.leave.numpy()[self.slot])

    def count_applied(self) -> None:
        """One more update applied by this process; call it in the step
        function that applies the update."""
        with tf.device(self._device):
            tf.raw_ops.ResourceScatterAdd(
                resource=self.applied.handle,
                indices=tf.constant([self.slot]),
                updates=tf.constant([1], tf.int64),
            )

    def _swap(
        self, slot: int, *, state: int, epoch: int = -1, holder: int = -1
    ) -> bool:
        """Makes this process the holder of `slot`, in `state`, if the slot's
        epoch is still `epoch` and its holder `holder` (-1: any); returns
        whether it did."""
        won, _ = self._swap_fn(
            *(tf.constant(v, tf.int64) for v in (slot, epoch, holder, state)),
            tf.constant(self.token, tf.int64),
        )
        return bool(won.numpy())

    # The two functions below run on the ps, each as one critical section of
    # the shared mutex: a `MutexLock` on the ps, taken before any of their
    # reads and released after their writes (`tf.CriticalSection`). Every
    # change of a slot's state, holder or epoch is made there, so from one
    # process's read to its write nobody else's write can come between: two
    # processes that both found a slot free cannot both take it. (Separate
    # ops of one function, even on one device, would interleave with another
    # client's function: nothing orders them across clients but the lock.)

    def _look_on_ps(self, slot):
        with tf.device(self._device):

            def look():
                return tf.stack([self._read(v)[slot] for v in self._slot_variables])

            return self._mutex.execute(look)

    def _swap_on_ps(self, slot, expected_epoch, expected_holder, new_state, token):
        with tf.device(self._device):

            def swap():
                state, holder, epoch = (
                    self._read(v)[slot] for v in self._slot_variables
                )
                won = tf.logical_and(
                    tf.logical_or(expected_epoch < 0, epoch == expected_epoch),
                    tf.logical_or(expected_holder < 0, holder == expected_holder),
                )
                changes = tf.logical_and(
                    won, tf.logical_or(state != new_state, holder != token)
                )
                index = tf.reshape(tf.cast(slot, tf.int32), [1])
                writes = [
                    tf.raw_ops.ResourceScatterUpdate(
                        resource=variable.handle,
                        indices=index,
                        updates=tf.reshape(tf.where(changes, new, old), [1]),
                    )
                    for variable, new, old in (
                        (self.state, new_state, state),
                        (self.holder, token, holder),
                        (self.epoch, epoch + 1, epoch),
                    )
                ]
                writes.append(
                    tf.raw_ops.AssignAddVariableOp(
                        resource=self.version.handle,
                        value=tf.cast(changes, tf.int64),
                    )
                )
                # The lock is released once the outputs are made: after
                # the writes.
                with tf.control_dependencies(writes):
                    return tf.identity(won), tf.stack([state, holder, epoch])

            return self._mutex.execute(swap)

    @property
    def _slot_variables(self):
        return (self.state, self.holder, self.epoch)

    @staticmethod
    def _read(variable):
        # A read made inside the critical section's function (after the
        # lock), not a value captured before it.
        return tf.raw_ops.ReadVariableOp(resource=variable.handle, dtype=tf.int64)


class ElasticTraining:
    """One worker's part in an elastic async run (a `keras_psdist.modes.Training`):
    counts each update it applies, leaves when its `fit` ends or when asked.

    Args:
        registry: The run's `SlotTable`.
        leave_file: A path whose existence asks this worker to leave
            (`KERAS_PSDIST_LEAVE_FILE`), or None.
        unreachable_servers: The ps tasks that do not answer now (task ->
            where, why; `cluster.task_loss.unreachable_tasks`), asked after
            a failed `fit`. Defaults to `None`: none known.
    """

    def __init__(
        self,
        registry: SlotTable,
        leave_file: str | None = None,
        unreachable_servers: Callable[[], dict[str, str]] | None = None,
    ):
        self.registry = registry
        self._leave_file = leave_file
        self._unreachable_servers = unreachable_servers
        self._in_session = False

    def worker_apply(self, optimizer, apply, grads, variables) -> Any:
        result = apply(grads, variables)
        # In the step function, after the update (automatic control
        # dependencies order the stateful ops).
        self.registry.count_applied()
        return result

    @contextlib.contextmanager
    def session(self, model=None):
        self.registry.rejoin()
        self._in_session = True
        try:
            yield
        except BaseException as error:
            self._in_session = False
            leave(
                self.registry,
                failed=True,
                error=error,
                unreachable_servers=self._unreachable_servers,
            )
            raise
        self._in_session = False
        leave(self.registry)

    def check_steps(self, steps: int) -> None:
        return None

    def before_step(self) -> None:
        return None

    def progress(self, *args, **kwargs) -> bool:
        """True (stop the `fit`) once this worker is asked to leave."""
        return self.registry.asked_to_leave(self._leave_file)

    def counts(self) -> dict[str, Any]:
        """The updates every slot has applied, and the members now."""
        return {
            "applied": self.registry.applied_counts(),
            "members": self.registry.members(),
        }

    def checkpointed(self) -> dict[str, tf.Module]:
        return {}


def leave(
    registry: SlotTable,
    *,
    failed: bool = False,
    error: BaseException | None = None,
    unreachable_servers: Callable[[], dict[str, str]] | None = None,
) -> None:
    """Marks `registry`'s slot left at the end of a `fit`.

    After a `fit` that failed (with `error`, if known), it writes nothing to
    a ps that is lost (`error` is a `TaskLostError`, or
    `unreachable_servers()` names one): a call on a lost ps can wait
    forever. And a write that fails is logged, not raised: the error to see
    is the `fit`'s, re-raised by the caller.
    """
    if not failed:
        registry.left()
        return
    name = registry.names[registry.slot]
    if isinstance(error, TaskLostError):
        lost = error.tasks
    else:
        lost = unreachable_servers() if unreachable_servers is not None else {}
    if lost:
        logging.warning(
            "keras_psdist: %s does not mark its slot left: %s cannot be "
            "reached (the error of its fit follows).",
            name,
            ", ".join(lost),
        )
        return
    try:
        registry.left()
    except Exception as e:  # noqa: BLE001 (the fit's error is raised)
        logging.warning(
            "keras_psdist: %s could not mark its slot left (%s: %s); the error "
            "of its fit follows.",
            name,
            type(e).__name__,
            e,
        )


class MembershipWatcher:
    """On the chief: logs every change of the registry, and keeps them.

    Args:
        registry: The run's `SlotTable`.
        every: Seconds between looks.
    """

    def __init__(self, registry: SlotTable, every: float = 0.5):
        self._registry = registry
        self._every = every
        self._lock = threading.Lock()
        # (monotonic time, version, members) of each change seen.
        self.changes: list[tuple[float, int, list[int]]] = []
        self._version = None
        self._members: list[int] = []
        self._listeners: list[Callable[[int, list[int]], None]] = []
        self._stop = threading.Event()
        self.look()
        self._thread = threading.Thread(
            target=self._watch, name="keras_psdist-membership", daemon=True
        )
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self.look()
            except tf.errors.OpError as e:  # a dead ps is reported elsewhere
                logging.warning("keras_psdist membership check failed: %s", e)

    def look(self) -> list[int]:
        """Reads the registry; logs and keeps a change. Returns the members."""
        with self._lock:
            version = int(self._registry.version.numpy())
            if version == self._version:
                return list(self._members)
            members = self._registry.members()
            names = self._registry.names
            joined = [k for k in members if k not in self._members]
            gone = [k for k in self._members if k not in members]
            if self._version is not None and (joined or gone):
                logging.warning(
                    "keras_psdist membership (version %d): %s; %d worker%s: %s.",
                    version,
                    ", ".join(
                        [f"{names[k]} joined" for k in joined]
                        + [f"{names[k]} left" for k in gone]
                    ),
                    len(members),
                    "" if len(members) == 1 else "s",
                    ", ".join(names[k] for k in members),
                )
            self._version, self._members = version, members
            self.changes.append((time.monotonic(), version, list(members)))
            return list(members)

    @property
    def members(self) -> list[int]:
        """The members as of the last look."""
        with self._lock:
            return list(self._members)

    def stop(self) -> None:
        self._stop.set()


def state_names(states: Sequence[int]) -> list[str]:
    """`SlotTable.states()` as words."""
    return [_STATES[int(s)] for s in np.asarray(states).tolist()]
