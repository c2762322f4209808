"""The processes of a launch: their output, their signals, their end.

Pure process management (no TensorFlow import): each child's output copied
line by line with a `[task]` prefix, SIGINT/SIGTERM recorded for the launch
to act on, process groups signalled and watched until every process of a
task is gone, and children that die with the launcher.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TextIO

_PR_SET_PDEATHSIG = 1


@dataclasses.dataclass
class Child:
    name: str  # The task, e.g. "ps:0".
    address: str
    proc: subprocess.Popen
    reader: threading.Thread
    is_server: bool
    ready: threading.Event  # Set when a server prints its READY_LINE.


class Stop(Exception):
    """Ends the run early with `code` after printing `message`."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class PortTaken(Exception):
    """A server could not bind its port: worth retrying with new ports."""


class Output:
    """Writes `[prefix] line` to a stream, whole lines, from several threads.

    `hide`, if given, picks the children's lines to leave out.
    """

    def __init__(self, stream: TextIO, hide: Callable[[str], bool] | None = None):
        self._stream = stream
        self._hide = hide
        self._lock = threading.Lock()
        self._broken = False

    def line(self, prefix: str, text: str) -> None:
        with self._lock:
            if self._broken:
                return
            try:
                self._stream.write(f"[{prefix}] {text}\n")
                self._stream.flush()
            except (OSError, ValueError):
                # A closed pipe (e.g. `| head`) must not stop the run.
                self._broken = True

    def copy(self, prefix: str, stream, on_line: Callable[[str], None]) -> None:
        """Copies `stream` (bytes) line by line until EOF."""
        for raw in iter(stream.readline, b""):
            text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            on_line(text)
            if self._hide is None or not self._hide(text):
                self.line(prefix, text)


class Signals:
    """Records SIGINT/SIGTERM while active (main thread only)."""

    def __init__(self):
        self.received: list[int] = []
        self._previous: dict[int, object] = {}

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum, frame) -> None:
        self.received.append(signum)

    def check(self) -> None:
        if self.received:
            signum = self.received[0]
            raise Stop(
                128 + signum,
                f"received {signal.Signals(signum).name}; stopping every task",
            )


def names(children: Sequence[Child]) -> str:
    return ", ".join(child.name for child in children)


def exit_code(returncode: int) -> int:
    """A Popen returncode as a shell reports it (-N for signal N -> 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def describe(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"{name} (exit code {exit_code(returncode)})"
    return f"exit code {returncode}"


def signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


_STAT = re.compile(rb"\) (\S) (\d+) (\d+)")


def group_alive(proc: subprocess.Popen) -> bool:
    """Whether `proc` or anything left in its process group still runs.

    Zombies do not count: an orphan reparented to a PID 1 that does not reap
    would otherwise look alive forever.
    """
    if proc.poll() is None:
        return True
    pgid = proc.pid
    if not os.path.isdir("/proc"):
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # Fields after the command name: state, ppid, pgrp.
        match = _STAT.search(stat, stat.rfind(b")"))
        if match and int(match.group(3)) == pgid and match.group(1) not in b"ZX":
            return True
    return False


def parent_death_signal() -> Callable[[], None] | None:
    """A `preexec_fn` that has the child SIGKILLed when the launcher dies."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        # The launcher may have died before prctl took effect.
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def stop_children(
    children: list[Child],
    signals: Signals,
    log: Callable[[str], None],
    grace_s: float,
) -> None:
    """SIGTERM every child's process group, SIGKILL what is left after
    `grace_s` (at once on a further signal), and wait until all of them are
    gone."""
    if not children:
        return
    signals_before = len(signals.received)
    for child in children:
        signal_group(child.proc.pid, signal.SIGTERM)
        # A stopped process (SIGSTOP, a frozen task) acts on SIGTERM
        # only once continued; without this it used up the grace period.
        signal_group(child.proc.pid, signal.SIGCONT)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        alive = [c for c in children if group_alive(c.proc)]
        if not alive:
            break
        if len(signals.received) > signals_before:
            log("second signal: killing every task now")
            break
        time.sleep(0.05)
    else:
        stuck = [c for c in children if group_alive(c.proc)]
        if stuck:
            log(
                f"{names(stuck)} still running {grace_s:g} s after SIGTERM; "
                "sending SIGKILL"
            )
    kill_children(children)
    for child in children:
        child.reader.join(timeout=2.0)
        if not child.reader.is_alive():
            child.proc.stdout.close()


def kill_children(children: list[Child]) -> None:
    """SIGKILL every child's process group and wait (up to 5 s) until they
    are gone."""
    for child in children:
        signal_group(child.proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    for child in children:
        try:
            child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    while time.monotonic() < deadline and any(group_alive(c.proc) for c in children):
        time.sleep(0.02)
