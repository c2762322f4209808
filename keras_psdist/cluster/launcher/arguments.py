"""`launch`'s arguments, checked before any process starts."""

from __future__ import annotations

from collections.abc import Sequence

from keras_psdist.cluster.ports import pick_free_ports

MODES = ("in-graph", "between-graph")


def check_args(
    command: Sequence[str],
    num_ps: int,
    num_workers: int,
    mode: str,
    host: str,
    timeout_s: float | None,
    startup_timeout_s: float,
) -> tuple[list[str], str]:
    """The command as a list and the mode's canonical spelling, or a
    `ValueError` naming the bad argument and the fix."""
    if isinstance(command, str):
        raise ValueError(
            "`command` must be a sequence of arguments, e.g. "
            f"['python', 'train.py']. Received the string {command!r}; split it "
            "(shlex.split) or pass a list."
        )
    command = list(command)
    if not command or not command[0]:
        raise ValueError(
            "`command` is empty: give the training command to run, e.g. "
            "`keras-psdist launch --num_ps 1 --num_workers 2 -- python train.py`."
        )
    for name, value in (("num_ps", num_ps), ("num_workers", num_workers)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`{name}` must be an integer >= 1. Received: {value!r}")
    normalised = str(mode).replace("_", "-")
    if normalised not in MODES:
        raise ValueError(f"Unknown mode {mode!r}. Expected one of: {', '.join(MODES)}.")
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"`timeout_s` must be > 0. Received: timeout_s={timeout_s}")
    if not startup_timeout_s > 0:
        raise ValueError(
            "`startup_timeout_s` must be > 0. Received: "
            f"startup_timeout_s={startup_timeout_s}"
        )
    try:
        pick_free_ports(1, host)
    except OSError as e:
        raise ValueError(
            f"Cannot open ports on host {host!r} ({e}). Give an address of this "
            "machine, e.g. 127.0.0.1."
        ) from None
    return command, normalised


def check_fault_tolerance(
    mode: str, num_workers: int, max_restarts: int, max_worker_failures: int
) -> None:
    """Restarts and tolerated losses: between-graph only, never the chief."""
    for name, value in (
        ("max_restarts", max_restarts),
        ("max_worker_failures", max_worker_failures),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"`{name}` must be an integer >= 0. Received: {value!r}")
        if value and mode == "in-graph":
            raise ValueError(
                f"`{name}` applies to between-graph runs, where each worker is "
                "its own training process. In-graph, the worker tasks are the "
                "chief's replicas and it cannot go on without one. Received: "
                f"{name}={value}, mode='in-graph'. Use mode='between-graph'."
            )
    if max_worker_failures >= num_workers:
        raise ValueError(
            "`max_worker_failures` must leave the chief (worker:0), which is "
            f"never tolerated to fail: at most num_workers - 1 = "
            f"{num_workers - 1}. Received: max_worker_failures="
            f"{max_worker_failures}, num_workers={num_workers}."
        )
