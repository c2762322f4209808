"""Separate hosts on one machine: Linux network namespaces on a private bridge.

`NamespaceHosts(["ps0", "worker0", ...])` makes one network namespace per
host, each with its own address on a bridge that lives in a namespace of its
own, and starts processes inside a host (`popen`, or `launch(hosts=...)` for
a whole cluster job). A host's link can be limited in rate (`limit`: `tc`
token bucket, both directions), cut and restored (`cut`, `restore`: the
bridge side of its link goes down, so packets vanish without a reset, as
when a cable is pulled), and its byte counters read (`counters`)::

    bridge namespace  kpdh-<pid>-<n>-bridge     br0 ── p0, p1, ...
                                                        │   │
    host namespaces   kpdh-<pid>-<n>-<name>     eth0 ───┘   │  10.231.0.2/24
                                                eth0 ───────┘  10.231.0.3/24

Nothing is added to the machine's own namespace: each veth pair is made
inside its host's namespace with its peer put straight into the bridge's,
and the addresses exist only inside those namespaces. Two sets of hosts
never see each other (each has its own bridge), so they can use the same
addresses side by side. `close` (or leaving the `with` block, or the
interpreter's exit) kills every process still inside a host and removes
every namespace; `remove_stale` removes what a killed run left behind
(namespaces whose owning process is gone), and `leftovers` lists what
exists.

It needs Linux, root, and iproute2 (`ip`, `tc`); `check_available` says
which one is missing. `netem` (delay, loss) is not assumed: a slow host is
made by rate, a partition by a cut.

Example (as root):

>>> from keras_psdist.testing.hosts import NamespaceHosts
>>> with NamespaceHosts(["ps0", "worker0"]) as hosts:  # doctest: +SKIP
...     hosts.address("ps0")
...     hosts.run("worker0", ["ping", "-c1", "-W2", hosts.address("ps0")]).returncode
'10.231.0.2'
0
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence

# Every namespace of ours starts with this, then the owning process's pid.
PREFIX = "kpdh-"
# The hosts' addresses: SUBNET.2, SUBNET.3, ... (/24).
SUBNET = "10.231.0"
# The host's side of its link.
DEVICE = "eth0"
# The port every task gets when each task has a host of its own (the
# convention of TensorFlow's cluster examples).
DEFAULT_PORT = 2222

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")
_SUBNET = re.compile(r"^(\d{1,3})\.(\d{1,3})\.(\d{1,3})$")
_COMMAND_TIMEOUT_S = 30.0
_counter = iter(range(1, sys.maxsize))
_counter_lock = threading.Lock()


class HostsUnavailable(RuntimeError):
    """Namespaces cannot be made here; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class LinkCounters:
    """Bytes through a host's link, as the host sees it (`ip -s link`)."""

    rx_bytes: int  # into the host
    tx_bytes: int  # out of the host

    def __sub__(self, other: LinkCounters) -> LinkCounters:
        return LinkCounters(
            self.rx_bytes - other.rx_bytes, self.tx_bytes - other.tx_bytes
        )


def check_available() -> None:
    """Raises `HostsUnavailable` saying why namespaces cannot be made here.

    Checks Linux, root, `ip` and `tc` on the PATH, and that a namespace can
    be made and removed (a container without CAP_SYS_ADMIN cannot).
    """
    if not sys.platform.startswith("linux"):
        raise HostsUnavailable(
            f"network namespaces need Linux; this is {sys.platform}."
        )
    if os.geteuid() != 0:
        raise HostsUnavailable(
            f"network namespaces need root; running as uid {os.geteuid()}. "
            "Run the tests as root (CI does), or deselect them with "
            "`-m 'not hosts'`."
        )
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise HostsUnavailable(
                f"`{tool}` is not on the PATH: install iproute2 "
                "(`apt-get install iproute2`; .ci/install-system-packages does)."
            )
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = subprocess.run(
        ["ip", "netns", "add", probe], capture_output=True, text=True, check=False
    )
    if made.returncode != 0:
        raise HostsUnavailable(
            f"`ip netns add {probe}` failed: {made.stderr.strip()} (a container "
            "needs CAP_SYS_ADMIN and a writable /run/netns)."
        )
    _ip("netns", "del", probe)


