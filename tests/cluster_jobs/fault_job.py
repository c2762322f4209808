"""A between-graph training job that loses a worker on purpose: one process.

Run by `tests/test_faults.py` under `keras-psdist launch --mode
between-graph`:

    python fault_job.py OUT_DIR CONFIG_JSON

CONFIG_JSON:

- `strategy`: `"async"` (`PSStrategy(mode="between-graph")`) or `"sync"`
  (`SyncReplicaStrategy`, with `replicas_to_aggregate` if given).
- `kill_worker`, `kill_at_step`: that worker SIGKILLs itself right after that
  step of its first start (a real kill: no cleanup, no goodbye), once its
  heartbeat is on the ps (a worker never seen beating is never lost).
- `freeze_worker`, `freeze_at_step`: that worker SIGSTOPs itself right after
  that step (once its heartbeat is on the ps): a hung process, which no
  launcher sees exit.
- `wait_for_rejoin_at_step`: the chief, at that step, waits until the killed
  worker has been found lost (its heartbeat stopped) and has been started
  again (`max_restarts`) and has read the shared variables, so that both
  happen while the chief still trains. The restarted worker starts beating
  only once the chief has found it lost: a restart quicker than
  `heartbeat_timeout` would never be lost.
- `epochs`, `heartbeat_timeout`.

Every start of worker i writes `OUT_DIR/worker_<i>_start_<n>.json`: its
steps, a shared step counter (on the ps, incremented atomically after each
step by every worker), what it read when it started, and (on the chief)
the workers it found lost.
"""

import glob
import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import digits_job  # noqa: E402

BARRIER_TIMEOUT_S = 180


class Faults(keras.callbacks.Callback):
    """Counts steps in the shared counter, kills this worker, or waits."""

    def __init__(self, out_dir, config, worker, start, counter, strategy):
        super().__init__()
        self.out_dir = out_dir
        self.config = config
        self.worker = worker
        self.start = start
        self.counter = counter
        self.strategy = strategy
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        # The tf.Variable's own assign_add is one atomic op on the ps (Keras's
        # `Variable.assign_add` reads, adds and writes: increments can race).
        self.counter.value.assign_add(1)
        self.steps += 1
        kill = self.config.get("kill_worker")
        if self.worker == kill and self.start == 1:
            if self.steps == self.config["kill_at_step"]:
                _write(self.out_dir, self.worker, self.start, {"steps": self.steps})
                self._wait_until_beat_counted()
                os.kill(os.getpid(), signal.SIGKILL)
        if (
            self.worker == self.config.get("freeze_worker")
            and self.steps == (self.config["freeze_at_step"])
        ):
            # Frozen, not dead: its process is still there (as when a machine
            # hangs or is cut off), only its heartbeat stops.
            _write(self.out_dir, self.worker, self.start, {"steps": self.steps})
            self._wait_until_beat_counted()
            os.kill(os.getpid(), signal.SIGSTOP)
        if self.worker == 0 and self.steps == self.config.get(
            "wait_for_rejoin_at_step"
        ):
            self._wait_for_rejoin(kill)

    def _wait_until_beat_counted(self):
        """Until this worker's heartbeat thread has beaten on the ps: the
        others take only a worker that has beaten for lost."""
        beats = self.strategy.extended.services.heartbeats.beats
        _wait_until(
            lambda: beats.numpy()[self.worker] > 0,
            f"worker {self.worker}'s first heartbeat on the ps",
        )

    def _wait_for_rejoin(self, worker):
        """Until `worker` has been lost and is back: in async mode, its
        heartbeat; in sync mode, the chief's published lost mask (cleared
        when its gradients come again). Once it is lost, tells its restart
        to start (see `_wait_until_found_lost`)."""
        sync = getattr(self.strategy.extended.sync_training, "sync", None)
        heartbeats = self.strategy.extended.heartbeats  # the extended's, before 0.4
        assert heartbeats is self.strategy.extended.services.heartbeats

        def lost():
            if sync is not None:
                return worker in sync.lost_workers()
            return worker in heartbeats.lost()

        deadline = time.monotonic() + BARRIER_TIMEOUT_S
        seen_lost = False
        rejoined = os.path.join(self.out_dir, f"rejoined_{worker}")
        while not (seen_lost and os.path.exists(rejoined) and not lost()):
            if not seen_lost and lost():
                seen_lost = True
                open(_found_lost_path(self.out_dir, worker), "w").close()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"worker {worker}: lost seen {seen_lost}, rejoined "
                    f"{os.path.exists(rejoined)} after {BARRIER_TIMEOUT_S} s"
                )
            time.sleep(0.2)


def _found_lost_path(out_dir, worker):
    return os.path.join(out_dir, f"found_lost_{worker}")


def _wait_until_found_lost(out_dir, worker):
    """A restarted worker, before it builds its strategy (and beats): until
    the chief has found its previous start lost."""
    path = _found_lost_path(out_dir, worker)
    _wait_until(
        lambda: os.path.exists(path), f"{path} (the chief found worker {worker} lost)"
    )


def _wait_until(done, what):
    deadline = time.monotonic() + BARRIER_TIMEOUT_S
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {BARRIER_TIMEOUT_S} s")
        time.sleep(0.1)


def _write(out_dir, worker, start, report):
    path = os.path.join(out_dir, f"worker_{worker}_start_{start}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(report, f)
    os.replace(path + ".tmp", path)


def main(out_dir, config):
    import tensorflow as tf

    import keras_psdist as kpd

    # The launcher's task for this process: worker:i, the chief is worker:0.
    worker = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    start = 1 + len(glob.glob(os.path.join(out_dir, f"worker_{worker}_start_*")))
    if start > 1 and "wait_for_rejoin_at_step" in config:
        _wait_until_found_lost(out_dir, worker)
    timeout = config.get("heartbeat_timeout", 30.0)
    if config["strategy"] == "async":
        strategy = kpd.PSStrategy(mode="between-graph", heartbeat_timeout=timeout)
    else:
        strategy = kpd.SyncReplicaStrategy(
            replicas_to_aggregate=config.get("replicas_to_aggregate"),
            heartbeat_timeout=timeout,
            step_timeout=120,
        )
    assert strategy.extended.topology.worker_index == worker
    model = digits_job.build(strategy)
    with strategy.scope():
        counter = keras.Variable(0, dtype="int64", trainable=False, name="steps")
    initial = {
        "counter": int(counter.numpy()),
        "checksum": float(sum(np.abs(w.numpy()).sum() for w in model.weights)),
    }
    if start > 1:
        open(os.path.join(out_dir, f"rejoined_{worker}"), "w").close()
    digits_job.EPOCHS = config.get("epochs", 3)
    faults = Faults(out_dir, config, worker, start, counter, strategy)
    failure = None
    try:
        digits_job.train(model, 0, [faults])
    except Exception as e:  # noqa: BLE001 - reported, then re-raised
        failure = f"{type(e).__name__}: {e}"
        raise
    finally:
        report = {
            "steps": faults.steps,
            "initial": initial,
            "failure": failure,
            "counter": int(counter.numpy()) if failure is None else None,
        }
        if config["strategy"] == "sync" and failure is None:
            sync = strategy.extended.sync_training.sync
            # Steps that sent nothing: the chief had finished the fit.
            report["steps_skipped"] = sync.steps_skipped()
            counts = strategy.extended.sync_training.counts()
            report["counts"] = {k: np.asarray(v).tolist() for k, v in counts.items()}
            report["lost"] = strategy.extended.sync_training.sync.lost_workers()
        _write(out_dir, worker, start, report)
        del tf


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
