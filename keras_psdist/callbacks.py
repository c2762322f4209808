"""Keras callbacks that show what the strategy's aggregator did.

Their figures are per replica or per worker, many numbers an epoch. They go
to the `History` that `fit` returns, to the callback's own attribute and,
with `log_dir`, to TensorBoard, but not into the epoch `logs`: Keras's
progress bar prints every key of those, and would print them all on one
line. The progress bar gets one short summary line per epoch instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from keras_psdist.integration.training_hooks import sync_training_of
from keras_psdist.sync import protocol


class _ReportCallback(keras.callbacks.Callback):
    """Records figures in `fit`'s `History` and says one line per epoch.

    The line waits for the next epoch's start (or the end of training), so
    that it comes after the progress bar's line for its epoch, not inside it.
    """

    def __init__(self):
        super().__init__()
        self._summary: str | None = None

    def _record(self, figures: dict[str, float]) -> None:
        """Appends `figures` to the `History` of the running `fit`."""
        history = getattr(self.model, "history", None)
        if isinstance(history, keras.callbacks.History):
            for key, value in figures.items():
                history.history.setdefault(key, []).append(value)

    def _say_later(self, summary: str) -> None:
        if (self.params or {}).get("verbose", 1):
            self._summary = summary

    def _say_pending(self) -> None:
        summary, self._summary = self._summary, None
        if summary is None:
            return
        if keras.config.is_interactive_logging_enabled():
            print(summary, flush=True)
        else:
            logging.info(summary)

    def on_epoch_begin(self, epoch, logs=None):
        self._say_pending()

    def on_train_end(self, logs=None):
        self._say_pending()


# What each report of the rules measures per replica, in the words of the
# per-epoch line (`History` keeps the reports' names).
_REPORT_WORDS = {
    "extreme_fraction": "share of its gradient's values set aside as extreme "
    "(among the num_byzantine highest or lowest at their coordinate)",
    "selected": "share of steps in which the rule picked its gradient",
    "weight": "its share of the weight in the geometric median",
    "clipped": "share of steps in which its gradient was clipped",
}


def describe_report(name: str) -> str:
    """What the aggregator report `name` measures per replica, in plain words.

    Args:
        name: A name of `strategy.extended.report()`, e.g. `"selected"`.

    Returns:
        The words `AggregationReport` prints for it; the name itself for a
        report it does not know (a rule of your own).

    Examples:

    >>> describe_report("selected")
    'share of steps in which the rule picked its gradient'
    >>> describe_report("my_score")
    'my_score'
    """
    return _REPORT_WORDS.get(name, name)


class AggregationReport(_ReportCallback):
    """Logs the aggregator's per-replica report, so a suspicious replica shows.

    After every training batch it reads `strategy.extended.report()` (e.g.
    Krum's `selected`, the trimmed mean's `extreme_fraction`: one number per
    replica). At the end of each epoch it records the epoch's average in
    `history` and in the `History` that `fit` returns, as
    `"{name}/replica_{r}"`, and prints one line after the progress bar (not
    with `verbose=0`) saying in words what the figure is (`describe_report`)
    and naming the lowest and highest replica, e.g.

        Krum, this epoch, per replica: share of steps in which the rule picked its gradient: lowest 0% (replica 7), highest 43% (replica 2)

    With `log_dir`, it also writes every `update_freq`-th batch's values
    (`aggregation/{name}/replica_{r}`) and each epoch's average
    (`epoch_aggregation/{name}/replica_{r}`) as TensorBoard scalars.

    The model must have been built under a `keras_psdist.PSStrategy` scope.

    Args:
        log_dir: Directory for the TensorBoard scalars, or `None`. Defaults
            to `None`.
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
    >>> fit = model.fit(np.ones((8, 4)), np.ones((8, 1)), verbose=0, callbacks=[report])
    >>> sorted(report.history)
    ['extreme_fraction']
    >>> "extreme_fraction/replica_0" in fit.history
    True
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
        super().on_epoch_begin(epoch, logs)
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
        means = {name: total / self._batches for name, total in self._sums.items()}
        for name, mean in means.items():
            self.history.setdefault(name, []).append(mean)
        self._record(
            {
                f"{name}/replica_{r}": float(value)
                for name, mean in means.items()
                for r, value in enumerate(mean)
            }
        )
        if self._writer is not None:
            with self._writer.as_default(step=epoch):
                for name, mean in means.items():
                    for r, value in enumerate(mean):
                        tf.summary.scalar(
                            f"epoch_aggregation/{name}/replica_{r}", value
                        )
        if means:
            rule = type(self._extended().aggregator).__name__
            self._say_later(
                f"{rule}, this epoch, per replica: "
                + "; ".join(_extremes(name, mean) for name, mean in means.items())
            )

    def on_train_end(self, logs=None):
        super().on_train_end(logs)
        if self._writer is not None:
            self._writer.flush()


