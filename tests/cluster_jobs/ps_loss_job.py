"""A training job whose ps task is killed (by the test) mid-`fit`: one process.

Run by `tests/test_faults.py` under `keras-psdist launch`:

    python ps_loss_job.py OUT_DIR CONFIG_JSON

CONFIG_JSON:

- `strategy`: `"async"` (`PSStrategy(mode="between-graph")`, between-graph),
  `"sync"` (`SyncReplicaStrategy`, between-graph) or `"in-graph"`
  (`PSStrategy()`, the chief drives every worker).
- `lose_ps_at_step`: the chief writes `OUT_DIR/kill_ps` after that step, and
  the test kills the ps task; the chief then waits until the ps is gone.
- `lose_ps_after_epoch`: the same, after that epoch's end (and after
  `keras.callbacks.BackupAndRestore` saved it); the chief first writes what
  the model and optimizer hold to `OUT_DIR/at_epoch_end.npz`.
- `backup_dir`: train with `BackupAndRestore(backup_dir)`; the chief writes
  what the model and optimizer hold once it has restored (at the start of
  `fit`) to `OUT_DIR/restored.npz`, and each epoch it begins to
  `OUT_DIR/epochs.json`.
- `epochs`.

Each process writes `OUT_DIR/<task>.json`: its steps, how its `fit` ended
(`failure`: `"TypeName: message"`, or None), when (`ended_at`, wall clock)
and its median step time over its last steps (`median_step_s`).
"""

import faulthandler
import io
import json
import os
import signal
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import digits_job  # noqa: E402
import launching  # noqa: E402

PS_GONE_TIMEOUT_S = 120


def state(model):
    """Every weight and optimizer variable, by position."""
    values = [v.numpy() for v in model.weights]
    values += [v.numpy() for v in model.optimizer.variables]
    return {f"arr_{i}": v for i, v in enumerate(values)}


class LosePs(keras.callbacks.Callback):
    """Has the test kill the ps at a step or after an epoch, and waits for it."""

    def __init__(self, out_dir, config, topology):
        super().__init__()
        self.out_dir = out_dir
        self.config = config
        self.is_chief = topology.is_chief
        self.worker = topology.worker_index
        self.num_workers = topology.num_training_processes
        self.cluster_config = topology.config
        self.steps = 0
        self.step_ends = []

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        self.step_ends.append(time.time())
        if self.steps == 1:
            open(os.path.join(self.out_dir, f"training_{self.worker}"), "w").close()
        if self.is_chief and self.steps == self.config.get("lose_ps_at_step"):
            self._lose_ps()

    def on_epoch_end(self, epoch, logs=None):
        if self.is_chief and epoch + 1 == self.config.get("lose_ps_after_epoch"):
            np.savez(
                os.path.join(self.out_dir, "at_epoch_end.npz"), **state(self.model)
            )
            self._lose_ps()

    def _lose_ps(self):
        from keras_psdist.cluster import task_loss

        # Every process trains (none is still building its model) when the
        # ps is killed.
        deadline = time.monotonic() + PS_GONE_TIMEOUT_S
        for worker in range(self.num_workers):
            path = os.path.join(self.out_dir, f"training_{worker}")
            while not os.path.exists(path):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"worker {worker} never started training")
                time.sleep(0.05)
        open(os.path.join(self.out_dir, "kill_ps"), "w").close()
        while not task_loss.unreachable_tasks(self.cluster_config, ("ps",)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the ps was not killed in {PS_GONE_TIMEOUT_S} s")
            time.sleep(0.1)


def state_in_weights_file(content, tmp_path):
    """What a `.weights.h5` file holds, read without keras_psdist: weights
    then optimizer variables, in the order `state` lists them."""
    import tensorflow as tf

    path = tmp_path / "copy.weights.h5"
    path.write_bytes(content)
    model = digits_job.build(tf.distribute.get_strategy(), seed=2)
    model.optimizer.build(model.trainable_variables)
    model.load_weights(path)
    return [v.numpy() for v in model.weights] + [
        v.numpy() for v in model.optimizer.variables
    ]


class RecordRestore(keras.callbacks.Callback):
    """After BackupAndRestore (listed before it): what `fit` resumed from."""

    def __init__(self, out_dir):
        super().__init__()
        self.out_dir = out_dir
        self.epochs = []

    def on_train_begin(self, logs=None):
        np.savez(os.path.join(self.out_dir, "restored.npz"), **state(self.model))

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)
        with open(os.path.join(self.out_dir, "epochs.json"), "w") as f:
            json.dump(self.epochs, f)


