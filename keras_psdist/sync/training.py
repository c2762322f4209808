"""One process's part in sync-replica training: its steps, its `fit`s, its watchdog.

`SyncTraining` is what the sync-replicas mode (`keras_psdist.modes.sync_replicas`)
adds to a between-graph run, through the hooks of `keras_psdist.modes.Training`:

- `worker_apply` replaces the optimizer's apply inside a worker's train step
  (see `keras_psdist.integration.training_hooks`): this worker's replicas' gradients are combined,
  pushed tagged with the worker's step, and the worker waits for its release
  (`protocol.SyncReplicas.worker_step`). It writes no variable: the chief
  applies the update.
- `session(model)` wraps each `fit`: it resets the worker's step, starts the
  chief's update service, and watches for a stall. At the end the worker
  leaves, and the chief waits until every worker has left, so no worker is
  left waiting for an update the chief would never make.
- The chief's end is everyone's (TF1's chief stopped at its last step): once
  the chief's `fit` has ended, no update comes, so a worker still training (a
  straggler the backup workers did not wait for) stops its `fit` at its next
  step or wait, saying so at INFO level with the steps it did not run, and
  leaves. Its `fit` returns normally. The chief waits for that, not for the
  straggler's epochs. A worker faster than the chief ends its `fit` as
  before, and the chief trains on.

What happens when a process fails:

| who fails               | what the others see                                |
|-------------------------|----------------------------------------------------|
| nobody; a worker is     | with backup workers, the others do not wait for it |
| slow (a straggler)      | (its gradients are dropped as stale); when the     |
|                         | chief's fit ends, its fit stops at its next step   |
|                         | or wait (INFO: why, and the steps not run), and    |
|                         | the chief's fit returns                            |
| a worker (its `fit`     | it leaves: the run goes on without it (an update   |
| raises)                 | then needs replicas_to_aggregate of the others);   |
|                         | before its first step it cannot leave, and the     |
|                         | chief stops waiting after `step_timeout`           |
| a worker dies (killed)  | its heartbeat stops (`cluster.liveness`): after    |
|                         | `heartbeat_timeout` s the chief counts it lost.    |
|                         | With backup workers the run goes on; without,      |
|                         | every worker raises `WorkerLostError` naming it.   |
|                         | Restarted, it rejoins and counts again. If the     |
|                         | chief's fit ends while it is counted lost (or      |
|                         | before it is back), its `fit` stops, as a          |
|                         | straggler's: no update can come for it.            |
| the chief (`fit` raises | every worker raises `RuntimeError` at its next     |
| or the service fails)   | wait: "the chief stopped the run"                  |
| the chief dies (killed) | after `heartbeat_timeout` s every worker raises    |
|                         | `StalledError` naming the lost chief               |
| no step finishes at all | after `step_timeout` s, `StalledError` naming the  |
| (a hang)                | workers the pending update waits for               |

There is no chief failover: the chief's optimizer state is on the ps tasks,
but the service runs in the chief's process only.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import tensorflow as tf
from absl import logging

from keras_psdist.aggregators.momentum import moving_averages
from keras_psdist.cluster import elastic, task_loss
from keras_psdist.distribute.reduction import GradientReduction, ReductionState
from keras_psdist.errors import StalledError  # noqa: F401 (re-exported)
from keras_psdist.gradients.wire import Payload
from keras_psdist.sync import per_worker, plain_sgd, protocol
from keras_psdist.sync.protocol import SyncReplicas
from keras_psdist.sync.service import UpdateService, WorkerLostError, say
from keras_psdist.variables.staged_merge import in_replica_control_flow

# How often the watchdog looks, in seconds.
_WATCH_EVERY_S = 1.0


class SyncTraining:
    """This process's side of a sync-replica run (see the module docstring).

    Args:
        strategy: The `SyncReplicaStrategy`.
        sync: The run's shared state.
        aggregator: The bound rule the chief applies across workers.
        attack: A gradient attack this worker runs on its own gradient (it is
            one of the attack's workers), or `None`.
        parameter_devices: Where the chief spreads per-variable aggregation.
        heartbeats: This process's `cluster.liveness.Heartbeats`, or None
            (no failure detection beyond `step_timeout`).
        config: This process's `ClusterConfig`. Defaults to the strategy's.
        worker_momentum: This worker sends `m <- beta * m + (1 - beta) * g`
            of its gradients instead of `g` (see `aggregators.momentum`); 0
            sends gradients.
        resizing: Workers join and leave (`max_workers`): derives the
            counts for the workers the run has (`resizing.py`); None: fixed.
        registry: The elastic registry (`keras_psdist.cluster.elastic`)
            this process is a member of, or None.
        leave_file: A path whose existence asks this worker to leave after
            its current step (`KERAS_PSDIST_LEAVE_FILE`), or None.
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        sync: SyncReplicas,
        aggregator,
        attack: Any,
        parameter_devices,
        heartbeats=None,
        config=None,
        worker_momentum: float = 0.0,
        resizing=None,
        registry=None,
        leave_file: str | None = None,
    ):
        self._strategy = strategy
        self._resizing = resizing
        self._registry = registry
        self._leave_file = leave_file
        # This process's cluster and task (e.g. "worker:1"), for errors.
        self._config = (
            config if config is not None else strategy.extended.topology.config
        )
        self._name = self._config.task_name
        self._heartbeats = heartbeats
        self._reported_lost: set[int] = set()
        self.sync = sync
        self._aggregator = aggregator
        self._attack = attack
        self._parameter_devices = tuple(parameter_devices)
        self._apply = None
        self._optimizer = None
        self._variables = None
        self._service: UpdateService | None = None
        self.worker_momentum = worker_momentum
        # This worker's momentum buffers, made at the first push; the chief's
        # are in checkpoints with the rest of `training_state`.
        self.momentum = ReductionState()
        # The chief's rule over the workers' gradients (its state is in
        # checkpoints, see `PSExtended.training_state`); None on workers.
        self.reduction = (
            GradientReduction(
                aggregator,
                None,
                sync.device,
                sync.config.replicas_to_aggregate,
                spread_devices=self._parameter_devices,
            )
            if sync.is_chief
            else None
        )
        # With workers joining and leaving: the rule for each counts the
        # run has had, `(replicas_to_aggregate, num_byzantine) -> reduction`.
        self._reductions: dict[tuple[int, int], GradientReduction] = {}
        self._update_fn = None
        self._session = 0
        self._in_session = False
        # Whether this session's early end (the chief finished it) was said.
        self._said_end = False
        self._last_progress = time.monotonic()
        self._stall: str | None = None

    # ------------------------------------------------------- worker's step

    def worker_apply(self, optimizer, apply, grads, variables):
        """The optimizer's apply on a worker: push the gradient, wait, write
        nothing (`apply`, Keras's own, is for the chief's service)."""
        if in_replica_control_flow():
            raise ValueError(
                "SyncReplicaStrategy pushes gradients once per step, outside "
                "control flow; this optimizer applies them inside a `cond` "
                f"({type(optimizer).__name__}"
                + (
                    f", gradient_accumulation_steps={optimizer.gradient_accumulation_steps}"
                    if getattr(optimizer, "gradient_accumulation_steps", None)
                    else ""
                )
                + "). Use a plain optimizer; for several batches per update, "
                "set replicas_to_aggregate above total_num_replicas."
            )
        if not self._in_session:
            raise RuntimeError(
                "SyncReplicaStrategy applies gradients inside `model.fit`. In a "
                "custom training loop, run the loop inside "
                "`with strategy.training(model):`."
            )
        variables = list(variables)
        # Keras's own apply of this optimizer: the chief's update service
        # calls it (the optimizer's public `apply` would push again).
        self._apply = apply
        self._optimizer = optimizer
        self._variables = variables
        scale = optimizer.loss_scale_factor
        grads = [g if g is None or scale is None else g / scale for g in grads]
        grads = optimizer._clip_gradients(grads)
        return per_worker.once_per_worker(self._push, grads, variables)

    def _push(self, grads, variables):
        if self.worker_momentum:
            grads = self._momentum_of(grads)
        if self._attack is not None:
            grads = _forge_own(self._attack, grads)
        wire = self._strategy.extended.wire
        if wire is not None:
            # What crosses to the chief's queue: each gradient compressed on
            # this worker, its residual kept here (`gradients.wire`).
            grads = wire.payloads(grads, variables)
        return self.sync.worker_step(grads, variables)

    def _momentum_of(self, grads):
        """This worker's momenta, updated with `grads` (sparse ones pass)."""
        dense = [
            g for g in grads if g is not None and not isinstance(g, tf.IndexedSlices)
        ]
        if not self.momentum.kept:
            with tf.init_scope(), tf.device(self.sync.local_device):
                for g in dense:
                    self.momentum.kept.append(
                        protocol.local_variable(tf.zeros(g.shape, g.dtype), "momentum")
                    )
        buffers = self.momentum.kept
        new = moving_averages(
            [b.read_value() for b in buffers],
            dense,
            [True] * len(dense),
            self.worker_momentum,
        )
        updated = iter(b.assign(m) for b, m in zip(buffers, new, strict=True))
        return [
            g if g is None or isinstance(g, tf.IndexedSlices) else next(updated)
            for g in grads
        ]

    # ------------------------------------------------------------ sessions

    @contextlib.contextmanager
    def session(self, model=None):
        """One `fit` (or custom loop) of this worker; see the module docstring."""
        if model is not None:
            _check_optimizer(getattr(model, "optimizer", None))
        if self._in_session:
            yield  # nested (fit inside `strategy.training`)
            return
        if self._registry is not None:
            self._registry.rejoin()
        self._session = self.sync.begin_session()
        self._said_end = False
        self._stall = None
        self._last_progress = time.monotonic()
        if self.sync.is_chief:
            self._ensure_service().start_session(self._session)
        self._in_session = True
        stop = threading.Event()
        watchdog = threading.Thread(
            target=self._watch,
            args=(stop,),
            name="keras_psdist-sync-watchdog",
            daemon=True,
        )
        watchdog.start()
        error = None
        try:
            # A lost ps is named (also in a custom loop, which no `fit`
            # wrapper sees); `_end` then sends it nothing: a call on it can
            # wait forever.
            with task_loss.reporting_lost_tasks(self._config, ("ps",), self._name):
                try:
                    yield
                except tf.errors.InvalidArgumentError as e:
                    if protocol.POISON_MESSAGE not in str(e):
                        raise
                    raise self._stop_error() from None
        except BaseException as e:
            error = e
            raise
        finally:
            stop.set()
            watchdog.join()
            self._in_session = False
            self._end(error is not None, error)

    def check_steps(self, steps: int) -> None:
        """Refuses a `fit` of `steps` steps per worker that can make no update."""
        config = self.sync.config
        most = steps * config.total_num_replicas
        if most < config.replicas_to_aggregate:
            raise ValueError(
                f"replicas_to_aggregate={config.replicas_to_aggregate} gradients make "
                f"one update, but this fit runs {steps} steps on each of "
                f"{config.total_num_replicas} workers: {most} gradients at most, so "
                "no update would ever be applied. Train more steps, or lower "
                "SyncReplicaStrategy(replicas_to_aggregate=...)."
            )

    def before_step(self) -> None:
        """Called before each step; a worker waits inside the step instead."""

    def progress(
        self, steps_run: int | None = None, steps_planned: int | None = None
    ) -> bool:
        """Marks a finished step (the watchdog's sign of life).

        Args:
            steps_run: Steps this `fit` has run, this one included.
            steps_planned: Steps the `fit` would run in all (None: unknown).

        Returns:
            Whether the `fit` must stop after this step: the chief has
            finished the session (this worker is a straggler). It is said
            once, with why and the steps not run (see the module docstring).
        """
        self._last_progress = time.monotonic()
        if self._registry is not None and self._registry.asked_to_leave(
            self._leave_file
        ):
            return True
        if self.sync.is_chief or not self.sync.session_ended(self._session):
            return False
        if not self._said_end:
            self._said_end = True
            if steps_planned is None or steps_run is None or steps_run < steps_planned:
                say(self._stopped_early(steps_run, steps_planned))
        return True

    def _stopped_early(self, steps_run, steps_planned) -> str:
        # No update comes after the chief's end: this is the step it ended at.
        step = int(self.sync.global_step.numpy())
        if steps_run is None:
            ran = ""
        elif steps_planned is None:
            ran = f" It ran {steps_run} steps; the rest of its epochs are not run."
        else:
            ran = (
                f" It ran {steps_run} of its {steps_planned} steps: "
                f"{steps_planned - steps_run} not run."
            )
        return (
            f"keras_psdist sync-replicas: {self._name} stops its fit early: the "
            f"chief finished its fit at global step {step}, and no update comes "
            "after the chief's last, so this worker's remaining steps would only "
            f"be dropped.{ran}"
        )

    def checkpointed(self) -> dict[str, tf.Module]:
        """The state `BackupAndRestore` saves beside the weights: this
        worker's momentum buffers, and on the chief its rule's state."""
        state = {"worker_momentum": self.momentum}
        if self.reduction is not None:
            state["update_service"] = self.reduction.state
        return state

    def counts(self) -> dict[str, Any]:
        """The run's counts so far, as published by the chief."""
        step, counts = self.sync.read_counts()
        out = {
            "global_step": step,
            "applied": counts[protocol.APPLIED],
            "dropped_stale": counts[protocol.DROPPED_STALE],
            "dropped_at_end": counts[protocol.DROPPED_AT_END],
        }
        if self._resizing is not None and self._service is not None:
            # The chief's: `(global step, counts)` at each change.
            out["changes"] = list(self._service.changes)
        return out

    @property
    def count_changes(self) -> list:
        """On the chief of a run whose workers join and leave: `(global
        step, resizing.Counts)` at each change of the counts; else []."""
        if self._service is None:
            return []
        return list(self._service.changes)

    def _end(self, failed: bool, error: BaseException | None = None) -> None:
        """Ends this worker's session; `error`: the failed fit's, if known."""
        sync = self.sync
        if failed and sync.is_chief:
            # Without the chief no update can come: stop everyone now.
            sync.poison(range(sync.config.slots))
            sync.send_marker(protocol.SHUTDOWN)
            self._service = None
            return
        sync.send_marker(protocol.LEAVE)
        if self._registry is not None:
            # After a failure: nothing to a lost ps, and the fit's error
            # stays the one raised.
            elastic.leave(
                self._registry,
                failed=failed,
                error=error,
                unreachable_servers=sync.servers_lost,
            )
        if not sync.is_chief:
            skipped = 0 if failed or self._said_end else sync.steps_skipped()
            if skipped:
                # A custom loop: no step end stopped it.
                say(
                    f"keras_psdist sync-replicas: {self._name}: the chief "
                    f"finished its fit (global step {int(sync.global_step.numpy())}) "
                    f"before this worker's loop ended; its last {skipped} "
                    "steps sent nothing: their gradients could only be dropped."
                )
            return
        service = self._service
        # The service ended the session when it handled this LEAVE: every
        # worker still training stops at its next step or wait.
        finished = service.wait_for_session(self._session, sync.config.step_timeout)
        if not finished:
            logging.error(
                "keras_psdist sync-replicas: %s did not finish within "
                "step_timeout=%g s after the chief's fit ended; the chief stops "
                "serving them.",
                sync.config.names(service.active_workers),
                sync.config.step_timeout,
            )
            sync.poison(service.active_workers)
            sync.send_marker(protocol.SHUTDOWN)
            self._service = None
        if service.error is not None:
            self._service = None
            raise RuntimeError(
                "The sync-replica update service failed (see the log above)."
            ) from service.error

    def _stop_error(self) -> Exception:
        servers_lost = self.sync.servers_lost()
        if servers_lost:
            return task_loss.TaskLostError(servers_lost, self._name)
        if self._stall is not None:
            return StalledError(self._stall)
        service = self._service
        if service is not None and service.error is not None:
            if isinstance(service.error, WorkerLostError):
                return WorkerLostError(str(service.error))
            return RuntimeError(
                f"The sync-replica update service failed: {service.error!r}: "
                f"{service.error}"
            )
        try:
            lost = self.sync.lost_workers()
        except tf.errors.OpError:
            lost = []
        if lost:
            return WorkerLostError(
                f"{self._name} was told to stop: {self.sync.config.names(lost)} "
                "was lost (heartbeat stopped) and the others cannot make an "
                "update without them. Restart them (`keras-psdist launch "
                "--max-restarts`), or train with backup workers "
                "(replicas_to_aggregate < total_num_replicas)."
            )
        return RuntimeError(
            f"{self._name} was told to stop: the chief stopped the "
            "run (its fit or its update service failed, or it timed out "
            "waiting for other workers). See the chief's log for the cause."
        )

    def _check_liveness(self) -> str | None:
        """Reports lost workers to the service (chief); on a worker, ends
        its session here if the chief finished it, or says why to stop if
        the chief is lost."""
        if not self.sync.is_chief and self._chief_finished():
            # Usually known already (the end token, or `finished` read with
            # the global step); this catches a step still computing, so that
            # it sends nothing. The chief may be gone: that is no fault now.
            self.sync.end_session(self._session)
            return None
        if self._heartbeats is None:
            return None
        lost = set(self._heartbeats.lost())
        if not self.sync.is_chief:
            if 0 in lost:
                chief = self.sync.config.name(0)
                # Hung, gone, or cut off: what a probe of its port says.
                where = task_loss.whereabouts(self._config, chief)
                return (
                    f"{self._name}: the chief ({chief}) is "
                    "lost: no "
                    f"heartbeat for {self._heartbeats.silent_for(0):.0f} s "
                    f"(heartbeat_timeout={self._heartbeats.timeout:g}). "
                    + (f"{where} " if where else "")
                    + "It makes "
                    "every update, so no step can finish. Restart the run; "
                    "BackupAndRestore resumes it from the last epoch."
                )
            return None
        self._reported_lost &= lost  # the ones back may be lost again later
        service = self._service
        if service is None:
            return None
        for worker in sorted(lost - self._reported_lost):
            if worker in service.active_workers:
                self.sync.send_marker(protocol.LOST, worker)
                self._reported_lost.add(worker)
        return None

    def _chief_finished(self) -> bool:
        return int(self.sync.finished.numpy()) >= self._session

    def _watch(self, stop: threading.Event) -> None:
        timeout = self.sync.config.step_timeout
        while not stop.wait(_WATCH_EVERY_S):
            try:
                chief_lost = self._check_liveness()
            except tf.errors.OpError as e:
                chief_lost = None
                if self.sync.servers_lost():
                    return  # The step fails too, and says which ps.
                logging.warning("keras_psdist sync-replicas: %s", e)
            if chief_lost is not None:
                self._stall = chief_lost
                logging.error("keras_psdist sync-replicas: %s", chief_lost)
                self.sync.poison([self.sync.worker])
                return
            idle = time.monotonic() - self._last_progress
            if idle <= timeout:
                continue
            self._stall = self._stall_reason(idle)
            logging.error("keras_psdist sync-replicas: %s", self._stall)
            if self.sync.is_chief:
                self.sync.poison(range(self.sync.config.slots))
            else:
                self.sync.poison([self.sync.worker])
            return

    def _stall_reason(self, idle: float) -> str:
        timeout = self.sync.config.step_timeout
        missing = self._service.waiting_for if self._service else None
        if missing:
            why = (
                "The chief has no fresh gradient from "
                f"{self.sync.config.names(missing)} for the pending update; "
                "are they running this script? (Worker tasks that only run "
                "`keras-psdist serve` belong to an in-graph launch: run "
                "SyncReplicaStrategy under `keras-psdist launch --mode "
                "between-graph`.)"
            )
        else:
            why = (
                f"Is the chief ({self.sync.config.name(0)}) running? "
                "It applies the updates that release the workers."
            )
        return (
            f"{self._name}: no step finished for {idle:.0f} s "
            f"(step_timeout={timeout:g}). {why} Raise "
            "SyncReplicaStrategy(step_timeout=...) if a step legitimately "
            "takes this long."
        )

    # -------------------------------------------------------------- chief

    def _ensure_service(self) -> UpdateService:
        if self._service is None:
            self._service = UpdateService(
                self.sync,
                self._update_model,
                self._resizing,
                update_in_trace=self._update_in_trace,
                scope=self._strategy.scope,
            )
        return self._service

    def _reduction_for(self, key) -> GradientReduction:
        """The chief's rule for `(replicas_to_aggregate, num_byzantine)`: the
        run's own, or, once the workers have changed, the one bound to the
        new counts."""
        if self._resizing is None:
            return self.reduction
        if not self._reductions:
            first = self.reduction.aggregator
            self._reductions[(first.num_replicas, first.num_byzantine)] = self.reduction
        if key not in self._reductions:
            self._reductions[key] = GradientReduction(
                self._resizing.rule(*key),
                None,
                self.sync.device,
                key[0],
                spread_devices=self._parameter_devices,
            )
        return self._reductions[key]

    def _update_model(self, slots, counts) -> None:
        """One update: the rule over the gradients in the members' `slots`,
        then Keras's own apply (one function call on the chief per update)."""
        if self._update_fn is None:

            def update(slots, key):
                staging = self._service.staging
                return self._update_in_trace([staging.read(s) for s in slots], key)

            self._update_fn = tf.function(update, reduce_retracing=True)
        with self._strategy.scope():
            self._update_fn(slots, _key(counts))

    def _update_in_trace(self, members, key) -> list:
        """The update's ops, in a `tf.function` (the update's own, or the
        service's pop-and-update, `UpdateService`): `members`, each member's
        gradient list on the ps task; `key`, a Python value, traces one
        function per counts. Returns the variables it wrote."""
        reduction = self._reduction_for(key)
        wire = self._strategy.extended.wire
        # A compressed gradient is decompressed on the ps task that staged
        # it (on the chief, a dense gradient per member would cross back to
        # the ps).
        with tf.device(self.sync.device):
            members = [
                [
                    wire.compressor.decompress(g.value) if isinstance(g, Payload) else g
                    for g in member
                ]
                for member in members
            ]
        present = [v for v, g in enumerate(members[0]) if g is not None]
        columns = [[m[v] for m in members] for v in present]
        reduced = iter(reduction(tf.distribute.ReduceOp.MEAN, columns, None))
        grads = [None if g is None else next(reduced) for g in members[0]]
        # Plain SGD in one kernel per variable where that is exactly Keras's
        # update (TF1's path), else Keras's own apply.
        if not plain_sgd.apply(self._optimizer, grads, self._variables):
            self._apply(grads, self._variables)
        return self._variables


