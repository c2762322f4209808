"""The exceptions keras_psdist raises besides `ValueError` (bad arguments,
raised when a strategy is built) and `ConnectionError` (a task that does not
answer within `connect_timeout`), in one place: catch them from here.

| exception | raised when |
|---|---|
| `TaskLostError` | a ps task (in-graph: or a worker task) is gone |
| `WorkerLostError` | `SyncReplicaStrategy`: a worker died and the others cannot make an update without it |
| `StalledError` | `SyncReplicaStrategy`: no update released this worker within `step_timeout`, or the chief is lost |
| `PortInUseError` | a task's port is held by another process |

No TensorFlow import here: the command line uses `PortInUseError` before
TensorFlow loads.
"""

from __future__ import annotations


class PortInUseError(OSError):
    """A task's port is already bound by another process."""

    def __init__(self, message: str, port: int):
        super().__init__(message)
        self.port = port

    def __str__(self) -> str:
        return self.args[0]


class TaskLostError(RuntimeError):
    """A server task of the cluster (a ps, or an in-graph worker) is gone.

    Attributes:
        tasks: Task name (e.g. `"ps:0"`) -> `"address (why)"`.
    """

    def __init__(self, tasks: dict[str, str], process: str):
        self.tasks = dict(tasks)
        names = ", ".join(f"{name} at {where}" for name, where in self.tasks.items())
        lost_ps = any(name.startswith("ps:") for name in self.tasks)
        super().__init__(
            f"{process}: lost {names}: its process died or its host is unreachable. "
            + (
                "The variables a ps task held died with it (TensorFlow has no ps "
                "failover), so this run cannot go on. "
                if lost_ps
                else "The replicas placed on it cannot run, so this run cannot go on. "
            )
            + "Stop every task, restart the whole cluster (`keras-psdist launch` "
            "starts and stops it as one command), and resume from the last "
            "checkpoint: with keras.callbacks.BackupAndRestore in `fit`, "
            "training resumes from the last saved epoch, with its weights and "
            "optimizer state."
        )


class WorkerLostError(RuntimeError):
    """A worker died and the others cannot make an update without it."""


class StalledError(TimeoutError):
    """No update released this worker within `step_timeout` seconds."""