def leftovers(prefix: str = PREFIX) -> list[str]:
    """The namespaces whose names start with `prefix` (ours: `kpdh-`)."""
    listed = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, check=False
    )
    return sorted(
        line.split()[0]
        for line in listed.stdout.splitlines()
        if line.startswith(prefix)
    )


def remove_stale(prefix: str = PREFIX) -> list[str]:
    """Removes the namespaces of ours whose owning process is gone (a run
    that was killed before it could clean up). Returns their names."""
    removed = []
    for name in leftovers(prefix):
        match = re.match(re.escape(prefix) + r"(\d+)-", name)
        if match and _pid_alive(int(match.group(1))):
            continue
        _remove_namespace(name)
        removed.append(name)
    return removed


class NamespaceHosts:
    """Hosts made of network namespaces on a private bridge.

    Args:
        names: One name per host (letters, digits, `_.-`; up to 40
            characters), e.g. `["ps0", "worker0", "worker1"]`. The i-th gets
            the address `f"{subnet}.{i + 2}"`.
        subnet: The first three octets of the hosts' /24. Defaults to
            `"10.231.0"`; the addresses exist only inside the namespaces.

    Raises:
        ValueError: For a bad name list or subnet.
        HostsUnavailable: On `start` (or entering the `with` block), if
            namespaces cannot be made here.
    """

    def __init__(self, names: Sequence[str], subnet: str = SUBNET):
        if isinstance(names, str) or not isinstance(names, Sequence):
            raise TypeError(
                f"names must be a list of host names, got {names!r}; e.g. "
                "NamespaceHosts(['ps0', 'worker0'])."
            )
        names = list(names)
        if not names or len(names) > 250:
            raise ValueError(f"names must hold 1 to 250 host names, got {len(names)}.")
        bad = [n for n in names if not isinstance(n, str) or not _NAME.match(n)]
        if bad:
            raise ValueError(
                f"host names {bad!r} are not valid: use letters, digits and "
                "`_.-`, up to 40 characters, e.g. 'worker0'."
            )
        if len(set(names)) != len(names):
            raise ValueError(f"host names must be unique, got {names!r}.")
        match = _SUBNET.match(subnet) if isinstance(subnet, str) else None
        if not match or any(int(octet) > 255 for octet in match.groups()):
            raise ValueError(
                f"subnet must be three octets such as '10.231.0', got {subnet!r}."
            )
        self._names = names
        self._subnet = subnet
        with _counter_lock:
            self._tag = f"{PREFIX}{os.getpid()}-{next(_counter)}"
        self._made: list[str] = []  # Namespaces made, in order.
        self._procs: list[subprocess.Popen] = []
        self._cut: set[str] = set()
        self._closed = False

    # Life cycle.

    def __enter__(self) -> NamespaceHosts:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        """Makes the bridge and every host; on any failure removes what was
        made and raises."""
        check_available()
        atexit.register(self.close)
        try:
            bridge = self._bridge
            self._add_namespace(bridge)
            _ip("-n", bridge, "link", "add", "br0", "type", "bridge")
            _ip("-n", bridge, "link", "set", "br0", "up")
            for name in self._names:
                ns = self.namespace(name)
                self._add_namespace(ns)
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip(
                    "-n", ns, "link", "add", DEVICE, "type", "veth",
                    "peer", "name", self._port(name), "netns", bridge,
                )  # fmt: skip
                _ip("-n", ns, "addr", "add", f"{self.address(name)}/24", "dev", DEVICE)
                _ip("-n", ns, "link", "set", DEVICE, "up")
                _ip("-n", bridge, "link", "set", self._port(name), "master", "br0")
                _ip("-n", bridge, "link", "set", self._port(name), "up")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Kills every process inside the hosts and removes every namespace.
        Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        for proc in self._procs:
            _kill_group(proc)
        for ns in reversed(self._made):
            _remove_namespace(ns)
        self._made.clear()

    # What the hosts are.

    @property
    def names(self) -> list[str]:
        return list(self._names)

    def address(self, name: str) -> str:
        """The host's address, e.g. `"10.231.0.2"`."""
        return f"{self._subnet}.{self._index(name) + 2}"

    def namespace(self, name: str) -> str:
        """The host's namespace name (for `ip netns exec`)."""
        self._index(name)
        return f"{self._tag}-{name}"

    # Processes.

    def command(self, name: str, command: Sequence[str]) -> list[str]:
        """`command` as run inside host `name` (`ip netns exec ...`)."""
        return ["ip", "netns", "exec", self.namespace(name), *command]

    def popen(self, name: str, command: Sequence[str], **kwargs) -> subprocess.Popen:
        """Starts `command` inside host `name` in a session of its own;
        `close` kills its process group if it is still running."""
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(self.command(name, command), **kwargs)
        self._procs.append(proc)
        return proc

    def run(
        self, name: str, command: Sequence[str], timeout: float = 60.0, **kwargs
    ) -> subprocess.CompletedProcess:
        """Runs `command` inside host `name` to its end (text output
        captured unless told otherwise)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(
            self.command(name, command), timeout=timeout, check=False, **kwargs
        )

    def task_hosts(
        self, placement: Mapping[str, str], port: int = DEFAULT_PORT
    ) -> TaskPlacement:
        """What `keras_psdist.cluster.launch(hosts=...)` takes: each task
        (`"ps:0"`, `"worker:1"`, `"chief:0"`) on the host `placement` names.
        Tasks on one host get ports `port`, `port + 1`, ...

        Raises:
            ValueError: If a host is unknown.
        """
        addresses: dict[str, str] = {}
        used: dict[str, int] = {}
        for task, host in placement.items():
            self._index(host)
            addresses[task] = f"{self.address(host)}:{port + used.get(host, 0)}"
            used[host] = used.get(host, 0) + 1
        return TaskPlacement(self, dict(placement), addresses)

    # The link.

    def limit(self, name: str, mbit: float) -> None:
        """Limits host `name`'s link to `mbit` Mbit/s each way (`tc` token
        bucket filter on both ends of its link)."""
        if not isinstance(mbit, (int, float)) or isinstance(mbit, bool) or mbit <= 0:
            raise ValueError(
                f"mbit must be a rate in Mbit/s above 0, got {mbit!r}; call "
                "unlimit() for an unlimited link."
            )
        rate_bytes = mbit * 1e6 / 8
        # The bucket holds at least a GSO packet (64 KiB) and 10 ms of rate.
        burst = int(max(65536, rate_bytes / 100))
        for ns, dev in self._link_ends(name):
            _run(
                ["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf",
                 "rate", f"{mbit}mbit", "burst", str(burst), "latency", "400ms"]
            )  # fmt: skip

    def unlimit(self, name: str) -> None:
        """Takes host `name`'s rate limit away."""
        for ns, dev in self._link_ends(name):
            _run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)

    def cut(self, name: str) -> None:
        """Cuts host `name` off the network: the bridge's side of its link
        goes down, so what it sends and what is sent to it vanishes (no
        reset reaches anyone). Its processes go on running."""
        _ip("-n", self._bridge, "link", "set", self._port(name), "down")
        self._cut.add(name)

    def restore(self, name: str) -> None:
        """Puts host `name` back on the network.

        Address resolutions that failed while it was cut are forgotten on
        every host (as a carrier coming back does), so the first connection
        after the restore resolves afresh instead of failing with "no route
        to host" for a few seconds."""
        _ip("-n", self._bridge, "link", "set", self._port(name), "up")
        _ip("-n", self.namespace(name), "neigh", "flush", "dev", DEVICE, check=False)
        for other in self._names:
            _ip(
                "-n", self.namespace(other), "neigh", "flush", "to",
                self.address(name), check=False,
            )  # fmt: skip
        self._cut.discard(name)

    def is_cut(self, name: str) -> bool:
        self._index(name)
        return name in self._cut

    def counters(self, name: str) -> LinkCounters:
        """The bytes through host `name`'s link so far."""
        shown = _run(
            [
                "ip",
                "-n",
                self.namespace(name),
                "-s",
                "-j",
                "link",
                "show",
                "dev",
                DEVICE,
            ]
        )
        stats = json.loads(shown.stdout)[0]["stats64"]
        return LinkCounters(stats["rx"]["bytes"], stats["tx"]["bytes"])

    def network_state(self) -> str:
        """What each host's link, neighbour table and TCP sockets look like
        now (`ip link`, `ip neigh`, `ss -tan`), and the bridge's ports: for a
        test to print when a host cannot reach another."""
        parts = []
        for name in self._names:
            ns = self.namespace(name)
            parts.append(f"--- {name} ({self.address(name)}; cut: {name in self._cut})")
            for command in (
                ["ip", "-n", ns, "-br", "link", "show", "dev", DEVICE],
                ["ip", "-n", ns, "neigh", "show"],
                ["ip", "netns", "exec", ns, "ss", "-tan"],
            ):
                parts.append(_run(command, check=False).stdout.rstrip())
        parts.append("--- bridge")
        parts.append(
            _run(["bridge", "-n", self._bridge, "link"], check=False).stdout.rstrip()
        )
        return "\n".join(parts)

    # Internals.

    @property
    def _bridge(self) -> str:
        return f"{self._tag}-bridge"

    def _port(self, name: str) -> str:
        return f"p{self._index(name)}"

    def _link_ends(self, name: str) -> list[tuple[str, str]]:
        return [(self.namespace(name), DEVICE), (self._bridge, self._port(name))]

    def _index(self, name: str) -> int:
        try:
            return self._names.index(name)
        except ValueError:
            raise ValueError(
                f"no host named {name!r}; the hosts are {self._names}."
            ) from None

    def _add_namespace(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._made.append(ns)


@dataclasses.dataclass
class TaskPlacement:
    """Tasks on hosts, for `keras_psdist.cluster.launch(hosts=...)`: the
    launcher asks each task's address and wraps each task's command."""

    hosts: NamespaceHosts
    placement: dict[str, str]  # "ps:0" -> host name
    addresses: dict[str, str]  # "ps:0" -> "10.231.0.2:2222"

    def address(self, task: str) -> str:
        try:
            return self.addresses[task]
        except KeyError:
            raise ValueError(
                f"the launch has task {task!r} but the placement names only "
                f"{sorted(self.addresses)}; give every task a host."
            ) from None

    def command(self, task: str, command: Sequence[str]) -> list[str]:
        self.address(task)
        return self.hosts.command(self.placement[task], command)


def one_host_per_task(
    num_ps: int, num_workers: int, chief: bool = False
) -> dict[str, str]:
    """`{"ps:0": "ps0", ..., "worker:0": "worker0", ...}` (and
    `"chief:0": "chief"`): a task per host, named after it."""
    placement = {f"ps:{i}": f"ps{i}" for i in range(num_ps)}
    placement |= {f"worker:{i}": f"worker{i}" for i in range(num_workers)}
    if chief:
        placement["chief:0"] = "chief"
    return placement


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run(["ip", *args], check=check)


def _run(command: list[str], check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(command)}` failed (exit {done.returncode}): "
            f"{done.stderr.strip()}"
        )
    return done


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _remove_namespace(ns: str) -> None:
    """Kills every process inside namespace `ns` and deletes it.

    A process can still be on its way in: `ip netns exec` opens
    `/run/netns/NS`, then enters it. One that opened it before the
    deletion enters after any kill made by name (`ip netns pids` does not
    list it yet), and would live on in a namespace nothing names. So the
    processes are found by the namespace's inode, inside it or holding it
    open, before the deletion and once more after it, when no process can
    open it any more.
    """
    try:
        stat = os.stat(f"/run/netns/{ns}")
    except FileNotFoundError:
        _ip("netns", "del", ns, check=False)
        return
    namespace = (stat.st_dev, stat.st_ino)
    _kill_holders(namespace)
    _ip("netns", "del", ns, check=False)
    _kill_holders(namespace)


def _kill_holders(namespace: tuple[int, int]) -> None:
    """SIGKILLs every process inside the network namespace `namespace`
    (its file's device and inode) or holding it open, and waits (up to
    10 s) until none is left."""
    deadline = time.monotonic() + 10.0
    while True:
        pids = _holders(namespace)
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def _holders(namespace: tuple[int, int]) -> list[int]:
    """The processes whose network namespace, or one of whose open files,
    is `namespace` (device and inode, as `os.stat` gives them)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        paths = [f"/proc/{entry}/ns/net"]
        try:
            paths += [
                f"/proc/{entry}/fd/{fd}" for fd in os.listdir(f"/proc/{entry}/fd")
            ]
        except OSError:  # gone, or a kernel thread's
            pass
        for path in paths:
            try:
                stat = os.stat(path)
            except OSError:
                continue
            if (stat.st_dev, stat.st_ino) == namespace:
                found.append(int(entry))
                break
    return found


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