def _key(counts) -> tuple:
    """The update function's trace key for `counts` (a `resizing.Counts`)."""
    return (counts.replicas_to_aggregate, counts.num_byzantine)


def _forge_own(attack, grads):
    """This (Byzantine) worker's gradient as its attack forges it."""
    present = [g for g in grads if g is not None]
    dense = [g.values if isinstance(g, tf.IndexedSlices) else g for g in present]
    forged = attack.forge([[d] for d in dense], [[d] for d in dense])
    out, i = [], 0
    for g in grads:
        if g is None:
            out.append(None)
            continue
        value = forged[i][0]
        i += 1
        if isinstance(g, tf.IndexedSlices):
            value = tf.IndexedSlices(value, g.indices, g.dense_shape)
        out.append(value)
    return out


def _check_optimizer(optimizer) -> None:
    if optimizer is None:
        return
    from keras.optimizers import LossScaleOptimizer

    if isinstance(optimizer, LossScaleOptimizer):
        raise ValueError(
            "SyncReplicaStrategy does not support LossScaleOptimizer (mixed "
            "precision's dynamic loss scaling skips steps by a `cond` on every "
            "worker). Received: optimizer="
            f"{type(optimizer.inner_optimizer).__name__} wrapped in "
            "LossScaleOptimizer. Train in float32, or use PSStrategy."
        )
    steps = getattr(optimizer, "gradient_accumulation_steps", None)
    if steps:
        raise ValueError(
            "SyncReplicaStrategy does not support the optimizer's "
            f"gradient_accumulation_steps (received {steps}). Set "
            "replicas_to_aggregate above total_num_replicas instead: each "
            "worker then sends several batches' gradients per update."
        )
