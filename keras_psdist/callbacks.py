"""Keras callbacks that show what the strategy's aggregator did."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf


class AggregationReport(keras.callbacks.Callback):
    """Logs the aggregator's per-replica report, so a suspicious replica shows.

    After every training batch it reads `strategy.extended.report()` (e.g.
    Krum's `selected`, the trimmed mean's `extreme_fraction`: one number per
    replica). At the end of each epoch it adds the epoch's average to the
    epoch logs as `"{name}/replica_{r}"`, so `History`, `CSVLogger` and a
    `TensorBoard` callback listed *after* this one record it. With `log_dir`,
    it also writes every `update_freq`-th batch's values as TensorBoard
    scalars itself.

    The model must have been built under a `keras_psdist.PSStrategy` scope.

    Args:
        log_dir: Directory for per-batch TensorBoard scalars, or `None`.
            Defaults to `None`.
        update_freq: Write per-batch scalars every this many batches.
            Defaults to 1.

    Attributes:
        history: `name -> list of per-epoch arrays of shape [n]`.

    Examples:

    >>> import keras, numpy as np, keras_psdist as kpd
    >>> strategy = kpd.PSStrategy(aggregator="median")
    >>> with strategy.scope():
    ...     model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    ...     model.compile(optimizer="sgd", loss="mse")
    >>> report = kpd.callbacks.AggregationReport()
    >>> _ = model.fit(np.ones((8, 4)), np.ones((8, 1)), verbose=0, callbacks=[report])
    >>> sorted(report.history)
    ['extreme_fraction']
    """

    def __init__(self, log_dir: str | None = None, update_freq: int = 1):
        super().__init__()
        if (
            isinstance(update_freq, bool)
            or not isinstance(update_freq, int)
            or update_freq < 1
        ):
            raise ValueError(
                f"`update_freq` must be an int >= 1. Received: update_freq={update_freq!r}"
            )
        self.log_dir = log_dir
        self.update_freq = update_freq
        self.history: dict[str, list[np.ndarray]] = {}
        self._sums: dict[str, np.ndarray] = {}
        self._batches = 0
        self._step = 0
        self._writer = None

    def _extended(self):
        strategy = getattr(self.model, "distribute_strategy", None)
        extended = getattr(strategy, "extended", None)
        if not hasattr(extended, "report"):
            raise ValueError(
                "AggregationReport needs a model built under a "
                "keras_psdist.PSStrategy scope. Received a model whose strategy "
                f"is {type(strategy).__name__}."
            )
        return extended

    def on_train_begin(self, logs=None):
        self._extended()
        if self.log_dir is not None and self._writer is None:
            self._writer = _summary_writer(self, self.log_dir)

    def on_epoch_begin(self, epoch, logs=None):
        self._sums, self._batches = {}, 0

    def on_train_batch_end(self, batch, logs=None):
        report = self._extended().report()
        for name, values in report.items():
            self._sums[name] = self._sums.get(name, 0.0) + values
        self._batches += 1
        self._step += 1
        if self._writer is not None and self._step % self.update_freq == 0:
            with self._writer.as_default(step=self._step):
                for name, values in report.items():
                    for r, value in enumerate(values):
                        tf.summary.scalar(f"aggregation/{name}/replica_{r}", value)

    def on_epoch_end(self, epoch, logs=None):
        if not self._batches:
            return
        for name, total in self._sums.items():
            mean = total / self._batches
            self.history.setdefault(name, []).append(mean)
            if logs is not None:
                for r, value in enumerate(mean):
                    logs[f"{name}/replica_{r}"] = float(value)

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.flush()


class SyncReplicaReport(keras.callbacks.Callback):
    """Logs, per worker, how many gradients the chief applied and dropped.

    For models built under a `keras_psdist.SyncReplicaStrategy`. At the end
    of each epoch it reads the counts the chief publishes on the ps and adds
    them to the epoch logs, so `History`, `CSVLogger` and a `TensorBoard`
    callback listed *after* this one record them:

    - `sync/global_step`: updates applied so far;
    - `sync/applied/worker_{i}`: worker i's gradients in an update;
    - `sync/dropped_stale/worker_{i}`: worker i's gradients that arrived
      after the update of their step (a backup worker's late gradients);
    - `sync/dropped_at_end/worker_{i}`: gradients sent when too few workers
      were left to make an update.

    With `log_dir`, it also writes them as TensorBoard scalars itself.

    Args:
        log_dir: Directory for TensorBoard scalars, or `None`. Defaults to
            `None`.

    Attributes:
        counts: The last counts read: `name -> value or array [workers]`.
    """

    def __init__(self, log_dir: str | None = None):
        super().__init__()
        self.log_dir = log_dir
        self.counts: dict = {}
        self._writer = None

    def _training(self):
        strategy = getattr(self.model, "distribute_strategy", None)
        training = getattr(getattr(strategy, "extended", None), "sync_training", None)
        if training is None:
            raise ValueError(
                "SyncReplicaReport needs a model built under a "
                "keras_psdist.SyncReplicaStrategy scope. Received a model whose "
                f"strategy is {type(strategy).__name__}."
            )
        return training

    def on_train_begin(self, logs=None):
        self._training()
        if self.log_dir is not None and self._writer is None:
            self._writer = _summary_writer(self, self.log_dir)

    def on_epoch_end(self, epoch, logs=None):
        self.counts = self._training().counts()
        flat = {"sync/global_step": float(self.counts["global_step"])}
        for name in ("applied", "dropped_stale", "dropped_at_end"):
            for worker, value in enumerate(self.counts[name]):
                flat[f"sync/{name}/worker_{worker}"] = float(value)
        if logs is not None:
            logs.update(flat)
        if self._writer is not None:
            with self._writer.as_default(step=epoch):
                for name, value in flat.items():
                    tf.summary.scalar(name, value)
            self._writer.flush()


def _summary_writer(callback: keras.callbacks.Callback, log_dir: str):
    """A TensorBoard writer for `callback`, or a clear error without tensorboard."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise ImportError(
            f"{type(callback).__name__}(log_dir=...) writes TensorBoard summaries, "
            "which needs the tensorboard package. Received: log_dir="
            f"{log_dir!r}. Install it with `pip install "
            '"keras-psdist[tensorboard]"`, or pass log_dir=None.'
        ) from None
    return tf.summary.create_file_writer(log_dir)
