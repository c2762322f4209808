"""The multi-host test bed: hosts made of network namespaces on one machine.

`keras_psdist.testing.hosts.NamespaceHosts` gives each host its own address on
a bridge in a namespace of its own. These tests check what the cross-host and
network-fault tests rely on: hosts reach each other and nothing else, the
machine's own interfaces are untouched, a cut link drops packets, a limited
link is shaped, the byte counters count, and every namespace and process is
gone afterwards, also after a failure. They need root and iproute2; where
those are missing they fail, saying why (`check_available`).
"""

import json
import os
import subprocess
import sys

import pytest

from keras_psdist.testing import hosts as namespace_hosts
from keras_psdist.testing.hosts import NamespaceHosts

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(120), pytest.mark.waits]

# A TCP server on the given port: prints "listening", then reads each client's
# bytes to the end and prints how many.
SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen()
print("listening", flush=True)
while True:
    c, _ = s.accept(); n = 0
    while (b := c.recv(65536)):
        n += len(b)
    print(n, flush=True); c.close()
"""

# Connects to host:port with a timeout and sends N bytes; prints what happened.
CLIENT = """
import socket, sys
host, port, n, timeout = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
try:
    c = socket.create_connection((host, port), timeout=timeout)
    c.sendall(b"x" * n); c.close(); print("sent", n)
except socket.timeout:
    print("timeout")
except OSError as e:
    print("error", e.errno)
