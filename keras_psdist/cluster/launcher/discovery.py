"""Host discovery for an elastic launch: which hosts may run workers now.

A scheduler that grants and takes back machines (a cloud group, a
pre-emptible pool, a Slurm allocation that grows with `scontrol`) says so
through a hook the launcher polls (`launch(host_discovery=...)`, or
`keras-psdist launch --host-discovery-script PATH`, Horovod elastic's
convention): it returns the hosts that may run workers now, one entry per
worker slot, `host` or `host:slots`. The launcher then keeps one worker per
slot, between `--min-workers` and `--max-workers`: it starts workers on hosts
that appeared and asks the workers on hosts that went away to leave after
their current step (never the chief, `worker:0`).

Workers are started by this launcher, on this machine, with their
addresses on the discovered hosts (`host:port`, a port free there): the
hosts are this machine's own addresses (127.0.0.x, a namespace's through
`launch(hosts=...)`). Starting a worker on another machine (ssh) is not
built: on a cluster, the scheduler starts the processes (`keras-psdist
slurm`, `keras-psdist k8s`).

Examples:

>>> parse_hosts(["10.0.0.1", "10.0.0.2:2", "", "# a comment"])
['10.0.0.1', '10.0.0.2', '10.0.0.2']
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterable, Sequence

# Seconds between two looks at the hosts.
DISCOVERY_EVERY_S = 2.0
# Seconds a discovery script may take.
SCRIPT_TIMEOUT_S = 20.0


def parse_hosts(lines: Iterable[str]) -> list[str]:
    """One entry per worker slot, from lines `host` or `host:slots` (blank
    lines and `#` comments skipped).

    Raises:
        ValueError: for a line that is neither, naming it.
    """
    hosts = []
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        host, colon, slots = line.rpartition(":")
        if not colon or "]" in slots:
            host, slots = line, "1"
        if not host or not slots.isdigit():
            raise ValueError(
                f"host discovery: cannot read {raw!r}: expected `host` or "
                "`host:slots` (slots a whole number), one per line."
            )
        hosts += [host] * int(slots)
    return hosts


def script_discovery(path: str) -> Callable[[], list[str]]:
    """A hook that runs the executable `path` and reads its stdout (see the
    module doc).

    The hook raises `RuntimeError` (the launcher logs it and keeps its
    workers) if the script fails, times out or prints a line it cannot read.
    """

    def discover() -> list[str]:
        try:
            done = subprocess.run(
                [path],
                capture_output=True,
                text=True,
                timeout=SCRIPT_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RuntimeError(f"the host discovery script {path} failed: {e}") from e
        if done.returncode != 0:
            raise RuntimeError(
                f"the host discovery script {path} exited with "
                f"{done.returncode}: {done.stderr.strip()[-500:]}"
            )
        try:
            return parse_hosts(done.stdout.splitlines())
        except ValueError as e:
            raise RuntimeError(str(e)) from None

    return discover


def discovery_hook(
    host_discovery: Callable[[], Sequence[str]] | str | None,
) -> Callable[[], list[str]] | None:
    """`launch`'s `host_discovery` as a hook: a path runs as a script; a
    callable's entries are read as the script's lines."""
    if host_discovery is None:
        return None
    if isinstance(host_discovery, str):
        if not (os.path.isfile(host_discovery) and os.access(host_discovery, os.X_OK)):
            raise ValueError(
                "The host discovery script must be an executable file. Received: "
                f"{host_discovery!r}, which "
                + (
                    "is not executable (chmod +x it)."
                    if os.path.isfile(host_discovery)
                    else "does not exist."
                )
            )
        return script_discovery(host_discovery)
    if not callable(host_discovery):
        raise TypeError(
            "host_discovery must be a callable returning the hosts (`host` or "
            "`host:slots` each) or the path of a script that prints them. "
            f"Received: {host_discovery!r}"
        )

    def discover() -> list[str]:
        return parse_hosts(host_discovery())

    return discover
