"""A side-car evaluator: a process that evaluates the chief's checkpoints.

TensorFlow's parameter-server training evaluates beside the job: an
`evaluator` task follows the checkpoints the chief writes and evaluates each
on the validation data, so that evaluation never holds up a training step
(tf_keras's `SidecarEvaluator`; Keras 3 has none). This is that task for
keras_psdist jobs, with Keras 3's checkpoints: the files Keras's own
`ModelCheckpoint` writes (`.weights.h5`, which hold the optimizer's
`iterations` too, or `.keras`).

In a script run on every task (`keras-psdist launch --evaluator` starts one
more process with TF_CONFIG task `evaluator:0`), the evaluator branches off
before any strategy is built:

    import keras_psdist as kpd

    if kpd.cluster.is_evaluator():
        model = build_model()                      # compiled with its metrics
        kpd.SidecarEvaluator(model, (x_val, y_val), checkpoint_dir="ckpt",
                             log_dir="logs").start()
        raise SystemExit
    strategy = kpd.PSStrategy(mode="between-graph")
    ...
    model.fit(..., callbacks=[keras.callbacks.ModelCheckpoint(
        "ckpt/epoch{epoch:02d}.weights.h5", save_weights_only=True)])

Each checkpoint is evaluated once, in the order written; its results are
logged, returned and written to TensorBoard (`evaluation_<metric>_vs_iterations`
at the checkpoint's optimizer step, tf_keras's names). The evaluator stops
after `max_evaluations`, when `idle_timeout_s` pass without a new checkpoint,
or when the launcher says training has ended (it then evaluates what is left
first); else it runs until it is stopped.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import time
from typing import Any

from absl import logging

from keras_psdist.cluster.config import EVALUATOR_STOP_FILE_ENV

# A checkpoint that cannot be read is retried this many polls (it may still be
# being written by a saver that does not write atomically) before it fails.
_READ_ATTEMPTS = 5


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One checkpoint's evaluation."""

    checkpoint: str
    step: int  # the checkpoint's optimizer iterations (-1 if it holds none)
    results: dict[str, float]