def _extremes(name: str, values: np.ndarray) -> str:
    """`"share of steps in which ...: lowest 0% (replicas 5, 7), highest 43%
    (replica 2)"`."""
    words = describe_report(name)
    finite = values[np.isfinite(values)]
    if finite.size < values.size:
        return f"{words}: not finite for {_replicas_at(values, np.nan)}"
    low, high = float(np.min(values)), float(np.max(values))
    if f"{low:.0%}" == f"{high:.0%}":
        return f"{words}: {low:.0%} for every replica"
    return (
        f"{words}: lowest {low:.0%} ({_replicas_at(values, low)}), "
        f"highest {high:.0%} ({_replicas_at(values, high)})"
    )


def _replicas_at(values: np.ndarray, value: float, most: int = 4) -> str:
    """The replicas whose value shows as `value` (a whole percentage; NaN:
    not finite), `most` of them at most."""
    if np.isnan(value):
        ids = [int(r) for r in np.flatnonzero(~np.isfinite(values))]
    else:
        ids = [int(r) for r in np.flatnonzero(np.abs(values - value) < 0.005)]
    shown = ", ".join(map(str, ids[:most]))
    more = f" and {len(ids) - most} more" if len(ids) > most else ""
    return f"replica{'s' if len(ids) > 1 else ''} {shown}{more}"


