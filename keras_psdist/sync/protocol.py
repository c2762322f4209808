"""Sync-replica training between worker processes: shared state and the worker's half.

TF1's `SyncReplicasOptimizer`, re-done for TF2 on state that lives on the
first parameter server and that every worker process opens by name:

| state          | what                                         | written by      |
|----------------|----------------------------------------------|-----------------|
| `global_step`  | int64 variable: updates applied so far       | the chief       |
| gradient queue | FIFO of tagged gradients                     | workers push,   |
|                | `(kind, worker, step, session, g_1 .. g_k)`  | the chief pops  |
| token queues   | one FIFO per worker: release tokens          | the chief       |
| `counts`       | int64 `[3, W]`: per worker, gradients        | the chief       |
|                | applied / dropped stale / dropped at the end |                 |
| `lost`         | int64 `[W]`: 1 for a worker the chief found  | the chief       |
|                | lost (no heartbeat, see `cluster.liveness`)  |                 |
| `finished`     | int64: the last session (`fit`) whose chief  | the chief       |
|                | finished its own fit without error: no       |                 |
|                | update of it comes after that                |                 |

A worker's step (`SyncReplicas.worker_step`, inside Keras's train function):
it pushes its gradient tagged with its `local_step` (the global step its
parameters are at least as new as), then waits for a token newer than that
tag: a release's token is the new global step, its next tag (two dependent
transfers per step, TF1's count: the push and the token). With
`replicas_to_aggregate > total_num_replicas` a worker pushes
`ceil(replicas_to_aggregate / total_num_replicas)` gradients per update before
it waits.

The chief's half, the update service (`service.py`), pops tagged gradients:
it drops those whose tag is older than the global step, and once
`replicas_to_aggregate` fresh ones have arrived it aggregates them, applies
the result with the Keras optimizer, increments the global step and pushes a
token to every worker. Workers it did not wait for (backup replicas) find
their gradient stale and a token waiting: they go on from the new step.

The end of a session is the chief's (TF1's chief stopped at its last step and
closed the token queue): when the chief's own `fit` ends, the service writes
`finished` and gives every worker still in the session an end token
(`END + session`). A worker blocked in its wait wakes at once; one in the
middle of a step (computing, or pushing over a slow link) finds the token at
its next wait, or sees `finished` when its next step starts (it reads it
beside its compute) and pushes nothing. From then on its steps send nothing and wait for nothing (a local
flag), and its `fit` stops at the step's end (`training.py`). End tokens
carry their session, so one that arrives after its worker moved on to its
next `fit` is ignored.

Why one queue of whole gradients rather than TF1's accumulator per variable:
an accumulator takes the first `replicas_to_aggregate` gradients *of each
variable*, so one update can mix workers across variables, and nobody can
tell which worker's gradient was dropped. A queue element is one worker's
whole gradient: an update combines whole gradients (which robust rules such
as Krum need), and every gradient is counted, per worker, as applied or
dropped.

Blocking ops (the dequeues) run only inside `tf.function`s: issued as eager
remote ops, blocked dequeues starve the ps task's other clients.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from absl import logging

from keras_psdist._tf import resource_variable_ops
from keras_psdist.cluster.shared_variables import SharedVariables
from keras_psdist.gradients.wire import Payload

# Kinds of queue elements. LOST is sent by the chief for a worker whose
# heartbeat stopped.
GRADIENT, LEAVE, SHUTDOWN, LOST = 0, 1, 2, 3
# Token values other than a global step.
FREE_PASS = 2**62  # go on without an update: too few workers remain
# END + s: session s is over (the chief's fit ended): stop sending. Above any
# global step, below FREE_PASS.
END = 2**61
POISON = -1  # stop: the run failed (the chief or this worker's watchdog)
POISON_MESSAGE = "keras_psdist sync-replicas: this worker was told to stop"
# Rows of `counts`.
APPLIED, DROPPED_STALE, DROPPED_AT_END = 0, 1, 2
# Each row as the summaries name it, and for the drops what they are: the
# words a user reads beside a count that is not 0.
COUNT_NAMES = {
    APPLIED: ("applied", ""),
    DROPPED_STALE: (
        "dropped as stale",
        "arrived after the update of their step: a backup worker's late "
        "gradients, not applied",
    ),
    DROPPED_AT_END: (
        "dropped at the end",
        "sent after the last update, when the chief's fit had ended or too few "
        "workers were still training to make another: not applied",
    ),
}
# Queue containers may not hold "_".
CONTAINER = "keras-psdist"


@dataclasses.dataclass(frozen=True)
class SyncConfig:
    """The sync-replica settings (see `SyncReplicaStrategy`)."""

    replicas_to_aggregate: int
    total_num_replicas: int
    step_timeout: float
    # The workers' task names by index ("chief:0", "worker:0", ...), for
    # messages; `worker:<index>` when empty.
    worker_names: tuple[str, ...] = ()
    # Workers join and leave (`SyncReplicaStrategy(max_workers=M)`, see
    # `resizing.py`): the per-worker state has M slots; None: fixed workers.
    max_workers: int | None = None

    def name(self, worker: int) -> str:
        """The task name of worker `worker`, e.g. `"worker:1"`."""
        if 0 <= worker < len(self.worker_names):
            return self.worker_names[worker]
        return f"worker:{worker}"

    def names(self, workers) -> str:
        """`"worker:0, worker:1"` for worker indices."""
        return ", ".join(self.name(int(w)) for w in workers)

    @property
    def slots(self) -> int:
        """Workers the shared per-worker state has room for."""
        return self.max_workers or self.total_num_replicas

    @property
    def pushes_per_update(self) -> int:
        """Gradients each worker sends before it waits for an update (1 when
        workers join and leave: their counts never ask for more)."""
        if self.max_workers is not None:
            return 1
        return math.ceil(self.replicas_to_aggregate / self.total_num_replicas)


def _is_static(leaf) -> bool:
    """A payload's part known when the layout is made, not sent (a cast's
    dtype)."""
    return isinstance(leaf, (tf.DType, bool, int, float, str))


def _spec_or_static(leaf):
    return leaf if _is_static(leaf) else tf.TensorSpec(leaf.shape, leaf.dtype)


def _sent(payload_spec) -> list[tf.TensorSpec]:
    """The specs of a payload's parts that cross the queue."""
    return [s for s in tf.nest.flatten(payload_spec) if isinstance(s, tf.TensorSpec)]


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a gradient list is flattened into queue components.

    `kinds[i]` is `"dense"`, `"sparse"` (values and int64 indices),
    `"compressed"` (a `gradients.wire.Payload`: its tensors, whose specs
    `payloads[i]` holds, with its static parts, such as a cast's dtype) or `"none"` (no gradient: nothing is sent) for the
    i-th variable.
    """

    kinds: tuple[str, ...]
    dtypes: tuple[tf.DType, ...]
    payloads: tuple[Any, ...] = ()

    @classmethod
    def of(cls, grads) -> Layout:
        kinds, dtypes, payloads = [], [], []
        for g in grads:
            payloads.append(None)
            if isinstance(g, Payload):
                kinds.append("compressed")
                dtypes.append(tf.float32)  # unused: the payload's specs say
                payloads[-1] = tf.nest.map_structure(_spec_or_static, g.value)
            elif g is None:
                kinds.append("none")
                dtypes.append(tf.float32)
            elif isinstance(g, tf.IndexedSlices):
                kinds.append("sparse")
                dtypes.append(g.values.dtype)
            else:
                kinds.append("dense")
                dtypes.append(tf.as_dtype(g.dtype))
        return cls(tuple(kinds), tuple(dtypes), tuple(payloads))

    def sent_specs(self, v: int) -> list[tf.TensorSpec]:
        """The specs of variable `v`'s compressed payload parts that cross
        the queue (not its static parts)."""
        return _sent(self.payloads[v])

    @property
    def component_types(self) -> list[tf.DType]:
        types = [tf.int64] * 4  # kind, worker, step, session
        for i, (kind, dtype) in enumerate(zip(self.kinds, self.dtypes, strict=True)):
            if kind == "dense":
                types.append(dtype)
            elif kind == "sparse":
                types += [dtype, tf.int64]
            elif kind == "compressed":
                types += [spec.dtype for spec in self.sent_specs(i)]
        return types

    def flatten(self, grads) -> list[tf.Tensor]:
        out = []
        for kind, g in zip(self.kinds, grads, strict=True):
            if kind == "dense":
                out.append(tf.convert_to_tensor(g))
            elif kind == "sparse":
                out += [g.values, tf.cast(g.indices, tf.int64)]
            elif kind == "compressed":
                out += [
                    tf.convert_to_tensor(t)
                    for t in tf.nest.flatten(g.value)
                    if not _is_static(t)
                ]
        return out

    def empty(self) -> list[tf.Tensor]:
        """Placeholder components for a marker element (LEAVE, SHUTDOWN)."""
        return [tf.zeros([0], t) for t in self.component_types[4:]]

    def unflatten(self, components, shapes) -> list:
        """The gradient list back, `None` where a variable has no gradient
        (a compressed one as its `Payload`)."""
        out, i = [], 0
        for v, (kind, shape) in enumerate(zip(self.kinds, shapes, strict=True)):
            if kind == "compressed":
                leaves = []
                for spec in tf.nest.flatten(self.payloads[v]):
                    if isinstance(spec, tf.TensorSpec):
                        leaves.append(components[i])
                        i += 1
                    else:
                        leaves.append(spec)  # static: the layout holds it
                out.append(Payload(tf.nest.pack_sequence_as(self.payloads[v], leaves)))
            elif kind == "dense":
                out.append(components[i])
                i += 1
            elif kind == "sparse":
                out.append(
                    tf.IndexedSlices(
                        components[i],
                        components[i + 1],
                        tf.constant(shape.as_list(), tf.int64),
                    )
                )
                i += 2
            else:
                out.append(None)
        return out


class SyncReplicas:
    """The shared state of a sync-replica run, and the worker's step.

    Args:
        config: The settings.
        worker: This process's index among the training processes.
        is_chief: Whether this process runs the update service.
        device: Where the shared state lives (the first parameter device).
        shared: Opens (or, on the chief, creates) shared variables.
        local_device: This process's own CPU, for its private counters.
        unreachable_servers: The ps tasks that refuse connections now.
        namespace: The prefix of the shared names on the ps tasks (counters,
            queues): one per `SyncReplicaStrategy` of a script, so a second
            run in the same cluster starts from step 0 with its own queues.
    """

    def __init__(
        self,
        config: SyncConfig,
        worker: int,
        is_chief: bool,
        device: str,
        shared: SharedVariables,
        local_device: str,
        unreachable_servers: Callable[[], dict[str, str]] | None = None,
        namespace: str = "keras_psdist/sync",
    ):
        self.config = config
        self.namespace = namespace
        # Which ps tasks refuse connections now (`cluster.task_loss`): no
        # control message goes to a lost ps (a call on it can wait forever).
        self._unreachable_servers = unreachable_servers
        spec = tf.DeviceSpec.from_string(device)
        self._task = f"{spec.job}:{spec.task}"  # the ps task of `device`
        self.worker = worker
        self.is_chief = is_chief
        self.device = device
        self.local_device = local_device
        num_workers = config.slots
        self.global_step = shared.create_int64(device, f"{namespace}/global_step", 0)
        self.counts = shared.create_int64(
            device, f"{namespace}/counts", [[0] * num_workers] * 3
        )
        self.lost = shared.create_int64(device, f"{namespace}/lost", [0] * num_workers)
        self.finished = shared.create_int64(device, f"{namespace}/finished_session", 0)
        # Workers that join a running job take the chief's current session
        # (its `fit`), whatever `fit`s they ran before.
        self.current_session = (
            shared.create_int64(device, f"{namespace}/current_session", 0)
            if config.max_workers is not None
            else None
        )
        with tf.init_scope(), tf.device(device):
            self.token_queues = [
                _fifo_queue([tf.int64], f"{namespace}/tokens_{w}")
                for w in range(num_workers)
            ]
        with tf.init_scope(), tf.device(local_device):
            self._local_step = local_variable(tf.zeros([], tf.int64), "local_step")
            self._pushes = local_variable(tf.zeros([], tf.int64), "pushes")
            self._session = local_variable(tf.zeros([], tf.int64), "session")
            # The last session this worker knows the chief has finished, and
            # the steps of this session that sent nothing since.
            self._ended = local_variable(tf.zeros([], tf.int64), "ended_session")
            self._skipped = local_variable(tf.zeros([], tf.int64), "skipped")
        self._gradient_queue = None
        self._layout_ready = threading.Event()
        self.layout: Layout | None = None
        self.shapes: tuple[tf.TensorShape, ...] | None = None

    # ------------------------------------------------------------ queues

    def gradient_queue(self, layout: Layout):
        """The shared gradient queue for gradients of `layout`."""
        if self._gradient_queue is None:
            with tf.init_scope(), tf.device(self.device):
                self._gradient_queue = _fifo_queue(
                    layout.component_types, f"{self.namespace}/gradients"
                )
            self.layout = layout
        elif layout != self.layout:
            raise ValueError(
                "SyncReplicaStrategy sends the same gradients every step. This "
                f"step's gradients are {layout.kinds}, an earlier step's were "
                f"{self.layout.kinds}. Train one model (with the same trainable "
                "variables) per SyncReplicaStrategy."
            )
        return self._gradient_queue

    def register(self, grads, variables) -> Layout:
        """Records the gradient layout and the variables' shapes."""
        layout = Layout.of(grads)
        self.gradient_queue(layout)
        self.shapes = tuple(tf.TensorShape(v.shape) for v in variables)
        self._layout_ready.set()
        return layout

    def wait_for_layout(self) -> None:
        """Blocks until this process has traced its train step (the chief's
        service needs the gradients' layout to pop them)."""
        self._layout_ready.wait()

    # ------------------------------------------------------- worker's step

    def worker_step(self, grads, variables) -> tf.Operation:
        """Pushes this worker's gradient and waits for its release (in a trace).

        Once this worker knows the chief has finished the session, the step
        sends nothing and waits for nothing: no update can come.

        Every op of the protocol runs on the ps task, control flow included:
        this worker's own counters are read at the start of the step (beside
        its compute) and written at its end, from one vector the ps sends
        back. A branch or a counter on this worker between the push and the
        wait would cost a round trip each (the lowered `cond`'s predicate
        and the counter's value cross between the tasks): the critical path
        is the gradient's transfer to the ps, the wait there, and the
        token's transfer back, TF1's count.

        Args:
            grads: This worker's gradient of each variable (`None` for none).
            variables: The trainable variables, in the same order.

        Returns:
            An op that runs once the worker may start its next step.
        """
        layout = self.register(grads, variables)
        # This worker's counters: read at the start, no input.
        session = self._session.read_value()
        known_end = self._ended.read_value()
        tag = self._local_step.read_value()
        pushes = self._pushes.read_value()
        with tf.device(self.device):
            # The counters' copies on the ps, sent at the start of the step.
            # A lowered `cond` or `while_loop` puts the `Switch` (`Enter`) of
            # an input beside the input: a counter read on this worker would
            # bring each branch's predicate here and its value back, a round
            # trip per nesting level on the critical path.
            on_ps = [tf.identity(t) for t in (session, known_end, tag, pushes)]
            session_ps, known_end_ps, tag_ps, pushes_ps = on_ps
            # Whether the chief has finished the session, read with no
            # input: it runs at the start of the step, beside the worker's
            # compute, so a release that came before the end token costs no
            # push (over a slow link, seconds) and no round trip after the
            # wait.
            finished = self.finished.read_value()
            ended = tf.logical_or(known_end_ps >= session_ps, finished >= session_ps)
            # The gradients' `Switch`es stay on this worker: an ended step
            # sends none.
            outcome = tf.cond(
                ended,
                lambda: _outcome(tag_ps, pushes_ps, finished >= session_ps, skipped=1),
                lambda: self._push_and_wait(
                    layout, grads, tag_ps, pushes_ps, session_ps
                ),
            )
        return self._note(outcome, session, known_end)

    def _note(self, outcome, session, known_end=None):
        """Back on this worker: a poisoned wait fails the step, else this
        worker's counters take the step's `outcome` (see `_outcome`)."""
        if known_end is None:
            known_end = self._ended.read_value()
        check = tf.debugging.Assert(tf.equal(outcome[_POISONED], 0), [POISON_MESSAGE])
        with tf.control_dependencies([check]):
            return tf.group(
                self._local_step.assign(outcome[_STEP]),
                self._pushes.assign(outcome[_PUSHES]),
                self._ended.assign(tf.where(outcome[_ENDED] > 0, session, known_end)),
                self._skipped.assign_add(outcome[_SKIPPED]),
            )

    def _push_and_wait(self, layout, grads, tag, pushes, session):
        """On the ps: the push, then the wait or the step's check."""
        header = [
            tf.constant(GRADIENT, tf.int64),
            tf.constant(self.worker, tf.int64),
            tag,
            session,
        ]
        push = tf.raw_ops.QueueEnqueueV2(
            handle=self._gradient_queue, components=header + layout.flatten(grads)
        )
        with tf.control_dependencies([push]):
            pushes = pushes + 1
        return tf.cond(
            pushes >= self.config.pushes_per_update,
            lambda: self._wait_for_release(tag, session),
            lambda: self._go_on_if_updated(tag, pushes, session),
        )

    def _wait_for_release(self, tag, session):
        queue = self.token_queues[self.worker]
        end = END + session

        def dequeue():
            return tf.raw_ops.QueueDequeueV2(handle=queue, component_types=[tf.int64])[
                0
            ]

        def waiting(t):
            # A token no newer than the tag is left over from an earlier
            # wake, and so is the end token of another session. While it sat
            # in the queue, a release may have skipped the queue (it gives
            # one token to an empty queue only), so the global step says
            # whether the update came anyway. The release writes the step
            # before it looks at the queue, and the step is read here after
            # the dequeue: either the step is seen, or the queue was empty
            # when the release looked.
            other_end = tf.logical_and(
                tf.logical_and(t >= END, t < FREE_PASS), tf.not_equal(t, end)
            )
            old = tf.logical_or(
                tf.logical_and(t <= tag, tf.not_equal(t, POISON)), other_end
            )
            return tf.cond(
                old,
                lambda: self.global_step.read_value() <= tag,
                lambda: tf.constant(False),
            )

        token = tf.while_loop(waiting, lambda t: [dequeue()], [dequeue()])
        token = tf.reshape(token, [])

        def released():
            # A release's token is the new global step (written before it
            # was sent): the worker goes on from it, with no read.
            return _outcome(token, 0, False)

        def from_the_step():
            # Any other token (a free pass, an end token, an old token after
            # which the step was found newer) reads the step and whether the
            # session is over.
            step, finished = self._read_step_and_finished()
            return _outcome(
                step, 0, tf.logical_or(tf.equal(token, end), finished >= session)
            )

        outcome = tf.cond(
            tf.logical_and(token > tag, token < END), released, from_the_step
        )
        return tf.where(
            tf.equal(token, POISON), _outcome(tag, 0, False, poisoned=1), outcome
        )

    def _go_on_if_updated(self, tag, pushes, session):
        step, finished = self._read_step_and_finished()
        updated = step > tag
        return _outcome(
            tf.where(updated, step, tag),
            tf.where(updated, tf.constant(0, tf.int64), pushes),
            finished >= session,
        )

    def _read_step_and_finished(self):
        both = tf.stack([self.global_step.read_value(), self.finished.read_value()])
        return both[0], both[1]

    # ------------------------------------------------ session (eager, host)

    def begin_session(self) -> int:
        """Resets this worker for a new `fit`; returns the session number."""
        session = int(self._session.assign_add(1).numpy())
        if self.current_session is not None:
            if self.is_chief:
                with tf.device(self.device):
                    self.current_session.assign(session)
            else:
                # A worker that joins a running job trains in the chief's
                # current `fit`: its elements carry that session.
                session = max(session, int(self.current_session.numpy()))
                self._session.assign(session)
        self._local_step.assign(self.global_step.read_value())
        self._pushes.assign(0)
        self._skipped.assign(0)
        self._flush(self.token_queues[self.worker])
        # Read after the flush: the chief writes `finished` before it sends
        # the end token, so a session it finished before this worker began
        # (a straggler slow to start, a restarted worker) is seen either
        # here or by the token.
        if int(self.finished.numpy()) >= session:
            self._ended.assign(session)
        return session

    def mark_finished(self, session: int) -> None:
        """Writes that the chief has finished `session` (on the chief)."""
        with tf.device(self.device):
            self.finished.assign(session)

    def session_ended(self, session: int) -> bool:
        """Whether this worker knows the chief has finished `session`."""
        return int(self._ended.numpy()) >= session

    def end_session(self, session: int) -> None:
        """Makes this worker's next steps in `session` send nothing (its
        watchdog saw `finished`; a wait in progress gets the end token)."""
        if int(self._ended.numpy()) < session:
            self._ended.assign(session)

    def steps_skipped(self) -> int:
        """Steps of this session that sent nothing (the chief had finished it)."""
        return int(self._skipped.numpy())

    def send_marker(self, kind: int, worker: int | None = None) -> None:
        """Pushes a LEAVE, SHUTDOWN or LOST marker for `worker` (this one)."""
        if self.layout is None:
            return  # No gradient was ever sent, so no queue to mark.
        header = [
            tf.constant(kind, tf.int64),
            tf.constant(self.worker if worker is None else worker, tf.int64),
            tf.constant(-1, tf.int64),
            self._session.read_value(),
        ]
        self._send_control(self._gradient_queue, header + self.layout.empty())

    def poison(self, workers) -> None:
        """Makes `workers`' next (or current) wait fail (see `POISON`)."""
        for w in workers:
            self._send_control(self.token_queues[w], [tf.constant(POISON, tf.int64)])

    def servers_lost(self) -> dict[str, str]:
        """The ps tasks that refuse connections now (task -> where, why)."""
        if self._unreachable_servers is None:
            return {}
        return self._unreachable_servers()

    def _send_control(self, queue, components) -> None:
        lost = self.servers_lost()
        if self._task in lost:
            logging.warning(
                "keras_psdist sync-replicas: not sending a control message: "
                "%s at %s is lost.",
                self._task,
                lost[self._task],
            )
            return
        enqueue(self.device, queue, components)

    def lost_workers(self) -> list[int]:
        """The workers the chief has found lost (as published on the ps)."""
        return [w for w, lost in enumerate(self.lost.numpy().tolist()) if lost]

    def read_counts(self):
        """`(global_step, counts [3, W])` as numpy values."""
        return int(self.global_step.numpy()), self.counts.numpy()

    def _flush(self, queue) -> None:
        # Only this worker dequeues from its token queue, so a dequeue after
        # a non-zero size never blocks.
        with tf.device(self.device):
            while int(tf.raw_ops.QueueSizeV2(handle=queue).numpy()) > 0:
                tf.raw_ops.QueueDequeueV2(handle=queue, component_types=[tf.int64])


# The outcome of a worker's step, as the ps sends it back: one int64 vector.
_STEP, _PUSHES, _ENDED, _SKIPPED, _POISONED = range(5)


def _outcome(step, pushes, ended, skipped=0, poisoned=0) -> tf.Tensor:
    """The vector a step's ps part returns: the global step the worker goes
    on from, its pushes since its last release, whether it now knows the
    session over (1), the steps it skipped (0 or 1), whether its wait was
    poisoned (1)."""
    return tf.stack(
        [
            tf.cast(step, tf.int64),
            tf.cast(pushes, tf.int64),
            tf.cast(ended, tf.int64),
            tf.constant(skipped, tf.int64),
            tf.constant(poisoned, tf.int64),
        ]
    )


@tf.function(reduce_retracing=True)
def _enqueue_fn(queue, components):
    tf.raw_ops.QueueEnqueueV2(handle=queue, components=components)


def enqueue(device, queue, components):
    with tf.device(device):
        _enqueue_fn(queue, components)


def _fifo_queue(component_types, shared_name):
    return tf.raw_ops.FIFOQueueV2(
        component_types=component_types,
        shapes=[],
        capacity=-1,
        container=CONTAINER,
        shared_name=shared_name,
    )


def local_variable(initial_value, name):
    # Built directly so no strategy's variable creator places it: it is this
    # process's bookkeeping, not shared state.
    return resource_variable_ops.ResourceVariable(
        initial_value, trainable=False, name=f"keras_psdist_sync_{name}"
    )
