"""The exceptions keras_psdist raises besides `ValueError` (bad arguments,
raised when a strategy is built) and `ConnectionError` (a task that does not
answer within `connect_timeout`), in one place: catch them from here.

| exception | raised when |
|---|---|
| `TaskLostError` | a ps task (in-graph: or a worker task) is gone: its port refuses connections |
| `TaskUnreachableError` | (a `TaskLostError`) such a task does not answer while other tasks do: its host is cut off or down |
| `DisconnectedError` | (a `TaskLostError`) no other task answers: this process's own network is down |
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

    Raised as is when the task's port refuses connections: its process died.
    When tasks do not answer at all (a host cut off or down, or this
    process's own network down), one of the two subclasses says which:
    `TaskUnreachableError`, `DisconnectedError`. Catch `TaskLostError` for
    all three.

    Attributes:
        tasks: Task name (e.g. `"ps:0"`) -> `"address (why)"`.
        process: This process's task, e.g. `"worker:1"`.
    """

    def __init__(self, tasks: dict[str, str], process: str):
        self.tasks = dict(tasks)
        self.process = process
        super().__init__(self._message())

    def _names(self) -> str:
        return ", ".join(f"{name} at {where}" for name, where in self.tasks.items())

    def _message(self) -> str:
        refused = all(
            where.endswith("(Connection refused)") for where in self.tasks.values()
        )
        lost_ps = any(name.startswith("ps:") for name in self.tasks)
        return (
            f"{self.process}: lost {self._names()}: "
            + (
                "its process is gone (a running server accepts connections; "
                "its port refuses them). "
                if refused
                else "its process died or its host is unreachable. "
            )
            + (
                "The variables a ps task held died with it (TensorFlow has no ps "
                "failover), so this run cannot go on. "
                if lost_ps
                else "The replicas placed on it cannot run, so this run cannot go on. "
            )
            + "Stop every task, restart the whole cluster (`keras-psdist launch` "
            "starts and stops it as one command), and " + _RESUME
        )


_RESUME = (
    "resume from the last checkpoint: with keras.callbacks.BackupAndRestore in "
    "`fit`, training resumes from the last saved epoch, with its weights and "
    "optimizer state."
)


class TaskUnreachableError(TaskLostError):
    """Server tasks do not answer (their connections time out) while other
    tasks do: their host is cut off from the network, or down.

    Unlike a task whose process died (its port refuses at once), a task that
    does not answer may still be running with its variables; this process
    only cannot reach it.

    Attributes:
        tasks: The tasks that do not answer: name -> `"address (why)"`.
        process: This process's task.
        answering: Other tasks that answered (name -> address); empty when
            there was no other task to ask, and then this process's own
            network may be the one that is down.
    """

    def __init__(self, tasks: dict[str, str], process: str, answering: dict[str, str]):
        self.answering = dict(answering)
        super().__init__(tasks, process)

    def _message(self) -> str:
        many = len(self.tasks) > 1
        if self.answering:
            answer = ", ".join(self.answering)
            witness = (
                f", while {answer} answer{'' if len(self.answering) > 1 else 's'}: "
                f"{'their hosts are' if many else 'its host is'} cut off from the "
                "network, or down. "
            )
        else:
            witness = (
                f". {'Their hosts are' if many else 'Its host is'} cut off or down, "
                "or this host's own network is down (there is no other task to "
                "ask which). "
            )
        return (
            f"{self.process}: {self._names()} do{'' if many else 'es'} not answer"
            + witness
            + "A task whose process died refuses connections at once; this one "
            "does not answer at all, so its process may still be running, with "
            "its variables, but this run cannot reach them. Once the network is "
            "back, stop every task, restart the cluster (`keras-psdist launch`), "
            "and " + _RESUME
        )


class DisconnectedError(TaskLostError):
    """This process reaches no other task of the cluster: its own network
    (link, host, firewall) is probably down, and the others are probably fine.

    Attributes:
        tasks: Every other task it tried: name -> `"address (why)"`.
        process: This process's task.
        restartable: Whether the run can go on without this process and take
            it back when restarted (a between-graph worker other than the
            chief).
    """

    def __init__(self, tasks: dict[str, str], process: str, restartable: bool):
        self.restartable = restartable
        super().__init__(tasks, process)

    def _message(self) -> str:
        return (
            f"{self.process} cannot reach any other task of the cluster: "
            f"{self._names()} do not answer. This host's own network is "
            "probably down (every other host cut off at once is far less "
            "likely), so the ps tasks and their variables are probably fine. "
            + (
                "Restart this worker once its network is back: it opens the "
                "shared variables again and goes on from their current values "
                "(`keras-psdist launch --max-restarts N` restarts a failed "
                "worker by itself)."
                if self.restartable
                else "This process is the chief (it writes the checkpoints and, "
                "in-graph or with SyncReplicaStrategy, runs every update), so "
                "the run cannot go on without it. Once its network is back, "
                "restart the run and " + _RESUME
            )
        )


class WorkerLostError(RuntimeError):
    """A worker died and the others cannot make an update without it."""


class StalledError(TimeoutError):
    """No update released this worker within `step_timeout` seconds."""


class JoinRefusedError(ValueError):
    """A worker cannot join a running elastic job (`max_workers`): its slot
    is taken by a live worker, or is outside the job's `max_workers`. The
    message says which and how to start it instead. The running job is not
    touched."""
