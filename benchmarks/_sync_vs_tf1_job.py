"""One worker process of `benchmarks/sync_vs_tf1.py` (see its docstring).

Run on every worker task by `keras_psdist.cluster.launch(mode="between-graph")`
(its TF_CONFIG says which task it is)::

    python benchmarks/_sync_vs_tf1_job.py --side tf1|ours --out-dir DIR
        [--steps N] [--batch B] [--lr LR] [--warmup N]

Both sides train the same MLP (784-512-512-10, softmax cross-entropy) with
plain SGD on the same synthetic data, each worker its own batches:

- `tf1`: TensorFlow 1's `SyncReplicasOptimizer` as its docs set it up:
  graph mode, `replica_device_setter`, `MonitoredTrainingSession` with the
  optimizer's session hook, `replicas_to_aggregate = total_num_replicas =
  W`; its ps tasks are standard servers (`--serve-ps`, `server.join()`).
- `ours`: `SyncReplicaStrategy()` and Keras's `model.fit`.

The chief (worker 0) writes `DIR/chief.json`: at the end of each of its
steps, the time, the global step, and the CPU seconds used so far by itself
and by the ps task (`CpuClock`). It then touches `DIR/done`; every
other worker exits as soon as it sees that file (TF1's workers otherwise
block for a token that never comes once the chief has stopped).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402

SIZES = (784, 512, 512, 10)
EXAMPLES = 4096


def data(worker: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(worker)
    x = rng.normal(size=(EXAMPLES, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[-1], size=EXAMPLES).astype(np.int32)
    return x, y


class CpuClock:
    """CPU seconds used so far by this process and by the ps task (found
    once, among this machine's processes, by its TF_CONFIG: the ps of this
    cluster). The ps's is None if it cannot be read."""

    def __init__(self, cluster: dict):
        self._ps = cluster["ps"][0]
        self._pid = None
        self._tick = os.sysconf("SC_CLK_TCK")

    def _find_ps(self):
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            for item in environ:
                if not item.startswith(b"TF_CONFIG="):
                    continue
                try:
                    config = json.loads(item[len(b"TF_CONFIG=") :])
                except ValueError:
                    break
                task, cluster = config.get("task", {}), config.get("cluster", {})
                if (
                    task.get("type") == "ps"
                    and cluster.get("ps", [None])[0] == self._ps
                ):
                    return int(entry.name)
                break
        return None

    def now(self) -> tuple[float, float | None]:
        own = time.process_time()
        if self._pid is None:  # looked for once: False if not found
            self._pid = self._find_ps() or False
        if not self._pid:
            return own, None
        try:
            fields = (
                Path(f"/proc/{self._pid}/stat").read_text().rsplit(")", 1)[1].split()
            )
        except OSError:
            return own, None
        # utime and stime: fields 14 and 15 of stat, 12 and 13 after the name.
        return own, (int(fields[11]) + int(fields[12])) / self._tick


def exit_when_done(out_dir: Path) -> None:
    """A non-chief worker: exits the process once the chief is done."""

    def watch():
        while not (out_dir / "done").exists():
            time.sleep(0.1)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def tf1(args, worker: int, num_workers: int, cluster_spec: dict) -> list:
    import tensorflow as tf

    v1 = tf.compat.v1
    v1.disable_eager_execution()
    cluster = tf.train.ClusterSpec(cluster_spec)
    server = tf.distribute.Server(cluster, job_name="worker", task_index=worker)
    is_chief = worker == 0
    x, y = data(worker)
    with v1.device(
        v1.train.replica_device_setter(
            worker_device=f"/job:worker/task:{worker}", cluster=cluster
        )
    ):
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(args.batch)
        features, labels = v1.data.make_one_shot_iterator(dataset).get_next()
        h = features
        for i, (m, n) in enumerate(zip(SIZES[:-1], SIZES[1:], strict=True)):
            w = v1.get_variable(
                f"w{i}", [m, n], initializer=v1.glorot_uniform_initializer(seed=i)
            )
            b = v1.get_variable(f"b{i}", [n], initializer=v1.zeros_initializer())
            h = tf.matmul(h, w) + b
            if i < len(SIZES) - 2:
                h = tf.nn.relu(h)
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=h)
        )
        global_step = v1.train.get_or_create_global_step()
        optimizer = v1.train.SyncReplicasOptimizer(
            v1.train.GradientDescentOptimizer(args.lr),
            replicas_to_aggregate=num_workers,
            total_num_replicas=num_workers,
        )
        train_op = optimizer.minimize(loss, global_step=global_step)
    hooks = [
        optimizer.make_session_run_hook(is_chief),
        v1.train.StopAtStepHook(last_step=args.steps),
    ]
    config = v1.ConfigProto(
        device_filters=["/job:ps", f"/job:worker/task:{worker}"],
        operation_timeout_in_ms=600_000,
    )
    steps = []
    clock = CpuClock(cluster_spec)
    with v1.train.MonitoredTrainingSession(
        master=server.target,
        is_chief=is_chief,
        hooks=hooks,
        config=config,
        save_checkpoint_secs=None,
        save_summaries_steps=None,
        log_step_count_steps=None,
    ) as session:
        profile = os.environ.get("KERAS_PSDIST_BENCH_PROFILE")
        while not session.should_stop():
            if profile and is_chief and len(steps) == args.warmup:
                tf.profiler.experimental.start(profile)
            _, step = session.run([train_op, global_step])
            steps.append((time.perf_counter(), int(step), *clock.now()))
            if profile and is_chief and len(steps) == args.warmup + 20:
                tf.profiler.experimental.stop()
        # Reported before the session closes: the close can block for good
        # (its queue runner stuck in an enqueue on the ps), and it is not
        # part of what is measured.
        finish(args.out_dir, worker, steps)
    return steps


