"""A training job whose network the test cuts: one process of a cluster run.

Run by `tests/test_network_faults.py` under `keras-psdist launch` with every
task on a host of its own (`launching.cluster_hosts`):

    python net_fault_job.py OUT_DIR CONFIG_JSON

CONFIG_JSON:

- `strategy`: `"async"` (`PSStrategy(mode="between-graph")`) or `"sync"`
  (`SyncReplicaStrategy`, every worker's gradient in each update).
- `heartbeat_timeout`: every process's; `chief_heartbeat_timeout`: the
  chief's instead, when given.
- `epochs`: an upper bound (default 100000); the test ends training first.

The test times its cuts from what the processes write, and ends them:

- after each step, `OUT_DIR/steps_<task>.json` (replaced atomically):
  `{"start": n, "steps": s}`, the n-th start of the task and its steps so far;
- `OUT_DIR/stop` (written by the test): each process ends its `fit` after
  its next step;
- at the end, `OUT_DIR/<task>_start_<n>.json`: its steps, how its `fit`
  ended (`failure`: `"TypeName: message"`, or None) and, on an async run,
  a shared step counter on the ps (every process adds 1 after each step).

`Launch` (below) runs a job under `keras_psdist.cluster.launch` in a
background thread, keeping each output line with the time it came, for the
test to wait on and to time its cuts by.
"""

import glob
import io
import json
import os
import re
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import digits_job  # noqa: E402
import launching  # noqa: E402


def _write(path, report):
    with open(path + ".tmp", "w") as f:
        json.dump(report, f)
    os.replace(path + ".tmp", path)


# Each process rests this long after each step: the tests wait for events
# (a cut, a restore, 10 more steps), and processes training flat out between
# them would take both cores from the rest of the suite for nothing.
PACE_S = 0.02


class Progress(keras.callbacks.Callback):
    """Writes this process's steps after each one, then rests `PACE_S`;
    stops at `OUT_DIR/stop`."""

    def __init__(self, out_dir, task, start, counter):
        super().__init__()
        self.out_dir = out_dir
        self.task = task
        self.start = start
        self.counter = counter
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        if self.counter is not None:
            # One atomic op on the ps (Keras's `assign_add` reads, then writes).
            self.counter.value.assign_add(1)
        self.steps += 1
        _write(
            os.path.join(self.out_dir, f"steps_{self.task}.json"),
            {"start": self.start, "steps": self.steps},
        )
        if os.path.exists(os.path.join(self.out_dir, "stop")):
            self.model.stop_training = True
        time.sleep(PACE_S)


def main(out_dir, config):
    import keras_psdist as kpd

    tf_config = json.loads(os.environ["TF_CONFIG"])["task"]
    task = f"{tf_config['type']}_{tf_config['index']}"
    # Counted from a file each start makes first (a start that is ended by
    # the watch writes no report).
    start = 1 + len(glob.glob(os.path.join(out_dir, f"{task}_began_*")))
    open(os.path.join(out_dir, f"{task}_began_{start}"), "w").close()
    timeout = config.get("heartbeat_timeout", 6.0)
    if task == "worker_0":
        timeout = config.get("chief_heartbeat_timeout", timeout)
    if config["strategy"] == "async":
        strategy = kpd.PSStrategy(mode="between-graph", heartbeat_timeout=timeout)
    else:
        strategy = kpd.SyncReplicaStrategy(heartbeat_timeout=timeout, step_timeout=120)
    model = digits_job.build(strategy)
    counter = None
    if config["strategy"] == "async":
        with strategy.scope():
            counter = keras.Variable(0, dtype="int64", trainable=False, name="steps")
    initial = None if counter is None else int(counter.numpy())
    progress = Progress(out_dir, task, start, counter)
    x, y = digits_job.digits()
    failure = None
    try:
        keras.utils.set_random_seed(start)
        model.fit(
            x[:1500],
            y[:1500],
            batch_size=digits_job.BATCH_SIZE,
            epochs=config.get("epochs", 100_000),
            verbose=0,
            callbacks=[progress],
        )
    except Exception as e:  # noqa: BLE001 - reported, then re-raised
        failure = f"{type(e).__name__}: {e}"
        raise
    finally:
        _write(
            os.path.join(out_dir, f"{task}_start_{start}.json"),
            {
                "steps": progress.steps,
                "failure": failure,
                "initial_counter": initial,
                "counter": None
                if counter is None or failure is not None
                else int(counter.numpy()),
            },
        )