class SyncReplicaReport(_ReportCallback):
    """Logs, per worker, how many gradients the chief applied and dropped.

    For models built under a `keras_psdist.SyncReplicaStrategy`. At the end
    of each epoch it reads the counts the chief publishes on the ps, keeps
    them in `counts`, and records them in the `History` that `fit` returns:

    - `sync/global_step`: updates applied so far;
    - `sync/applied/worker_{i}`: the gradients of task `worker:i` in an
      update (`chief_0` for `chief:0`, in a cluster with a chief job);
    - `sync/dropped_stale/worker_{i}`: its gradients that arrived after the
      update of their step (a backup worker's late gradients);
    - `sync/dropped_at_end/worker_{i}`: gradients sent after the last
      update, when the chief's fit had ended (a straggler's last step, see
      `keras_psdist.sync.training`) or too few workers were left to make
      another (the chief training on after faster workers finished), not
      applied.

    It prints one line after the progress bar (not with `verbose=0`), saying
    what a drop is the first time it shows in a `fit`, e.g.

        sync: 77 updates; gradients applied 154, dropped as stale 19 (most from worker:2: 17; arrived after the update of their step: a backup worker's late gradients, not applied), dropped at the end 0

    With `log_dir`, it also writes the counts as TensorBoard scalars.

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
        self._explained: set[int] = set()  # Drops whose words were said.

    def _training(self):
        strategy = getattr(self.model, "distribute_strategy", None)
        training = sync_training_of(strategy)
        if training is None:
            raise ValueError(
                "SyncReplicaReport needs a model built under a "
                "keras_psdist.SyncReplicaStrategy scope. Received a model whose "
                f"strategy is {type(strategy).__name__}."
            )
        return training

    def on_train_begin(self, logs=None):
        self._training()
        self._explained = set()
        if self.log_dir is not None and self._writer is None:
            self._writer = _summary_writer(self, self.log_dir)

    def on_epoch_end(self, epoch, logs=None):
        training = self._training()
        self.counts = training.counts()
        task = training.sync.config.name  # worker index -> "worker:1"
        flat = {"sync/global_step": float(self.counts["global_step"])}
        for name in ("applied", "dropped_stale", "dropped_at_end"):
            for worker, value in enumerate(self.counts[name]):
                key = task(worker).replace(":", "_")
                flat[f"sync/{name}/{key}"] = float(value)
        self._record(flat)
        if self._writer is not None:
            with self._writer.as_default(step=epoch):
                for name, value in flat.items():
                    tf.summary.scalar(name, value)
            self._writer.flush()
        totals = []
        for row, name in (
            (protocol.APPLIED, "applied"),
            (protocol.DROPPED_STALE, "dropped_stale"),
            (protocol.DROPPED_AT_END, "dropped_at_end"),
        ):
            what, meaning = protocol.COUNT_NAMES[row]
            # What a drop is: said the first time it shows in a fit.
            if row in self._explained or not np.any(self.counts[name]):
                meaning = ""
            elif meaning:
                self._explained.add(row)
            totals.append(_total(what, meaning, self.counts[name], task))
        self._say_later(
            f"sync: {int(self.counts['global_step'])} updates; gradients "
            + ", ".join(totals)
        )


def _total(what: str, meaning: str, per_worker, task: Callable[[int], str]) -> str:
    """`"dropped as stale 19 (most from worker:2: 17; arrived after ...)"`:
    for drops but 0, the worker with the most and, if given, what they are."""
    per_worker = np.asarray(per_worker)
    total = f"{what} {int(per_worker.sum())}"
    if what == protocol.COUNT_NAMES[protocol.APPLIED][0] or not per_worker.any():
        return total
    worker = int(np.argmax(per_worker))
    most = f"most from {task(worker)}: {int(per_worker[worker])}"
    return f"{total} ({most}; {meaning})" if meaning else f"{total} ({most})"


class MembershipReport(_ReportCallback):
    """Records, on the chief of an elastic run, the workers at each change.

    For models built under `PSStrategy(mode="between-graph", max_workers=M)`
    or `SyncReplicaStrategy(max_workers=M)` (`keras_psdist.cluster.elastic`).
    After each batch it looks at the changes the chief's watcher saw; at the
    end of each epoch it records in the `History` that `fit` returns:

    - `membership/num_workers`: the workers training at the epoch's end;
    - `membership/changes`: the changes seen during the epoch;
    - sync replicas: `membership/replicas_to_aggregate`, `/backups` and
      `/num_byzantine`, the counts updates are made with at the epoch's end.

    With `log_dir`, it writes `membership/num_workers` as a TensorBoard
    scalar at the optimizer step of every change it sees (and at the first
    step), so the plot shows each join and leave where it happened, and under
    sync replicas the counts at the step of each of their changes. On the
    other workers it records nothing.

    Args:
        log_dir: Directory for TensorBoard scalars, or `None`. Defaults to
            `None`.

    Attributes:
        events: `(optimizer step, number of workers)` at each change seen.
        count_events: Sync replicas: `(optimizer step, resizing.Counts)` at
            each change of the counts seen.
    """

    def __init__(self, log_dir: str | None = None):
        super().__init__()
        self.log_dir = log_dir
        self.events: list[tuple[int, int]] = []
        self.count_events: list[tuple[int, Any]] = []
        self._writer = None
        self._seen = 0
        self._counts_seen = 0
        self._epoch_changes = 0

    def _watcher(self):
        strategy = getattr(self.model, "distribute_strategy", None)
        extended = getattr(strategy, "extended", None)
        if getattr(extended, "registry", None) is None:
            raise ValueError(
                "MembershipReport needs a model built under "
                "PSStrategy(mode='between-graph', max_workers=M) or "
                "SyncReplicaStrategy(max_workers=M) (elastic membership). "
                "Received a model whose strategy is "
                f"{type(strategy).__name__} without max_workers."
            )
        return extended.services.membership  # None on workers other than the chief

    def on_train_begin(self, logs=None):
        if self._watcher() is not None and self.log_dir and self._writer is None:
            self._writer = _summary_writer(self, self.log_dir)

    def on_train_batch_end(self, batch, logs=None):
        watcher = self._watcher()
        if watcher is None:
            return
        # One scalar read of the ps a step, on the chief only: the thread's
        # looks (twice a second) can miss a membership that lasts less.
        watcher.look()
        changes = watcher.changes
        count_changes = self._count_changes()
        if len(changes) == self._seen and len(count_changes) == self._counts_seen:
            return
        step = int(self.model.optimizer.iterations.numpy())
        for _, _, members in changes[self._seen :]:
            self.events.append((step, len(members)))
            self._epoch_changes += 1
            self._scalars(step, {"membership/num_workers": len(members)})
        for _, counts in count_changes[self._counts_seen :]:
            self.count_events.append((step, counts))
            self._scalars(step, _counts_scalars(counts))
        self._seen = len(changes)
        self._counts_seen = len(count_changes)
        if self._writer is not None:
            self._writer.flush()

    def _count_changes(self) -> list:
        """Sync replicas: the chief's `(global step, counts)` changes."""
        extended = self.model.distribute_strategy.extended
        return list(getattr(extended.services.training, "count_changes", ()))

    def _scalars(self, step: int, scalars: dict[str, float]) -> None:
        if self._writer is None:
            return
        with self._writer.as_default(step=step):
            for name, value in scalars.items():
                tf.summary.scalar(name, value)

    def on_epoch_end(self, epoch, logs=None):
        watcher = self._watcher()
        if watcher is None:
            return
        members = watcher.look()
        record = {
            "membership/num_workers": float(len(members)),
            "membership/changes": float(self._epoch_changes),
        }
        count_changes = self._count_changes()
        if count_changes:
            record.update(_counts_scalars(count_changes[-1][1]))
        self._record(record)
        self._epoch_changes = 0


def _counts_scalars(counts) -> dict[str, float]:
    """A sync run's `resizing.Counts` as the report's scalars."""
    return {
        "membership/replicas_to_aggregate": float(counts.replicas_to_aggregate),
        "membership/backups": float(counts.backups),
        "membership/num_byzantine": float(counts.num_byzantine or 0),
    }


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