def ours(args, worker: int, cluster: dict) -> list:
    import keras

    import keras_psdist as kpd

    strategy = kpd.SyncReplicaStrategy()
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((SIZES[0],))]
            + [keras.layers.Dense(n, activation="relu") for n in SIZES[1:-1]]
            + [keras.layers.Dense(SIZES[-1])]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(args.lr),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=args.steps_per_execution,
        )
    import tensorflow as tf

    x, y = data(worker)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(args.batch)
    steps = []
    training = strategy.extended.sync_training
    clock = CpuClock(cluster)

    profile = os.environ.get("KERAS_PSDIST_BENCH_PROFILE")

    class StepEnds(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            steps.append((time.perf_counter(), batch + 1, *clock.now()))
            # A TensorFlow profile of 20 steady steps (chief only), for
            # TensorBoard's profile plugin.
            if profile and worker == 0 and batch + 1 == args.warmup:
                tf.profiler.experimental.start(profile)
            if profile and worker == 0 and batch + 1 == args.warmup + 20:
                tf.profiler.experimental.stop()

    model.fit(
        dataset, steps_per_epoch=args.steps, epochs=1, verbose=0, callbacks=[StepEnds()]
    )
    if worker == 0:
        updates = int(training.counts()["global_step"])
        # Each chief step waits for its own update (R = W): step i ends after
        # update i.
        assert updates >= steps[-1][1], (updates, steps[-1][1])
    return steps


def serve_ps() -> int:
    """A TF1 ps task: a standard server that knows the whole cluster (the
    workers' graphs send it ops that reply to them), as TF's docs run it."""
    import tensorflow as tf

    tf_config = json.loads(os.environ["TF_CONFIG"])
    from keras_psdist.cluster.server import READY_LINE

    index = int(tf_config["task"]["index"])
    server = tf.distribute.Server(
        tf.train.ClusterSpec(tf_config["cluster"]), job_name="ps", task_index=index
    )
    # What the launcher waits for before it starts the workers.
    address = tf_config["cluster"]["ps"][index]
    print(
        READY_LINE.format(name=f"ps:{index}", address=address, pid=os.getpid()),
        flush=True,
    )
    server.join()
    return 0


def main() -> int:
    if sys.argv[1:] == ["--serve-ps"]:
        return serve_ps()
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", choices=("tf1", "ours"), required=True)
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--steps-per-execution", type=int, default=1)
    args = parser.parse_args()
    tf_config = json.loads(os.environ["TF_CONFIG"])
    worker = int(tf_config["task"]["index"])
    cluster = tf_config["cluster"]
    num_workers = len(cluster["worker"])
    if worker != 0:
        exit_when_done(args.out_dir)
    if args.side == "tf1":
        steps = tf1(args, worker, num_workers, cluster)
    else:
        steps = ours(args, worker, cluster)
    finish(args.out_dir, worker, steps)
    return 0


def finish(out_dir: Path, worker: int, steps: list) -> None:
    """Writes the chief's report, then ends this process (the chief at
    once, another worker once the chief is done)."""
    if worker == 0:
        (out_dir / "chief.json").write_text(json.dumps({"steps": steps}))
        (out_dir / "done").touch()
    else:
        # Finished its steps before the chief: wait for the chief's file.
        while not (out_dir / "done").exists():
            time.sleep(0.1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