# ------------------------------------------------- the driver (tests)


class _Lines(io.StringIO):
    """The launcher's output, each line kept with the time it came."""

    def __init__(self):
        super().__init__()
        self.lines: list[tuple[float, str]] = []
        self._lock = threading.Lock()

    def write(self, text):
        with self._lock:
            now = time.monotonic()
            self.lines.extend((now, line) for line in text.splitlines())
            return super().write(text)


class Launch:
    """`launching.launch_job(job, args, **launch_kwargs)` in a background
    thread (`launch` works off the main thread); `out_dir` is where the job
    writes (its first argument)."""

    def __init__(self, job, out_dir, args, **launch_kwargs):
        self.out_dir = str(out_dir)
        self.out = _Lines()
        self.code = None
        self.started = time.monotonic()
        self._thread = threading.Thread(
            target=self._run, args=(job, args, launch_kwargs), daemon=True
        )
        self._thread.start()

    def _run(self, job, args, launch_kwargs):
        try:
            self.code, _ = launching.launch_job(
                job, args, out=self.out, **launch_kwargs
            )
        finally:
            # Beside what the job wrote, to read after a failure.
            with open(os.path.join(self.out_dir, "launch.log"), "w") as f:
                f.write(self.log)

    @property
    def log(self) -> str:
        return self.out.getvalue()

    def running(self) -> bool:
        return self._thread.is_alive()

    def wait(self, done, what, timeout=240.0):
        """Until `done()` is true; fails (with the log's tail) if the launch
        ends first or `timeout` passes. Returns when it became true."""
        deadline = time.monotonic() + timeout
        while not done():
            if not self.running() and not done():
                raise AssertionError(
                    f"the launch ended (exit code {self.code}) before {what}:\n"
                    + launching.without_progress(self.log)[-6000:]
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no {what} within {timeout:g} s:\n"
                    + launching.without_progress(self.log)[-6000:]
                )
            time.sleep(0.05)
        return time.monotonic()

    def line(self, pattern, after=0.0):
        """The first output line at or after `after` (a monotonic time) that
        matches `pattern`, as `(time, line)`; None if there is none yet."""
        regex = re.compile(pattern)
        with self.out._lock:
            lines = list(self.out.lines)
        for at, text in lines:
            if at >= after and regex.search(text):
                return at, text
        return None

    def wait_line(self, pattern, what, after=0.0, timeout=240.0):
        """`line(pattern, after)`, waited for; returns `(time, line)`."""
        self.wait(lambda: self.line(pattern, after) is not None, what, timeout)
        return self.line(pattern, after)

    def steps(self, task):
        """`(start, steps)` of `task` (e.g. `"worker_1"`) so far, or (0, 0)."""
        try:
            with open(os.path.join(self.out_dir, f"steps_{task}.json")) as f:
                report = json.load(f)
        except (OSError, ValueError):
            return 0, 0
        return report["start"], report["steps"]

    def wait_steps(self, task, more, what, start=None, timeout=240.0):
        """Until `task` has made `more` steps past its count now (in its
        start `start`, when given); returns when."""
        now_start, now_steps = self.steps(task)
        if start is not None and start != now_start:
            now_steps = 0

        def done():
            s, n = self.steps(task)
            return (start is None or s == start) and n >= now_steps + more

        return self.wait(done, f"{more} more steps of {task} {what}", timeout)

    def stop(self, timeout=240.0):
        """Asks every process to end its fit; returns the exit code."""
        open(os.path.join(self.out_dir, "stop"), "w").close()
        return self.join(timeout)

    def join(self, timeout=240.0):
        self._thread.join(timeout)
        assert not self._thread.is_alive(), (
            f"the launch did not end within {timeout:g} s"
        )
        return self.code

    def reports(self):
        """What each start of each task wrote at its end: `"worker_1_start_2"`
        -> report."""
        reports = {}
        for path in glob.glob(os.path.join(self.out_dir, "*_start_*.json")):
            with open(path) as f:
                reports[os.path.basename(path)[: -len(".json")]] = json.load(f)
        return reports


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