"""

PORT = 5000


@pytest.fixture(scope="module")
def hosts():
    with NamespaceHosts(["a", "b", "c"]) as made:
        yield made


@pytest.fixture(scope="module")
def server(hosts):
    """A byte-counting TCP server on host `a`."""
    proc = hosts.popen(
        "a",
        [sys.executable, "-c", SERVER, str(PORT)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "listening"
    yield proc
    proc.kill()
    proc.wait()


def _send(hosts, host, to, n, timeout=5.0):
    done = hosts.run(
        host,
        [
            sys.executable,
            "-c",
            CLIENT,
            hosts.address(to),
            str(PORT),
            str(n),
            str(timeout),
        ],
        timeout=timeout + 30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _received(server):
    return int(server.stdout.readline())


def test_hosts_have_their_own_addresses_and_reach_each_other(hosts, server):
    assert [hosts.address(n) for n in "abc"] == [
        "10.231.0.2",
        "10.231.0.3",
        "10.231.0.4",
    ]
    assert _send(hosts, "b", "a", 1000) == "sent 1000"
    assert _received(server) == 1000
    assert _send(hosts, "c", "a", 10) == "sent 10"
    assert _received(server) == 10


def test_nothing_is_added_to_the_machine_s_own_namespace(hosts):
    shown = subprocess.run(
        ["ip", "-j", "addr", "show"], capture_output=True, text=True, check=True
    )
    addresses = [
        info["local"] for link in json.loads(shown.stdout) for info in link["addr_info"]
    ]
    assert not any(a.startswith(namespace_hosts.SUBNET) for a in addresses), addresses
    links = [link["ifname"] for link in json.loads(shown.stdout)]
    assert "br0" not in links and not any(
        name.startswith("p") and name[1:].isdigit() for name in links
    )


def test_a_host_cannot_reach_this_machine_s_loopback_services(hosts):
    # This machine's own 127.0.0.1:PORT is nobody's; inside the host it is
    # its own loopback: refused at once (ECONNREFUSED = 111), not a way out.
    done = hosts.run(
        "b", [sys.executable, "-c", CLIENT, "127.0.0.1", str(PORT), "1", "2"]
    )
    assert done.stdout.strip() == "error 111"


def test_a_cut_host_loses_its_packets_and_gets_them_back_when_restored(hosts, server):
    hosts.cut("b")
    try:
        assert hosts.is_cut("b")
        # Packets vanish: the connection times out, it is not refused.
        assert _send(hosts, "b", "a", 100, timeout=2.0) == "timeout"
        # The others are unaffected.
        assert _send(hosts, "c", "a", 100) == "sent 100"
        assert _received(server) == 100
    finally:
        hosts.restore("b")
    assert not hosts.is_cut("b")
    assert _send(hosts, "b", "a", 100) == "sent 100"
    assert _received(server) == 100


def test_a_limited_link_is_shaped_both_ways_and_unlimit_removes_it(hosts, server):
    hosts.limit("c", 8)
    try:
        for ns, dev in (
            (hosts.namespace("c"), "eth0"),
            (hosts.namespace("c").rsplit("-", 1)[0] + "-bridge", "p2"),
        ):
            shown = subprocess.run(
                ["tc", "-n", ns, "-s", "-j", "qdisc", "show", "dev", dev],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            (qdisc,) = [q for q in json.loads(shown.stdout) if q["kind"] == "tbf"]
            assert qdisc["options"]["rate"] == 1_000_000  # bytes/s: 8 Mbit/s
        # 2 MB through an 8 Mbit/s bucket of 64 KiB: the shaper holds
        # packets back (its overlimits count), which only a limit does.
        assert _send(hosts, "c", "a", 2_000_000, timeout=30) == "sent 2000000"
        assert _received(server) == 2_000_000
        shown = subprocess.run(
            ["tc", "-n", hosts.namespace("c"), "-s", "-j", "qdisc", "show", "dev", "eth0"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        (qdisc,) = [q for q in json.loads(shown.stdout) if q["kind"] == "tbf"]
        assert qdisc["overlimits"] > 0, qdisc
    finally:
        hosts.unlimit("c")
    shown = subprocess.run(
        ["tc", "-n", hosts.namespace("c"), "-j", "qdisc", "show", "dev", "eth0"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "tbf" not in shown.stdout


def test_counters_count_the_bytes_through_a_link(hosts, server):
    before_b, before_a = hosts.counters("b"), hosts.counters("a")
    assert _send(hosts, "b", "a", 300_000) == "sent 300000"
    assert _received(server) == 300_000
    sent = hosts.counters("b") - before_b
    received = hosts.counters("a") - before_a
    # The payload plus TCP/IP headers and the handshake: at least the bytes,
    # and not much more.
    assert 300_000 <= sent.tx_bytes < 330_000, sent
    assert 300_000 <= received.rx_bytes < 330_000, received


def test_close_kills_the_processes_inside_and_removes_every_namespace():
    made = NamespaceHosts(["x", "y"])
    made.start()
    names = [made.namespace("x"), made.namespace("y")]
    assert set(names) <= set(namespace_hosts.leftovers())
    proc = made.popen("x", [sys.executable, "-c", "import time; time.sleep(600)"])
    # A process started inside by someone else (as `launch` does) too.
    other = subprocess.Popen(
        made.command("y", [sys.executable, "-c", "import time; time.sleep(600)"])
    )
    made.close()
    assert proc.poll() is not None
    assert other.wait(timeout=10) is not None
    left = namespace_hosts.leftovers(made.namespace("x").rsplit("-", 1)[0])
    assert left == []
    made.close()  # twice is fine


def test_close_kills_a_process_on_its_way_into_a_host():
    """`ip netns exec` opens the namespace, then enters it: a process
    between the two is not yet inside (`ip netns pids` does not list it),
    and would enter after the deletion, in a namespace nothing names. One
    that holds the namespace open is killed too."""
    made = NamespaceHosts(["x"])
    made.start()
    path = f"/run/netns/{made.namespace('x')}"
    holding = subprocess.Popen(
        [sys.executable, "-c",
         f"import os, sys, time; os.open({path!r}, os.O_RDONLY); "
         "print(flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        holding.stdout.readline()  # it holds the namespace open now
        made.close()
        assert holding.wait(timeout=10) is not None
    finally:
        holding.kill()
        holding.wait()


def test_a_failure_inside_the_block_still_removes_everything():
    with pytest.raises(ZeroDivisionError):
        with NamespaceHosts(["x"]) as made:
            tag = made.namespace("x").rsplit("-", 1)[0]
            raise ZeroDivisionError("a failing test body")
    assert namespace_hosts.leftovers(tag) == []


def test_remove_stale_removes_only_namespaces_of_dead_owners():
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"{namespace_hosts.PREFIX}{dead.pid}-1-x"
    live = f"{namespace_hosts.PREFIX}{os.getpid()}-999-x"
    for name in (stale, live):
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        removed = namespace_hosts.remove_stale()
        assert stale in removed and live not in removed
        assert live in namespace_hosts.leftovers()
    finally:
        for name in (stale, live):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.mark.parametrize(
    "names, match",
    [
        ("ps0", "a list of host names"),
        ([], "1 to 250"),
        (["a b"], "not valid"),
        (["a", "a"], "unique"),
    ],
)
def test_bad_host_names_are_named(names, match):
    with pytest.raises((TypeError, ValueError), match=match):
        NamespaceHosts(names)


def test_bad_arguments_to_a_running_bed_are_named(hosts):
    with pytest.raises(
        ValueError, match=r"no host named 'z'; the hosts are \['a', 'b', 'c'\]"
    ):
        hosts.cut("z")
    with pytest.raises(ValueError, match="unlimit"):
        hosts.limit("a", 0)
    with pytest.raises(ValueError, match="three octets"):
        NamespaceHosts(["a"], subnet="10.0.0.0/24")
    with pytest.raises(ValueError, match="give every task a host"):
        hosts.task_hosts({"ps:0": "a"}).address("worker:0")


def test_without_root_the_reason_is_said(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(
        namespace_hosts.HostsUnavailable, match="need root; running as uid 1000"
    ):
        namespace_hosts.check_available()


def test_a_start_that_fails_halfway_removes_what_it_made(monkeypatch):
    real_ip = namespace_hosts._ip

    def failing_ip(*args, check=True):
        if "addr" in args and args[1].endswith("-y"):
            raise RuntimeError("no address for y")
        return real_ip(*args, check=check)

    monkeypatch.setattr(namespace_hosts, "_ip", failing_ip)
    made = NamespaceHosts(["x", "y"])
    tag = made.namespace("x").rsplit("-", 1)[0]
    with pytest.raises(RuntimeError, match="no address for y"):
        made.start()
    assert namespace_hosts.leftovers(tag) == []


def test_network_state_shows_each_host_s_neighbours_and_sockets(hosts, server):
    assert _send(hosts, "b", "a", 10) == "sent 10"
    assert _received(server) == 10
    state = hosts.network_state()
    assert "--- a (10.231.0.2; cut: False)" in state
    assert "10.231.0.3 dev eth0 lladdr" in state  # a's neighbour b
    assert "LISTEN" in state and "--- bridge" in state