class SidecarEvaluator:
    """Evaluates each new checkpoint of `checkpoint_dir` on `data`.

    Args:
        model: A compiled Keras model of the trained architecture (the loss
            and metrics to report), built outside any strategy.
        data: The validation data: a `tf.data.Dataset` of `(x, y)` batches,
            or an `(x, y)` tuple of arrays (evaluated in batches of
            `batch_size`).
        checkpoint_dir: The directory the chief's `ModelCheckpoint` writes to.
        pattern: Which files of it are checkpoints (a glob). Defaults to
            `"*.weights.h5"`; `"*.keras"` for whole-model saves.
        log_dir: Where to write TensorBoard summaries, or `None` for none.
        steps: Batches of `data` per evaluation, `None` for all of it.
        batch_size: The batch size for array data. Defaults to 32.
        max_evaluations: Stop after this many, or `None`.
        idle_timeout_s: Stop when no new checkpoint came for this long, or
            `None` (wait on).
        poll_s: How often to look for new checkpoints, in seconds.
        min_interval_s: At least this long between the starts of two
            evaluations; when several checkpoints are new by then, only the
            newest is evaluated (the others are skipped, logged and listed
            in `skipped`), as tf_keras's `SidecarEvaluator` follows the
            latest checkpoint. Bounds the evaluator's CPU time where it
            shares a machine with training. Defaults to 0: every checkpoint.
        stop_file: Stop once this file exists, after evaluating every
            checkpoint written before it. Defaults to the one `keras-psdist
            launch --evaluator` names (`KERAS_PSDIST_EVALUATOR_STOP_FILE`).

    Raises:
        ValueError: If an argument is invalid; the message names it and the
            fix.

    Examples:

    >>> import keras, numpy as np, tempfile
    >>> def build():
    ...     model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    ...     model.compile("sgd", "mse", metrics=["mae"])
    ...     return model
    >>> trained, directory = build(), tempfile.mkdtemp()
    >>> x, y = np.ones((8, 4), "float32"), np.zeros((8, 2), "float32")
    >>> _ = trained.fit(x, y, epochs=2, verbose=0, callbacks=[
    ...     keras.callbacks.ModelCheckpoint(
    ...         directory + "/epoch{epoch}.weights.h5", save_weights_only=True)])
    >>> evaluations = SidecarEvaluator(
    ...     build(), (x, y), directory, max_evaluations=2, stop_file=None
    ... ).start()
    >>> [(e.checkpoint.rsplit("/", 1)[1], e.step) for e in evaluations]
    [('epoch1.weights.h5', 1), ('epoch2.weights.h5', 2)]
    >>> sorted(evaluations[0].results)
    ['loss', 'mae']
    """

    def __init__(
        self,
        model,
        data,
        checkpoint_dir: str | os.PathLike,
        *,
        pattern: str = "*.weights.h5",
        log_dir: str | os.PathLike | None = None,
        steps: int | None = None,
        batch_size: int = 32,
        max_evaluations: int | None = None,
        idle_timeout_s: float | None = None,
        poll_s: float = 2.0,
        min_interval_s: float = 0.0,
        stop_file: str | os.PathLike | None = "",
    ):
        _check_model(model)
        if isinstance(checkpoint_dir, bytes) or not isinstance(
            checkpoint_dir, str | os.PathLike
        ):
            raise ValueError(
                "`checkpoint_dir` must be the directory the chief's "
                "ModelCheckpoint writes to (a path). Received: "
                f"{checkpoint_dir!r}"
            )
        for name, value in (
            ("steps", steps),
            ("batch_size", batch_size),
            ("max_evaluations", max_evaluations),
        ):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(
                    f"`{name}` must be an integer >= 1"
                    + ("" if name == "batch_size" else " or None")
                    + f". Received: {name}={value!r}"
                )
        for name, value in (
            ("idle_timeout_s", idle_timeout_s),
            ("poll_s", poll_s),
            ("min_interval_s", min_interval_s),
        ):
            at_least = ">= 0" if name == "min_interval_s" else "> 0"
            if (value is not None or name != "idle_timeout_s") and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (value >= 0 if name == "min_interval_s" else value > 0)
            ):
                raise ValueError(
                    f"`{name}` must be a number of seconds {at_least}"
                    + (" or None" if name == "idle_timeout_s" else "")
                    + f". Received: {name}={value!r}"
                )
        self.model = model
        self._data = _as_dataset(data, batch_size)
        self._dir = os.fspath(checkpoint_dir)
        self._pattern = pattern
        self._log_dir = None if log_dir is None else os.fspath(log_dir)
        self._steps = steps
        self._max_evaluations = max_evaluations
        self._idle_timeout_s = idle_timeout_s
        self._poll_s = float(poll_s)
        self._min_interval_s = float(min_interval_s)
        if stop_file == "":
            stop_file = os.environ.get(EVALUATOR_STOP_FILE_ENV) or None
        self._stop_file = None if stop_file is None else os.fspath(stop_file)
        self._done: set[tuple[str, int]] = set()  # (path, mtime_ns) evaluated
        self._failed_reads: dict[tuple[str, int], int] = {}
        self._writer = None
        self.evaluations: list[Evaluation] = []
        self.skipped: list[str] = []  # superseded within `min_interval_s`

    def start(self) -> list[Evaluation]:
        """Evaluates checkpoints until a stop condition; returns every
        evaluation made (also in `self.evaluations`)."""
        last_new = time.monotonic()
        last_evaluation = -float("inf")
        while True:
            stopping = self._stop_file is not None and os.path.exists(self._stop_file)
            # (Checked before the scan: every checkpoint written before the
            # stop file is then seen by this scan.)
            new = self._new_checkpoints()
            if new and self._min_interval_s:
                if not stopping and (
                    time.monotonic() - last_evaluation < self._min_interval_s
                ):
                    new = []  # Not yet: by then a newer one may be there.
                else:
                    self._skip(new[:-1])  # Only the newest is evaluated.
                    new = new[-1:]
            for path, stamp in new:
                started = time.monotonic()
                if not self._evaluate(path, stamp):
                    continue
                last_new = last_evaluation = started
                if self._done_enough():
                    return self.evaluations
            if stopping:
                logging.info(
                    "keras_psdist evaluator: training has ended; %d evaluations.",
                    len(self.evaluations),
                )
                return self.evaluations
            if (
                self._idle_timeout_s is not None
                and time.monotonic() - last_new > self._idle_timeout_s
            ):
                logging.info(
                    "keras_psdist evaluator: no new checkpoint in %s for %g s; "
                    "stopping after %d evaluations.",
                    self._dir,
                    self._idle_timeout_s,
                    len(self.evaluations),
                )
                return self.evaluations
            time.sleep(self._poll_s)

    # ------------------------------------------------------------ helpers

    def _skip(self, checkpoints: list[tuple[str, int]]) -> None:
        for path, stamp in checkpoints:
            self._done.add((path, stamp))
            self.skipped.append(path)
        if checkpoints:
            logging.info(
                "keras_psdist evaluator: %d checkpoint(s) superseded by a newer "
                "one within min_interval_s=%g: not evaluated (%s).",
                len(checkpoints),
                self._min_interval_s,
                ", ".join(os.path.basename(p) for p, _ in checkpoints),
            )

    def _done_enough(self) -> bool:
        return (
            self._max_evaluations is not None
            and len(self.evaluations) >= self._max_evaluations
        )

    def _new_checkpoints(self) -> list[tuple[str, int]]:
        """Checkpoints not evaluated yet (a file written again counts as new),
        oldest first."""
        found = []
        for path in glob.glob(os.path.join(glob.escape(self._dir), self._pattern)):
            try:
                stamp = os.stat(path).st_mtime_ns
            except FileNotFoundError:
                continue  # Replaced or removed meanwhile.
            if (path, stamp) not in self._done:
                found.append((path, stamp))
        return sorted(found, key=lambda item: (item[1], item[0]))

    def _evaluate(self, path: str, stamp: int) -> bool:
        """Loads and evaluates one checkpoint; False if it cannot be read
        yet (retried at the next poll)."""
        try:
            self._load(path)
        except (OSError, ValueError) as e:
            key = (path, stamp)
            self._failed_reads[key] = self._failed_reads.get(key, 0) + 1
            if self._failed_reads[key] >= _READ_ATTEMPTS:
                raise ValueError(
                    f"The evaluator cannot load checkpoint {path} into its model "
                    f"({type(e).__name__}: {e}). Build the evaluator's model as "
                    "the trained one (same layers, compiled with the same "
                    "optimizer), or narrow `pattern` to the chief's checkpoints."
                ) from e
            return False
        self._done.add((path, stamp))
        results = self._evaluate_loaded()
        step = self._step()
        evaluation = Evaluation(path, step, results)
        self.evaluations.append(evaluation)
        logging.info(
            "keras_psdist evaluator: %s (step %d): %s",
            os.path.basename(path),
            step,
            ", ".join(f"{k} {v:.4f}" for k, v in results.items()),
        )
        self._summarize(evaluation)
        return True

    def _load(self, path: str) -> None:
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and not optimizer.built:
            # Built, its variables (`iterations`) load from the checkpoint.
            optimizer.build(self.model.trainable_variables)
        self.model.load_weights(path)

    def _evaluate_loaded(self) -> dict[str, float]:
        results = self.model.evaluate(
            self._data, steps=self._steps, verbose=0, return_dict=True
        )
        return {name: float(value) for name, value in results.items()}

    def _step(self) -> int:
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is None:
            return -1
        return int(optimizer.iterations.numpy())

    def _summarize(self, evaluation: Evaluation) -> None:
        if self._log_dir is None:
            return
        import tensorflow as tf

        if self._writer is None:
            self._writer = tf.summary.create_file_writer(
                os.path.join(self._log_dir, "evaluation")
            )
        with self._writer.as_default():
            for name, value in evaluation.results.items():
                tf.summary.scalar(
                    f"evaluation_{name}_vs_iterations", value, step=evaluation.step
                )
        self._writer.flush()


def _check_model(model: Any) -> None:
    import keras

    if not isinstance(model, keras.Model):
        raise ValueError(
            "`model` must be a Keras model of the trained architecture. "
            f"Received: {type(model).__name__}."
        )
    if getattr(model, "compiled", False) is False:
        raise ValueError(
            "The evaluator's model is not compiled: compile it with the loss "
            "and metrics to report (and the training's optimizer, whose "
            "`iterations` each checkpoint holds), e.g. "
            "`model.compile(optimizer='adam', loss=..., metrics=['accuracy'])`."
        )


def _as_dataset(data, batch_size: int):
    """Arrays `(x, y)` as a dataset batched and cached once: Keras would
    build a new input pipeline from them at every `evaluate`. A dataset is
    left as it is."""
    if not (isinstance(data, tuple) and len(data) == 2):
        return data
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(data).batch(batch_size).cache()
