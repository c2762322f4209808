"""In async (between-graph) runs, only the chief writes checkpoints.

Every worker of a between-graph run executes the same script, so each has the
same `ModelCheckpoint` and `BackupAndRestore` callbacks writing the same
files, of the same shared variables. TensorFlow's strategies tell Keras who
should write through `strategy.extended.should_checkpoint`, but Keras 3's
callbacks do not ask. `install()` makes them ask, for models trained under a
`PSStrategy` only (every other model is untouched):

| callback           | on the chief | on the other workers                        |
|--------------------|--------------|---------------------------------------------|
| `ModelCheckpoint`  | saves        | does not save                               |
| `BackupAndRestore` | saves,       | does not save or delete the backup; on      |
|                    | restores,    | start, resumes the chief's epoch but leaves |
|                    | deletes      | the weights alone (they are shared: the     |
|                    |              | chief restores them)                        |

Code that saves by hand should do the same:
`if strategy.extended.should_checkpoint: model.save(path)`.
"""

from __future__ import annotations

import functools

import keras

_installed = False


def install() -> None:
    """Makes Keras's checkpoint callbacks write on the chief only (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    checkpoint = keras.callbacks.ModelCheckpoint
    backup = keras.callbacks.BackupAndRestore
    checkpoint._save_model = _on_chief_only(checkpoint._save_model)
    backup._save_model = _on_chief_only(backup._save_model)
    backup.on_train_end = _on_chief_only(backup.on_train_end)
    backup._load_model = _weights_from_chief_only(backup._load_model)


def is_writer(model) -> bool:
    """False only for a non-chief worker of an async PSStrategy run."""
    from keras_psdist.extended import PSExtended

    strategy = getattr(model, "distribute_strategy", None)
    extended = getattr(strategy, "extended", None)
    return not isinstance(extended, PSExtended) or extended.should_checkpoint


def _on_chief_only(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if is_writer(self.model):
            return method(self, *args, **kwargs)
        return None

    return wrapper


def _weights_from_chief_only(load_model):
    @functools.wraps(load_model)
    def wrapper(self):
        if is_writer(self.model):
            return load_model(self)
        # Resume at the chief's epoch; the shared weights are the chief's to
        # restore.
        path = self._weights_path
        self._weights_path = path + ".not-on-this-worker"
        try:
            return load_model(self)
        finally:
            self._weights_path = path

    return wrapper
