"""One worker process of `benchmarks/sync_replicas.py` (see its docstring).

Run on every worker task by `keras_psdist.cluster.launch(mode="between-graph")`
(its TF_CONFIG says which task it is)::

    python benchmarks/_sync_replicas_job.py --out-dir DIR --num-workers W
        --straggler I --replicas-to-aggregate R [--sleep S] [--seconds T]
        [--warmup-steps N] [--batch B] [--seed SEED]

It trains the digits MLP under `SyncReplicaStrategy(replicas_to_aggregate=R)`
until the chief's measured window closes, worker `I` sleeping `S` s
after each step, and writes `DIR/worker_<i>.json`: its step-end times and CPU
times, and on the chief the window's two `counts()` reads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# Before TensorFlow is imported.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

TRAIN_EXAMPLES = 1500  # of digits' 1,797; the rest is held out
# A bound, not a target: workers stop when the chief's window closes.
MAX_STEPS = 1_000_000

# Limits that turn a hang into a failure (seconds).
WARMUP_TIMEOUT_S = 120.0
STEP_TIMEOUT_S = 120.0


def run(args: argparse.Namespace) -> int:
    """What a worker process does: train until the chief's window closes."""
    import keras
    import numpy as np

    import keras_psdist as kpd

    strategy = kpd.SyncReplicaStrategy(
        replicas_to_aggregate=args.replicas_to_aggregate, step_timeout=STEP_TIMEOUT_S
    )
    topology = strategy.extended.topology
    worker = topology.worker_index
    model = _build_model(strategy, args.seed)
    dataset, (x_test, y_test) = _digits(args.batch, args.seed + worker)

    out_dir = Path(args.out_dir)
    clock = _make_window_clock()(
        strategy.extended.sync_training,
        out_dir,
        worker,
        topology.is_chief,
        args.warmup_steps,
        args.seconds,
        args.num_workers,
    )
    callbacks = [clock]
    straggler = worker == args.straggler and args.sleep > 0
    if straggler:
        callbacks.append(_make_straggler()(args.sleep))
    fit_start = time.time()
    model.fit(
        dataset,
        epochs=1,
        steps_per_epoch=MAX_STEPS,
        verbose=0,
        callbacks=[*callbacks, keras.callbacks.TerminateOnNaN()],
    )
    fit_end = time.time()
    logits = model(x_test, training=False)
    report = {
        "worker": worker,
        "is_chief": topology.is_chief,
        "replicas_to_aggregate": args.replicas_to_aggregate,
        "straggler": straggler,
        "sleep_s": args.sleep if straggler else 0.0,
        "steps": len(clock.step_ends),
        "fit_start_wall": fit_start,
        "fit_end_wall": fit_end,
        "warm_wall": clock.warm_wall,
        # Wall-clock (time.time) ends of this worker's steps, comparable
        # between processes of this machine.
        "step_ends_wall": clock.step_ends,
        # This process's CPU time (all its threads) at the same step ends.
        "step_ends_cpu": clock.step_ends_cpu,
        "window": clock.window,
        "counts_after_fit": _listed(strategy.extended.sync_training.counts()),
        "test_accuracy": float(np.mean(np.argmax(logits, axis=1) == y_test)),
    }
    path = out_dir / f"worker_{worker}.json"
    path.write_text(json.dumps(report))
    return 0


def _build_model(strategy, seed: int):
    """The digits MLP of `tests/cluster_jobs/digits_job.py`."""
    import keras

    with strategy.scope():
        keras.utils.set_random_seed(seed)
        model = keras.Sequential(
            [
                keras.Input((64,)),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.Adam(0.003),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    return model


def _digits(batch: int, seed: int):
    """Endless shuffled batches of digits' first 1,500 images, and the rest."""
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x, y = (x / 16.0).astype(np.float32), y.astype(np.int32)
    train = (
        tf.data.Dataset.from_tensor_slices((x[:TRAIN_EXAMPLES], y[:TRAIN_EXAMPLES]))
        .shuffle(TRAIN_EXAMPLES, seed=seed)
        .repeat()
        .batch(batch, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    return train, (x[TRAIN_EXAMPLES:], y[TRAIN_EXAMPLES:])


def _listed(counts: dict) -> dict:
    import numpy as np

    return {k: np.asarray(v).tolist() for k, v in counts.items()}


def _make_window_clock():
    import keras

    class WindowClock(keras.callbacks.Callback):
        """Step-end times; on the chief, the measured window (`sync_replicas.py`).

        Every worker touches `warm_<i>` after `warmup_steps` steps and stops
        at the first step end after `done` exists. The chief opens the window
        at the first step end where every `warm_<i>` exists, closes it
        `seconds` later, then touches `done` and stops.
        """

        def __init__(
            self, training, out_dir, worker, is_chief, warmup_steps, seconds, workers
        ):
            super().__init__()
            self.training = training
            self.out_dir = out_dir
            self.worker = worker
            self.is_chief = is_chief
            self.warmup_steps = warmup_steps
            self.seconds = seconds
            self.workers = workers
            self.step_ends: list[float] = []
            self.step_ends_cpu: list[float] = []
            self.warm_wall = None
            self.window = None
            self._done = out_dir / "done"
            self._start = None

        def on_train_begin(self, logs=None):
            self._start = time.time()

        def on_train_batch_end(self, batch, logs=None):
            now = time.time()
            self.step_ends.append(now)
            self.step_ends_cpu.append(time.process_time())
            if len(self.step_ends) == self.warmup_steps:
                self.warm_wall = now
                (self.out_dir / f"warm_{self.worker}").touch()
            if self.is_chief:
                self._chief(now)
            elif self._done.exists():
                self.model.stop_training = True

        def _chief(self, now):
            if self.window is None:
                if all(
                    (self.out_dir / f"warm_{w}").exists() for w in range(self.workers)
                ):
                    self.window = {
                        "start": self._read(),
                        "chief_step_start": len(self.step_ends),
                    }
                elif now - self._start > WARMUP_TIMEOUT_S:
                    raise TimeoutError(
                        f"Not every worker finished {self.warmup_steps} steps "
                        f"within {WARMUP_TIMEOUT_S:g} s: warm files "
                        f"{sorted(p.name for p in self.out_dir.glob('warm_*'))}."
                    )
            elif now - self.window["start"]["wall"] >= self.seconds:
                self.window["end"] = self._read()
                self.window["chief_step_end"] = len(self.step_ends)
                self._done.touch()
                self.model.stop_training = True

        def _read(self):
            counts = _listed(self.training.counts())
            # The time after the read: the global step cannot move between
            # the release of this step and the chief's next push (R=3), and
            # rarely does with R=2.
            return {"wall": time.time(), **counts}

    return WindowClock


def _make_straggler():
    import keras

    class Straggler(keras.callbacks.Callback):
        """Makes this worker slow: it sleeps after every step (not the last)."""

        def __init__(self, seconds):
            super().__init__()
            self.seconds = seconds

        def on_train_batch_end(self, batch, logs=None):
            if not self.model.stop_training:
                time.sleep(self.seconds)

    return Straggler


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--num-workers", type=int, required=True)
    parser.add_argument(
        "--straggler", type=int, required=True, help="its worker index (0: chief)"
    )
    parser.add_argument("--replicas-to-aggregate", type=int, required=True)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(run(parse_args()))
