"""An elastic async job: workers join and leave during one `fit` of the chief.

Run by `tests/test_elastic.py` under `keras-psdist launch --mode
between-graph --num-workers 2 --max-workers 4`:

    python elastic_job.py OUT_DIR [CYCLES] [async|sync] [PACE_S]

PACE_S (async): seconds each worker but the chief rests after each step, so
that workers training flat out on 2 cores leave processes that join some CPU
to start (the tests pass 0.05; the benchmark leaves it 0).

Every worker trains `Dense(1, use_bias=False)` from zeros with `SGD(2**-6)`
and loss `mean(prediction)`. Async (`PSStrategy`), on a constant input
`k + 1` (k: its worker index): each update it applies subtracts exactly
`2**-6 * (k + 1)` from every weight, so the final weights say how many
updates each worker applied. Sync (`SyncReplicaStrategy(replicas_to_aggregate=
"all_but_one")`), on ones: each update subtracts exactly `2**-6`, whatever
the gradients it combines, so the final weights say how many updates the
chief made. The others train until asked to leave.

The chief (worker:0), during its `fit`:

1. after its step 5, asks the launcher for two more workers
   (`add-worker`) and waits until worker:2 and worker:3 are members and
   have each applied an update (the time from the request to that first
   update is the join time);
2. (async) starts two joiners with bad TF_CONFIGs and checks that each is
   refused (one claims live worker:1, one index 4 of max_workers 4) and that
   the membership did not change;
3. removes worker:3 (`remove-worker-3`) and waits until it has left;
4. trains 5 more steps, asks worker:1 and worker:2 to leave, waits until
   they have, and ends its `fit`.

With CYCLES (`benchmarks/elastic.py`), the chief instead adds and removes
a third worker CYCLES times (2 changes each), timing each join (the request
to the joiner's first applied update) and leave.

It writes `OUT_DIR/chief.json`: the final weights, the updates each slot
applied (sync: the gradients of each slot applied, dropped, and the counts
at each change), the membership events of `MembershipReport`, the join
times, the refused joiners' exit codes and output tails; each other worker
writes `OUT_DIR/worker_<k>.json`, with the gradients it sent (sync).
"""

import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

LR = 2.0**-6
WAIT_S = 120
DIM = 4


def _wait(what, condition):
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"elastic_job: waited {WAIT_S} s for {what}")
        time.sleep(0.05)


def _touch(name):
    with open(os.path.join(os.environ["KERAS_PSDIST_CONTROL_DIR"], name), "w"):
        pass


def _free_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _bad_joiners(*joiners):
    """Starts this script as worker:`index` with `num_listed` workers listed,
    for each `(index, num_listed)` at once; returns each one's (exit code,
    the last lines of its output)."""
    procs = [_bad_joiner(index, num_listed) for index, num_listed in joiners]
    out = []
    for proc in procs:
        text, _ = proc.communicate(timeout=WAIT_S)
        out.append((proc.returncode, text[-3000:]))
    return out


