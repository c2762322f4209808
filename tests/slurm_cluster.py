"""A real one-node Slurm cluster for the tests: the daemons of Debian's
`munge`, `slurmctld` and `slurmd` packages (with `slurm-client`'s srun)
started on this machine, as root, and torn down after.

    reason = slurm_cluster.unavailable()  # None, or why it cannot run here
    with slurm_cluster.SlurmCluster() as slurm:
        code, output = slurm.srun(["--ntasks", "2", "hostname"], timeout_s=60)

Everything lives in a fresh directory with its own munge key and socket, its
own `slurm.conf` (handed to Slurm's commands as `SLURM_CONF`) and free ports:
it touches neither /etc/munge nor /etc/slurm nor a Slurm already running here.
The directory is under /tmp, not pytest's `tmp_path`, because munge's and
slurmd's unix sockets live in it and a socket's path must fit in 108 bytes.

The configuration is the least that runs in a container without systemd or
cgroups: processes are tracked by their parents (`proctrack/linuxproc`), no
task plugin, no accounting, no MPI. The node (this machine's short host name,
at 127.0.0.1) has this machine's CPUs; a step with more tasks than CPUs needs
`srun --overcommit` (else Slurm queues it for ever).

On leaving the `with` block every process the cluster started is ended: the
daemons, and whatever a step left (slurmstepd and its tasks, found by the
`SLURM_CONF` in their environment), then the directory is removed.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from keras_psdist.cluster import pick_free_ports

# The commands a cluster needs, and the Debian packages that hold them.
COMMANDS = {
    "munged": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    **{c: "slurm-client" for c in ("srun", "sinfo", "squeue", "scancel", "scontrol")},
}

# How long the daemons get to come up, and to stop on SIGTERM.
START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 10

SLURM_CONF = """\
ClusterName=kpdtest
SlurmctldHost={node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge.socket
StateSaveLocation={dir}/ctld
SlurmdSpoolDir={dir}/slurmd
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
# No cgroups in a container: track a step's processes by their parents.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
ReturnToService=2
KillWait=5
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


def unavailable() -> str | None:
    """Why a cluster cannot be started here (a sentence naming the fix), or
    None if it can."""
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    if missing:
        packages = sorted({COMMANDS[c] for c in missing})
        return (
            f"no {', '.join(missing)} on PATH: install Debian's "
            f"{', '.join(packages)} (.ci/install-system-packages does)"
        )
    if os.geteuid() != 0:
        return "Slurm's daemons run as root here (SlurmUser=root); run as root"
    return None


def free_port_run(n: int) -> int:
    """A free port of 127.0.0.1 whose next `n - 1` ports are free too: where
    `keras-psdist slurm --port` puts a node's `n` tasks."""
    for _ in range(50):
        (base,) = pick_free_ports(1)
        sockets = []
        try:
            for port in range(base, base + n):
                sockets.append(socket.socket())
                sockets[-1].bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError(f"Found no {n} consecutive free ports in 50 tries.")


def node_name() -> str:
    """The node's name: this machine's short host name (`hostname -s`), which
    slurmd answers to and Slurm's step environment lists."""
    return socket.gethostname().split(".")[0]


class SlurmCluster:
    """munged, slurmctld and slurmd on this machine; see the module's doc."""

    def __init__(self) -> None:
        self.node = node_name()
        self.dir = ""
        self.env: dict[str, str] = {}
        self._daemons: list[tuple[str, subprocess.Popen]] = []

    def __enter__(self) -> SlurmCluster:
        reason = unavailable()
        if reason:
            raise RuntimeError(f"Cannot start a Slurm cluster: {reason}.")
        try:
            socket.gethostbyname(self.node)
        except OSError as e:
            raise RuntimeError(
                f"This machine's host name {self.node!r} does not resolve ({e}); "
                "Slurm's step lists its node by that name. Add it to /etc/hosts."
            ) from None
        self.dir = tempfile.mkdtemp(prefix="kpd-slurm-")
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        if any(name == "slurmctld" for name, _ in self._daemons):
            self.cancel_jobs()
        for _, process in reversed(self._daemons):
            _end(process.pid)
        for _, process in reversed(self._daemons):
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _end(process.pid, signal.SIGKILL)
                process.wait()
        # A step's slurmstepd (a session of its own) and its tasks outlive
        # slurmd when a test fails mid-step.
        for pid in self._leftover_pids():
            _end(pid, signal.SIGKILL)
        self._daemons.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def srun(self, args: list[str], timeout_s: float) -> tuple[int, str]:
        """Runs `srun *args` (a job step of its own allocation) and returns
        its exit code and its output (the tasks' stdout and stderr).

        Raises:
            TimeoutError: If the step has not ended after `timeout_s`; srun is
                killed (which ends the step), the message holds its output.
        """
        process = subprocess.Popen(
            ["srun", *args],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # Killing srun alone would leave the step's tasks running.
            self.cancel_jobs()
            _end(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            raise TimeoutError(
                f"srun {' '.join(args)} did not end in {timeout_s} s. Its output:\n"
                f"{output[-6000:]}\n{self.logs()}"
            ) from None
        return process.returncode, output

    def cancel_jobs(self) -> None:
        """Cancels every job of this cluster (all are the caller's) and waits
        up to `STOP_TIMEOUT_S` for them to leave the queue."""
        self._run(["scancel", "--partition", "test"])
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while self._run(["squeue", "-h", "-o", "%i"]).strip():
            if time.monotonic() > deadline:
                return
            time.sleep(0.2)

    def logs(self, last_chars: int = 3000) -> str:
        """The end of every daemon's log, for a failure message."""
        parts = []
        for name in ("munged", "slurmctld", "slurmd"):
            path = os.path.join(self.dir, f"{name}.log")
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    parts.append(f"--- {name}.log ---\n{f.read()[-last_chars:]}")
        return "\n".join(parts)

    def _start(self) -> None:
        for sub in ("ctld", "slurmd"):
            os.mkdir(os.path.join(self.dir, sub))
        key = os.path.join(self.dir, "munge.key")
        with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(os.urandom(1024))
        ctld_port, slurmd_port = pick_free_ports(2)
        conf = os.path.join(self.dir, "slurm.conf")
        with open(conf, "w") as f:
            f.write(
                SLURM_CONF.format(
                    node=self.node,
                    dir=self.dir,
                    ctld_port=ctld_port,
                    slurmd_port=slurmd_port,
                    cpus=os.cpu_count() or 1,
                )
            )
        # Not the caller's own allocation, if this runs inside a Slurm job.
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "SRUN_", "SBATCH_", "SALLOC_"))
        }
        self.env["SLURM_CONF"] = conf

        socket_path = os.path.join(self.dir, "munge.socket")
        # --force: the directory's parents (/tmp) are writable by others.
        self._daemon(
            "munged",
            ["munged", "--foreground", "--force", f"--key-file={key}"]
            + [f"--socket={socket_path}"]
            + [f"--{k}-file={self.dir}/munged.{k}" for k in ("pid", "seed")]
            + [f"--log-file={self.dir}/munged.log"],
        )
        self._wait("munged's socket", lambda: os.path.exists(socket_path))
        self._daemon("slurmctld", ["slurmctld", "-D", "-i", "-f", conf])
        self._wait("slurmctld", lambda: "UP" in self._run(["scontrol", "ping"]))
        self._daemon("slurmd", ["slurmd", "-D", "-N", self.node, "-f", conf])
        self._wait(
            f"node {self.node} to be idle",
            lambda: (
                self._run(["sinfo", "-h", "-n", self.node, "-o", "%T"]).strip()
                == "idle"
            ),
        )

    def _daemon(self, name: str, command: list[str]) -> None:
        with open(os.path.join(self.dir, f"{name}.out"), "w") as out:
            self._daemons.append(
                (
                    name,
                    subprocess.Popen(
                        command,
                        env=self.env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    ),
                )
            )

    def _run(self, command: list[str]) -> str:
        try:
            return subprocess.run(
                command, env=self.env, capture_output=True, text=True, timeout=10
            ).stdout
        except subprocess.TimeoutExpired:
            return ""

    def _wait(self, what: str, ready) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            dead = [n for n, p in self._daemons if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                outputs = []
                for name, _ in self._daemons:
                    with open(os.path.join(self.dir, f"{name}.out")) as f:
                        outputs.append(f"--- {name}'s output ---\n{f.read()[-3000:]}")
                raise RuntimeError(
                    f"Waiting for {what}: "
                    + (f"{', '.join(dead)} exited" if dead else "timed out")
                    + ".\n"
                    + "\n".join(outputs)
                    + "\n"
                    + self.logs()
                )
            time.sleep(0.2)

    def _leftover_pids(self) -> list[int]:
        if "SLURM_CONF" not in self.env:
            return []
        mark = f"SLURM_CONF={self.env['SLURM_CONF']}".encode()
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if mark in f.read().split(b"\0"):
                        pids.append(int(entry))
            except OSError:
                continue
        return pids


def _end(pid: int, sig: int = signal.SIGTERM) -> None:
    """Sends `sig` to `pid`'s process group (its session: every process here
    starts one), else to `pid` alone."""
    try:
        os.killpg(pid, sig)
    except OSError:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
