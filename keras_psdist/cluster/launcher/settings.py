"""`launch`'s settings, checked, in one frozen record.

`launch` checks its arguments (`arguments.py`), turns `host_discovery` into
a hook (`discovery.py`) and hands the result to the run as one
`LaunchSettings`: the run reads its settings from there and changes none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Protocol, TextIO


class TaskHosts(Protocol):
    """Where `launch(hosts=...)` runs each task."""

    def address(self, task: str) -> str:
        """The task's `"host:port"`, for TF_CONFIG."""

    def command(self, task: str, command: Sequence[str]) -> list[str]:
        """The command that runs `command` on the task's host."""


@dataclasses.dataclass(frozen=True)
class LaunchSettings:
    """Everything one `launch` call was asked for, after checking.

    The fields are `launch`'s arguments (see its docstring), except:

    Attributes:
        command: The training command, as a tuple.
        mode: The mode's canonical spelling (`"in-graph"`, `"between-graph"`).
        out: Where the output goes (`sys.stdout` when `launch` got `None`).
        discover: `host_discovery` as a hook returning the hosts that may run
            workers now (`discovery.discovery_hook`), or `None`.
    """

    command: tuple[str, ...]
    num_ps: int
    num_workers: int
    mode: str
    host: str
    timeout_s: float | None
    startup_timeout_s: float
    out: TextIO
    max_restarts: int = 0
    max_worker_failures: int = 0
    verbose: bool = False
    hosts: TaskHosts | None = None
    evaluator: bool = False
    max_workers: int | None = None
    min_workers: int | None = None
    discover: Callable[[], list[str]] | None = None

    @property
    def address_host(self) -> str:
        """`host` as it goes before `:port` (an IPv6 literal in brackets)."""
        if ":" in self.host and not self.host.startswith("["):
            return f"[{self.host}]"
        return self.host
