"""`launch`'s arguments, checked before any process starts."""

from __future__ import annotations

from collections.abc import Sequence

from keras_psdist.cluster.mode_names import IN_GRAPH, LAUNCH_MODES, canonical
from keras_psdist.cluster.ports import pick_free_ports

# The modes `launch` takes (`keras_psdist.cluster.mode_names`).
MODES = LAUNCH_MODES


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
            "`keras-psdist launch --num-ps 1 --num-workers 2 -- python train.py`."
        )
    for name, value in (("num_ps", num_ps), ("num_workers", num_workers)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`{name}` must be an integer >= 1. Received: {value!r}")
    normalised = canonical(mode, LAUNCH_MODES, "launch", stacklevel=4)
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
    mode: str,
    num_workers: int,
    max_restarts: int,
    max_worker_failures: int,
    *,
    as_flags: bool = False,
) -> None:
    """Restarts and tolerated losses: between-graph only, never the chief.

    The errors name the arguments of `launch` (`max_restarts=2`), or with
    `as_flags` the flags of `keras-psdist launch` (`--max-restarts 2`).
    """

    def said(name: str, value: object) -> str:
        if as_flags:
            return f"--{name.replace('_', '-')} {value}"
        return f"{name}={value!r}"

    def named(name: str) -> str:
        return f"--{name.replace('_', '-')}" if as_flags else name

    for name, value in (
        ("max_restarts", max_restarts),
        ("max_worker_failures", max_worker_failures),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(
                f"`{named(name)}` must be an integer >= 0. Received: {value!r}"
            )
        if value and mode == IN_GRAPH:
            raise ValueError(
                f"`{named(name)}` applies to between-graph runs, where each worker "
                "is its own training process. In-graph, the worker tasks are the "
                "chief's replicas and it cannot go on without one. Received: "
                f"{said(name, value)}, {said('mode', 'in-graph')}. Use "
                f"{said('mode', 'between-graph')}."
            )
    if max_worker_failures >= num_workers:
        raise ValueError(
            f"`{named('max_worker_failures')}` must leave the chief (worker:0), "
            "which is never tolerated to fail: at most "
            f"{named('num_workers')} - 1 = {num_workers - 1}. Received: "
            f"{said('max_worker_failures', max_worker_failures)}, "
            f"{said('num_workers', num_workers)}."
        )


def check_max_workers(
    mode: str,
    num_workers: int,
    max_workers: int | None,
    *,
    min_workers: int | None = None,
    host_discovery: object = None,
    as_flags: bool = False,
) -> None:
    """Elastic membership: between-graph only, at least the starting workers;
    `min_workers` between 1 and the starting workers."""
    name = "--max-workers" if as_flags else "max_workers"
    if max_workers is None:
        for given, what in (
            (min_workers, "--min-workers" if as_flags else "min_workers"),
            (
                host_discovery,
                "--host-discovery-script" if as_flags else "host_discovery",
            ),
        ):
            if given is not None:
                raise ValueError(
                    f"`{what}` applies to a job whose workers join and leave, "
                    f"which `{name}` makes. Received: {what} {given!r} without "
                    f"{name}. Pass {name} M too (the most workers the job may have)."
                )
        return
    if isinstance(max_workers, bool) or not isinstance(max_workers, int):
        raise ValueError(f"`{name}` must be an integer. Received: {max_workers!r}")
    if mode == IN_GRAPH:
        raise ValueError(
            f"`{name}` lets workers join and leave a between-graph run, where "
            "each worker is its own training process; in-graph, the workers are "
            f"the chief's replicas, fixed when it connects. Received: {name} "
            f"{max_workers} with the in-graph mode. Use the between-graph mode."
        )
    if max_workers < num_workers:
        raise ValueError(
            f"`{name}` must be at least the starting number of workers "
            f"({num_workers}). Received: {max_workers!r}"
        )
    if min_workers is not None:
        least = "--min-workers" if as_flags else "min_workers"
        if (
            isinstance(min_workers, bool)
            or not isinstance(min_workers, int)
            or not 1 <= min_workers <= num_workers
        ):
            raise ValueError(
                f"`{least}` must be an integer from 1 (the chief) to the "
                f"starting number of workers ({num_workers}). Received: "
                f"{min_workers!r}"
            )