def main(out_dir, config):
    # `kill -USR1 <pid>` prints every thread's stack (to diagnose a hang).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    import keras_psdist as kpd

    if config["strategy"] == "async":
        strategy = kpd.PSStrategy(mode="between-graph", heartbeat_timeout=3)
    elif config["strategy"] == "sync":
        strategy = kpd.SyncReplicaStrategy(heartbeat_timeout=3, step_timeout=120)
    else:
        strategy = kpd.PSStrategy(heartbeat_timeout=3)
    topology = strategy.extended.topology
    task = topology.config.task_name
    model = digits_job.build(strategy, seed=config.get("seed", 0))
    lose_ps = LosePs(out_dir, config, topology)
    callbacks = [lose_ps]
    if "backup_dir" in config:
        callbacks = [
            keras.callbacks.BackupAndRestore(config["backup_dir"]),
            RecordRestore(out_dir),
            lose_ps,
        ]
    digits_job.EPOCHS = config["epochs"]
    failure = None
    try:
        digits_job.train(model, 0, callbacks)
    except Exception as e:  # noqa: BLE001 - reported, then re-raised
        failure = f"{type(e).__name__}: {e}"
        raise
    finally:
        with open(os.path.join(out_dir, f"{task.replace(':', '_')}.json"), "w") as f:
            step_s = np.diff(lose_ps.step_ends[-20:])
            report = {
                "steps": lose_ps.steps,
                "failure": failure,
                "ended_at": time.time(),
                "median_step_s": float(np.median(step_s)) if len(step_s) else None,
            }
            json.dump(report, f)


# ------------------------------------------------- the driver (tests, benchmark)


class _Log(io.StringIO):
    """The launcher's output, and the pid of each task it started."""

    def __init__(self):
        super().__init__()
        self.pids: dict[str, int] = {}
        self._lock = threading.Lock()

    def write(self, text):
        with self._lock:
            for line in text.splitlines():
                match = launching.PID_LINE.match(line)
                if match:
                    self.pids[match.group(1)] = int(match.group(2))
            return super().write(text)


def launch_and_kill_ps(out_dir, config, ps, **launch_kwargs):
    """Runs this job under `keras_psdist.cluster.launch` and SIGKILLs task
    `ps` once the chief asks for it (`out_dir/kill_ps`).

    Returns `(exit code, log, reports)`: reports by task file stem (e.g.
    `"worker_1"`), plus `"killed_at"` (wall clock) when the kill happened.
    Bounded by the launch's `timeout_s`.
    """
    out = _Log()
    result = {}

    def run():
        result["code"], _ = launching.launch_job(
            __file__, [out_dir, json.dumps(config)], out=out, **launch_kwargs
        )

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    kill_file = os.path.join(out_dir, "kill_ps")
    while thread.is_alive() and not os.path.exists(kill_file):
        time.sleep(0.05)
    killed_at = None
    if thread.is_alive():
        os.kill(out.pids[ps], signal.SIGKILL)
        killed_at = time.time()
    thread.join()
    reports = {}
    for name in os.listdir(out_dir):
        if name.endswith(".json") and name != "epochs.json":
            with open(os.path.join(out_dir, name)) as f:
                reports[name[: -len(".json")]] = json.load(f)
    reports["killed_at"] = killed_at
    return result["code"], out.getvalue(), reports


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
