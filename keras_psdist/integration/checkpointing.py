"""In async (between-graph) runs, only the chief writes checkpoints.

Every worker of a between-graph run executes the same script, so each has the
same `ModelCheckpoint` and `BackupAndRestore` callbacks writing the same
files, of the same shared variables. TensorFlow's strategies tell Keras who
should write through `strategy.extended.should_checkpoint`, but Keras 3's
callbacks do not ask. The wrappers here make them ask (installed by
`keras_psdist.integration.keras_patches`), for models trained under a
`PSStrategy` only (every other model is untouched):

| callback           | on the chief | on the other workers                        |
|--------------------|--------------|---------------------------------------------|
| `ModelCheckpoint`  | saves        | does not save                               |
| `BackupAndRestore` | saves,       | does not save or delete the backup; on      |
|                    | restores,    | start, resumes the chief's epoch but leaves |
|                    | deletes      | the weights alone (they are shared: the     |
|                    |              | chief restores them)                        |

`BackupAndRestore` also keeps the strategy's training state beyond the
model's variables (`strategy.extended.training_state`: the aggregator's
state, such as centered clipping's centre and the replicas' momenta) in
`<backup_dir>/keras_psdist_training_state/`, written by the chief after the
weights and restored with them, so a resumed run continues the same rule.

Code that saves by hand should do the same:
`if strategy.extended.should_checkpoint: model.save(path)`.

Separately, in every mode, `atomic` makes `model.save` and
`model.save_weights` (and so `ModelCheckpoint` and `BackupAndRestore`) of a
keras_psdist model write a temporary file beside the target, flush it to
disk, and rename it over the target: a process killed during the write
leaves the previous file whole, never a truncated one. (Local paths; a
remote path such as `gs://` or a sharded save is written as Keras does.)
"""

from __future__ import annotations

import functools
import os
import uuid

import tensorflow as tf


def is_writer(model) -> bool:
    """False only for a non-chief worker of an async PSStrategy run."""
    from keras_psdist.distribute.extended import PSExtended

    strategy = getattr(model, "distribute_strategy", None)
    extended = getattr(strategy, "extended", None)
    return not isinstance(extended, PSExtended) or extended.should_checkpoint


def on_chief_only(method):
    """Wraps a checkpoint callback's method to run on the chief only."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if is_writer(self.model):
            return method(self, *args, **kwargs)
        return None

    return wrapper


_STATE_DIRECTORY = "keras_psdist_training_state"


def backup_with_training_state(save_model):
    """Wraps `BackupAndRestore._save_model`: on the chief only, and with the
    strategy's training state beside the weights."""

    @functools.wraps(save_model)
    def wrapper(self, *args, **kwargs):
        if not is_writer(self.model):
            return None
        result = save_model(self, *args, **kwargs)
        state = _training_state(self.model)
        if state is not None and state.variables:
            directory = os.path.join(self.backup_dir, _STATE_DIRECTORY)
            manager = tf.train.CheckpointManager(
                tf.train.Checkpoint(state=state), directory, max_to_keep=2
            )
            # A new file each time (a fresh manager would number every save
            # 1 and overwrite the last good one in place); the pointer to
            # the latest is replaced atomically once the files are whole.
            latest = manager.latest_checkpoint
            number = 1 if latest is None else int(latest.rsplit("-", 1)[1]) + 1
            manager.save(checkpoint_number=number)
        return result

    return wrapper


def _training_state(model):
    from keras_psdist.distribute.extended import PSExtended

    extended = getattr(getattr(model, "distribute_strategy", None), "extended", None)
    return extended.training_state if isinstance(extended, PSExtended) else None


def weights_from_chief_only(load_model):
    """Wraps `BackupAndRestore._load_model`: the chief restores the weights
    and the strategy's training state; other workers resume at the chief's
    epoch without loading weights."""

    @functools.wraps(load_model)
    def wrapper(self):
        if is_writer(self.model):
            result = load_model(self)
            state = _training_state(self.model)
            if state is not None:
                saved = tf.train.latest_checkpoint(
                    os.path.join(self.backup_dir, _STATE_DIRECTORY)
                )
                if saved is not None:
                    # Variables not made yet are restored when they are.
                    tf.train.Checkpoint(state=state).read(saved).expect_partial()
            return result
        # Resume at the chief's epoch; the shared weights are the chief's to
        # restore.
        path = self._weights_path
        self._weights_path = path + ".not-on-this-worker"
        try:
            return load_model(self)
        finally:
            self._weights_path = path

    return wrapper


def _uses_keras_psdist(model) -> bool:
    from keras_psdist.distribute.extended import PSExtended

    strategy = getattr(model, "distribute_strategy", None)
    return isinstance(getattr(strategy, "extended", None), PSExtended)


def atomic(save):
    """Wraps `Model.save` / `save_weights` to write beside and rename."""

    @functools.wraps(save)
    def wrapper(self, filepath, *args, **kwargs):
        path = os.fspath(filepath) if isinstance(filepath, (str, os.PathLike)) else None
        overwrite = kwargs.get("overwrite", args[0] if args else True)
        if (
            path is None
            or "://" in path
            or kwargs.get("max_shard_size") is not None
            or (not overwrite and os.path.exists(path))  # Keras asks first
            or not _uses_keras_psdist(self)
        ):
            return save(self, filepath, *args, **kwargs)
        directory, name = os.path.split(path)
        # The name keeps its suffix, which Keras checks (".weights.h5", ".keras").
        temporary = os.path.join(directory, f".tmp-{uuid.uuid4().hex[:12]}-{name}")
        try:
            result = save(self, temporary, *args, **kwargs)
            with open(temporary, "rb") as f:
                os.fsync(f.fileno())
            os.replace(temporary, path)
        finally:
            if os.path.exists(temporary):
                os.remove(temporary)
        return result

    return wrapper
