"""Ports and reachability of a cluster's tasks, without TensorFlow.

`pick_free_ports` chooses ports for a local cluster, `check_port_free` tells
a task its port is taken before TensorFlow's server fails on it,
`wait_reachable` waits for every task to accept connections (a clear
`ConnectionError` naming the missing ones, never a hang), and
`connect_error` is one connection attempt's outcome (how a lost ps is told
from a live one).
"""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from keras_psdist.errors import PortInUseError


def wait_reachable(
    targets: Mapping[str, str] | Sequence[str],
    timeout_s: float,
    *,
    poll: Callable[[], None] | None = None,
) -> None:
    """Waits until every address accepts a TCP connection.

    Args:
        targets: Task name (e.g. `"ps:0"`) -> `"host:port"`, or a list of
            addresses (then named by their address).
        timeout_s: Give up after this many seconds.
        poll: Optional callable run between attempts, e.g. to stop waiting
            (by raising) when a server process has died. Defaults to `None`.

    Raises:
        ConnectionError: If some address still refuses connections after
            `timeout_s`; names each unreachable task and how to fix it.

    Examples:

    >>> wait_reachable([], timeout_s=1.0)
    """
    if isinstance(targets, Mapping):
        pending = dict(targets)
    else:
        pending = {address: address for address in targets}
    for address in pending.values():
        split_address(address, "wait_reachable")
    errors: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    while True:
        for name, address in list(pending.items()):
            remaining = deadline - time.monotonic()
            error = connect_error(address, max(0.05, min(1.0, remaining)))
            if error is None:
                del pending[name]
            else:
                errors[name] = error
        if not pending:
            return
        if time.monotonic() >= deadline:
            break
        if poll is not None:
            poll()
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
    unreachable = "; ".join(
        (
            f"{name} ({errors[name]})"
            if name == address
            else f"{name} at {address} ({errors[name]})"
        )
        for name, address in pending.items()
    )
    raise ConnectionError(
        f"Could not reach {len(pending)} task(s) within {timeout_s:g} s: "
        f"{unreachable}. Start each with `keras-psdist serve` (TF_CONFIG set to "
        "its task), or check that TF_CONFIG's addresses are right and that no "
        "firewall blocks the ports."
    )


def connect_error(address: str, timeout_s: float) -> str | None:
    """Why `address` refuses a TCP connection now (None if it accepts one).

    One attempt, at most `timeout_s` seconds: a killed process's port refuses
    at once; a host that is down times out.

    Examples:

    >>> port = pick_free_ports(1)[0]
    >>> connect_error(f"127.0.0.1:{port}", timeout_s=1.0)
    'Connection refused'
    """
    host, port = split_address(address, "connect_error")
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=timeout_s):
            return None
    except OSError as e:
        return e.strerror or str(e) or type(e).__name__


def pick_free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct TCP ports that are free on `host` right now.

    They are drawn at random below the kernel's ephemeral port range
    (`/proc/sys/net/ipv4/ip_local_port_range`, from port 20000 up), not
    handed out by it: every outgoing connection (a gRPC client of another
    run on this machine, say) takes its local port from that range, and one
    could take a picked port in the seconds before the task binds it (a
    between-graph worker binds its own only once its script has imported
    TensorFlow). Where that range leaves too little room below it, the
    kernel picks.

    The sockets are held together while picking (so the ports differ) and
    closed before returning, so another process may still take a port before
    it is used; callers should be ready to retry.

    Examples:

    >>> ports = pick_free_ports(3)
    >>> len(set(ports))
    3
    """
    if n < 0:
        raise ValueError(f"`n` must be >= 0. Received: n={n}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    first_ephemeral = _first_ephemeral_port()
    below = first_ephemeral - _LOWEST_PICKED_PORT
    rng = random.SystemRandom()
    sockets = []
    try:
        attempts = 0
        while len(sockets) < n:
            attempts += 1
            port = 0
            if below >= _MIN_PICK_ROOM and attempts <= _MAX_PICK_ATTEMPTS:
                port = rng.randrange(_LOWEST_PICKED_PORT, first_ephemeral)
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.bind((host.strip("[]"), port))
            except OSError:
                sock.close()
                if port == 0:
                    raise
                continue
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


# Ports `pick_free_ports` draws from: [20000, first ephemeral port).
_LOWEST_PICKED_PORT = 20000
_MIN_PICK_ROOM = 1000
_MAX_PICK_ATTEMPTS = 200


def _first_ephemeral_port() -> int:
    """The lowest port the kernel gives outgoing connections (Linux), else
    49152 (IANA's dynamic range)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def check_port_free(address: str) -> None:
    """Raises `PortInUseError` if a TensorFlow server could not bind `address`.

    TensorFlow's gRPC server binds the port on every interface (see
    `keras_psdist.cluster.server.serve`), so this checks the wildcard address,
    with `SO_REUSEADDR` as gRPC sets it.

    Raises:
        ValueError: If `address` is not `"host:port"`.
        PortInUseError: If another process holds the port.

    Examples:

    >>> check_port_free(f"127.0.0.1:{pick_free_ports(1)[0]}")
    """
    _, port = split_address(address, "check_port_free")
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        wildcard = "::"
    except OSError:  # No IPv6 on this host.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        wildcard = "0.0.0.0"
    with sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((wildcard, port))
        except OSError as e:
            raise PortInUseError(
                f"Port {port} (address {address}) is already in use by another "
                f"process ({e.strerror}). Stop that process (e.g. find it with "
                f"`ss -ltnp 'sport = :{port}'`) or give this task another port "
                "in TF_CONFIG.",
                port,
            ) from e


def split_address(address: Any, where: str) -> tuple[str, int]:
    """`"host:port"` -> `(host, port)`; IPv6 hosts in brackets (`[::1]:2222`)."""
    if isinstance(address, str):
        host, sep, port_text = address.rpartition(":")
        bracketed = host.startswith("[") and host.endswith("]")
        host_ok = bool(host) and (":" not in host or bracketed)
        if sep and host_ok and port_text.isdigit() and 1 <= int(port_text) <= 65535:
            return host, int(port_text)
    raise ValueError(
        f'{where}: expected an address "host:port" with a port in 1..65535 '
        f'(IPv6 as "[::1]:2222"). Received: {address!r}'
    )