def _bad_joiner(index, num_listed):
    config = json.loads(os.environ["TF_CONFIG"])
    workers = list(config["cluster"]["worker"])
    while len(workers) < num_listed:
        # Not dialled: async workers call nobody.
        workers.append(f"127.0.0.1:{len(workers) + 1}")
    # Its own address is a new one (a new host or port): only the slot
    # clashes, which the registry decides.
    workers = workers[:num_listed]
    workers[index] = f"127.0.0.1:{_free_port()}"
    config["cluster"]["worker"] = workers
    config["task"] = {"type": "worker", "index": index}
    env = dict(os.environ, TF_CONFIG=json.dumps(config))
    env.pop("KERAS_PSDIST_LEAVE_FILE", None)
    return subprocess.Popen(
        [sys.executable, __file__, "--joiner"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _applied(extended):
    """The updates (async) or gradients (sync) each slot has applied."""
    return [int(a) for a in extended.sync_training.counts()["applied"]]


class Sent(keras.callbacks.Callback):
    """Counts this worker's steps (sync: each sent one gradient, unless the
    chief had finished); with `pace`, rests that long after each, so that
    async workers training flat out on 2 cores leave the processes that join
    some CPU to start."""

    def __init__(self, pace=0.0):
        super().__init__()
        self.steps = 0
        self.pace = pace

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.pace:
            time.sleep(self.pace)


class Cycles(keras.callbacks.Callback):
    """The chief's part in `benchmarks/elastic.py`: `cycles` times, add a
    worker (the launcher reuses the slot the last one freed) and wait for
    its first update, then remove it and wait until it has left; then ask
    worker:1 to leave and end."""

    def __init__(self, extended, out, cycles):
        super().__init__()
        self.registry = extended.registry
        self.applied = lambda: _applied(extended)
        self.out = out
        self.cycles = cycles
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.steps != 5:
            return
        registry = self.registry
        join_s, leave_s = [], []
        for _ in range(self.cycles):
            before = self.applied()
            requested = time.monotonic()
            _touch("add-worker")
            _wait(
                "a worker to join and apply",
                lambda before=before: self.applied()[2] > before[2],
            )
            join_s.append(time.monotonic() - requested)
            requested = time.monotonic()
            _touch("remove-worker-2")
            _wait("worker:2 to leave", lambda: registry.states()[2] == 2)
            leave_s.append(time.monotonic() - requested)
        self.out["join_s"] = join_s
        self.out["leave_s"] = leave_s
        _touch("remove-worker-1")
        _wait("worker:1 to leave", lambda: registry.states()[1] == 2)
        self.model.stop_training = True


class Choreography(keras.callbacks.Callback):
    """The chief's part: grow to 4, refuse bad joiners, shrink to 3, end."""

    def __init__(self, extended, out, refusals=True):
        super().__init__()
        self.refusals = refusals
        self.registry = extended.registry
        self.watcher = extended.services.membership
        self.applied = lambda: _applied(extended)
        self.out = out
        self.steps = 0
        self.phase = "grow"
        self.after_shrink = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        registry = self.registry
        if self.phase == "grow" and self.steps == 5:
            # Worker:1 may still be starting (the chief does not wait for it,
            # as PSv2's does not): grow from the launched 2, and let the
            # watcher see them before the joiners come.
            _wait("worker:1 to join", lambda: registry.members() == [0, 1])
            self.watcher.look()
            requested = time.monotonic()
            before = self.applied()
            _touch("add-worker")
            _touch("add-worker-2")
            joined = {}

            def both_applied():
                applied = self.applied()
                for k in (2, 3):
                    if k not in joined and applied[k] > before[k]:
                        joined[k] = time.monotonic() - requested
                return len(joined) == 2 and registry.members() == [0, 1, 2, 3]

            _wait("worker:2 and worker:3 to join and apply", both_applied)
            self.out["join_s"] = joined
            if self.refusals:
                version = int(registry.version.numpy())
                self.out["refused"] = _bad_joiners((1, 2), (4, 5))
                self.out["members_after_refusals"] = registry.members()
                self.out["version_unchanged"] = int(registry.version.numpy()) == version
            _touch("remove-worker-3")
            _wait("worker:3 to leave", lambda: registry.states()[3] == 2)
            self.phase = "shrunk"
        elif self.phase == "shrunk":
            self.after_shrink += 1
            if self.after_shrink == 5:
                _touch("remove-worker-1")
                _touch("remove-worker-2")
                _wait(
                    "worker:1 and worker:2 to leave",
                    lambda: registry.states()[1:3] == [2, 2],
                )
                self.model.stop_training = True
                self.phase = "done"


class UpdateAudit:
    """Sync chief: each update whose weight change is not exactly `-LR`,
    with what made it (the members' workers and staged gradients, the
    counts), so that a wrong update names its inputs."""

    def __init__(self, sync_training, model):
        self.wrong = []
        self.updates = 0
        self._training = sync_training
        self._model = model
        self._inner = sync_training._update_model
        sync_training._update_model = self
        # The updates the service pops, makes and releases in one call
        # (`UpdateService._pop_and_update`) are audited around that call.
        ensure_service = sync_training._ensure_service

        def audited_service():
            service = ensure_service()
            if not getattr(service, "_audited", False):
                service._audited = True
                pop_and_update = service._pop_and_update

                def audited_pop_and_update():
                    # It makes any number of updates (each a change of -LR)
                    # before it returns, with the elements it stopped at.
                    before, step = self._kernel(), service._step
                    counts = service.counts_now
                    left = pop_and_update()
                    made = service._step - step
                    if made:
                        self._check(before, service, [], counts, [], made)
                    return left

                service._pop_and_update = audited_pop_and_update
            return service

        sync_training._ensure_service = audited_service

    def _kernel(self):
        return self._model.trainable_variables[0].numpy().ravel()

    def __call__(self, members, counts):
        service = self._training._service
        workers = [w for w, _ in service._members]
        before = self._kernel()
        staged = [[v.numpy().ravel().tolist() for v in slot] for slot in members]
        self._inner(members, counts)
        self._check(before, service, workers, counts, staged)

    def _check(self, before, service, workers, counts, staged, made=1):
        self.updates += made
        delta = (self._kernel() - before).tolist()
        if delta != [-LR * made] * DIM:
            self.wrong.append(
                {
                    "update": self.updates,
                    "step": service._step,
                    "workers": workers,
                    "counts": [counts.num_workers, counts.replicas_to_aggregate],
                    "staged": staged,
                    "delta": delta,
                }
            )


def main(out_dir, cycles=0, kind="async", pace_s=0.0):
    import keras_psdist as kpd

    sync = kind == "sync"
    if sync:
        strategy = kpd.SyncReplicaStrategy(
            replicas_to_aggregate="all_but_one", step_timeout=WAIT_S * 2
        )
    else:
        strategy = kpd.PSStrategy(mode="between-graph")
    extended = strategy.extended
    k = extended.topology.worker_index
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((DIM,)),
                keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros"),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(LR),
            loss=lambda y, prediction: tf.reduce_mean(prediction),
        )
    # 4 rows a step per worker: each global batch of 16 splits into
    # max_workers = 4 pieces; worker k trains on piece k.
    x = np.full((16 * 50000, DIM), 1.0 if sync else float(k + 1), np.float32)
    y = np.zeros((len(x), 1), np.float32)
    report = kpd.callbacks.MembershipReport(
        log_dir=os.path.join(out_dir, "tensorboard")
        if extended.topology.is_chief
        else None
    )
    out = {"worker": k}
    audit = (
        UpdateAudit(extended.sync_training, model)
        if sync and extended.topology.is_chief
        else None
    )
    # (Sync workers wait for each update anyway.)
    sent = Sent(pace=0.0 if sync or extended.topology.is_chief else float(pace_s))
    callbacks = [report, sent]
    if extended.topology.is_chief:
        callbacks.append(
            Cycles(extended, out, int(cycles))
            if int(cycles)
            # (Admission is the same code in both; its test runs async.)
            else Choreography(extended, out, refusals=not sync)
        )
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=callbacks)
    out["applied"] = _applied(extended)
    if sync:
        counts = extended.sync_training.counts()
        out["global_step"] = int(counts["global_step"])
        out["dropped"] = [
            int(a) + int(b)
            for a, b in zip(
                counts["dropped_stale"], counts["dropped_at_end"], strict=True
            )
        ]
        out["sent"] = sent.steps - extended.sync_training.sync.steps_skipped()
        out["count_changes"] = [
            [step, c.num_workers, c.replicas_to_aggregate]
            for step, c in extended.sync_training.count_changes
        ]
    if audit is not None:
        out["wrong_updates"] = audit.wrong
        out["audited_updates"] = audit.updates
    out["states"] = extended.registry.states()
    out["weights"] = model.get_weights()[0].ravel().tolist()
    out["events"] = report.events
    if not sync:
        out["counts"] = extended.sync_training.counts()
    name = "chief.json" if extended.topology.is_chief else f"worker_{k}.json"
    if os.path.exists(os.path.join(out_dir, name)):  # a slot's later worker
        name = name.replace(".json", f"_{time.time_ns()}.json")
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump(out, f)
    print(f"elastic_job: worker:{k} done, applied {out['applied']}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--joiner":
        # A joiner the chief starts with a bad TF_CONFIG: it must be refused.
        import keras_psdist as kpd

        kpd.PSStrategy(mode="between-graph")
        print("elastic_job: the bad joiner was admitted", flush=True)
        sys.exit(0)
    main(*sys.argv[1:])
