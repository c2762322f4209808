"""`launch`: start the servers, run the training command, stop every process.

Pure process management (no TensorFlow import): pick free ports, start a
`keras-psdist serve` process per server task, run the training command with
TF_CONFIG set for its task, stream every process's output with a `[task]`
prefix, and tear every process down on success, failure, timeout or signal.
Unless asked to be verbose, it leaves out TensorFlow's start-up banner
(`banner.py`), the same few lines from every process that imports TensorFlow.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from keras_psdist.cluster.config import LAUNCH_MODE_ENV, ClusterConfig
from keras_psdist.cluster.launcher.arguments import (
    check_args,
    check_fault_tolerance,
    check_max_workers,
)
from keras_psdist.cluster.launcher.banner import is_tf_banner
from keras_psdist.cluster.launcher.deadline import EXIT_TIMEOUT as EXIT_TIMEOUT
from keras_psdist.cluster.launcher.deadline import Deadline
from keras_psdist.cluster.launcher.discovery import discovery_hook
from keras_psdist.cluster.launcher.elastic_workers import ElasticWorkers
from keras_psdist.cluster.launcher.evaluator_process import EvaluatorProcess
from keras_psdist.cluster.launcher.processes import (
    Child,
    Output,
    PortTaken,
    Signals,
    Stop,
    describe,
    exit_code,
    kill_children,
    names,
    parent_death_signal,
    stop_children,
)
from keras_psdist.cluster.launcher.settings import LaunchSettings, TaskHosts
from keras_psdist.cluster.ports import pick_free_ports, wait_reachable
from keras_psdist.cluster.server import (
    LAUNCH_SECURITY_NOTE,
    NOTE_SAID_ENV,
    PORT_IN_USE_EXIT_CODE,
    READY_LINE,
)

# Exit codes, as shells report them (EXIT_TIMEOUT, 124: `deadline.py`).
EXIT_SIGINT = 128 + signal.SIGINT
EXIT_SIGTERM = 128 + signal.SIGTERM

# What each server task runs (with TF_CONFIG set to its task).
SERVER_COMMAND = (sys.executable, "-m", "keras_psdist", "serve")

# How long children get between SIGTERM and SIGKILL.
GRACE_S = 5.0
# How long the training processes get, once a server died while they train,
# to stop on their own with an error naming it (`cluster.task_loss`) before
# they are stopped.
SERVER_LOSS_GRACE_S = 20.0


# Attempts at starting the servers when a port is taken between picking and
# binding it.
MAX_ATTEMPTS = 3


def launch(
    command: Sequence[str],
    num_ps: int,
    num_workers: int,
    mode: str = "in-graph",
    host: str = "127.0.0.1",
    timeout_s: float | None = None,
    startup_timeout_s: float = 60.0,
    out: TextIO | None = None,
    max_restarts: int = 0,
    max_worker_failures: int = 0,
    verbose: bool = False,
    hosts: TaskHosts | None = None,
    evaluator: bool = False,
    max_workers: int | None = None,
    min_workers: int | None = None,
    host_discovery: Callable[[], Sequence[str]] | str | None = None,
) -> int:
    """Runs `command` on a parameter-server cluster of local processes.

    The cluster gets free ports on `host`. In `"in-graph"` mode the jobs are
    `ps` x `num_ps`, `worker` x `num_workers` and one `chief`: every ps and
    worker task runs `keras-psdist serve`, and `command` runs once, as
    `chief:0`, driving the workers over gRPC. In `"between-graph"` mode the
    jobs are `ps` x `num_ps` and `worker` x `num_workers` (no chief): only the
    ps tasks run servers, and `command` runs once per worker task (its
    TF_CONFIG task is `worker:i`).

    Every process gets this environment plus `TF_CONFIG` for its task,
    `KERAS_PSDIST_LAUNCH_MODE` (`mode`: a strategy of the other mode then
    fails at once, naming the command that works), `PYTHONUNBUFFERED=1`,
    unless set `PYTHONFAULTHANDLER=1` and `TF_CPP_MIN_LOG_LEVEL=2` (`0`
    with `verbose`), and no stdin. Its stdout and stderr are merged and
    written line by line to `out`, prefixed with its task (`[ps:0] ...`,
    `[chief:0] ...`); the launcher's own lines start with `[launch]`.
    Unless `verbose`, the lines of TensorFlow's start-up banner
    (`keras_psdist.cluster.launcher.banner.TF_BANNER`:
    the absl and oneDNN notices, "Could not find cuda drivers", the CPU
    instruction note, cuInit failing for want of a GPU, the
    `GeneratorDatasetOp` note) are left out; each pattern matches a whole
    line exactly, so no other line is hidden.
    Training starts once every server accepts connections; the launcher
    then says, once, that their ports take unauthenticated connections on
    every interface (the servers, which say it when started alone, get
    `KERAS_PSDIST_SECURITY_NOTE_SAID=1` and leave it to the launcher).

    Every child runs in its own session (process group). However `launch`
    ends (success, failure, timeout, SIGINT, SIGTERM), every group gets
    SIGTERM (and SIGCONT, so that a stopped process acts on it), then
    SIGKILL after a grace period of 5 s, and `launch` returns
    once they are gone, processes the children started included. If the
    launcher itself is SIGKILLed, its children still die (`PR_SET_PDEATHSIG`,
    Linux), but what they started does not. A process that moves to a
    session of its own is out of reach either way.

    Args:
        command: The training command, e.g. `["python", "train.py"]`.
        num_ps: Number of parameter-server tasks, >= 1.
        num_workers: Number of worker tasks, >= 1.
        mode: `"in-graph"` or `"between-graph"`. Defaults to `"in-graph"`.
        host: Host (an address of this machine) the tasks' addresses use.
            Defaults to `"127.0.0.1"`. TensorFlow's servers listen on every
            interface whatever this is (see `keras_psdist.cluster.serve`).
        timeout_s: Stop everything and return 124 when training has run this
            many seconds (counted from when the training processes start, so
            that the servers' start-up does not eat into it). Defaults to
            `None` (no limit).
        startup_timeout_s: How long the servers may take to accept
            connections; past it, stop everything and return 1. Defaults to
            60.
        out: Where the output goes. Defaults to `sys.stdout`.
        max_restarts: Between-graph: how many times in all a worker other
            than the chief (worker:0) that fails (exits non-zero, or is
            killed) is started again, with the same TF_CONFIG; it rejoins
            the run by opening the shared variables on the ps tasks.
            Defaults to 0.
        max_worker_failures: Between-graph: how many workers other than the
            chief may fail for good (after any restarts) while the others go
            on, for modes that tolerate it (async, or `SyncReplicaStrategy`
            with backup workers). Each loss is logged. Defaults to 0: the
            first failure stops every task.
        verbose: Show every line of the processes' output, TensorFlow's
            start-up banner included, and let TensorFlow log at its default
            level. Defaults to `False`.
        hosts: Where each task runs, for tasks on hosts of their own (the
            cross-host tests run each task in a network namespace:
            `keras_psdist.testing.hosts.NamespaceHosts.task_hosts`): an
            object with `address(task) -> "host:port"` and
            `command(task, command) -> command` (the command that runs
            `command` on that host), for tasks named `"ps:0"`,
            `"worker:1"`, `"chief:0"`. `host` is then unused, and a server is
            ready when it says so (this machine may not reach its address).
            Defaults to `None`: every task on `host`, on free ports.
        evaluator: Also run `command` as the side-car evaluator (TF_CONFIG
            task `evaluator:0`, outside the training cluster, on idle CPU
            time only: Linux's `SCHED_IDLE`), which evaluates the chief's checkpoints
            (`keras_psdist.SidecarEvaluator`). It does not hold training up:
            if it fails, training goes on (and the exit code is its). When
            every training process has exited 0, the launcher tells it
            training has ended (`KERAS_PSDIST_EVALUATOR_STOP_FILE`) and waits
            for it to evaluate the last checkpoints and exit. Defaults to
            `False`.
        max_workers: Between-graph: workers may join and leave the running
            job, up to this many (`PSStrategy(mode="between-graph")` reads it
            from `KERAS_PSDIST_MAX_WORKERS`, which every training process
            gets; see `keras_psdist.cluster.elastic`). The launcher makes a
            control directory (`KERAS_PSDIST_CONTROL_DIR`, logged at start):
            a file `add-worker` there starts a worker (on a new port, in the
            lowest slot a removed worker freed, else the next task index) and
            `remove-worker-K` asks `worker:K` to
            leave after its current step (its leave file,
            `KERAS_PSDIST_LEAVE_FILE`); a removed worker's exit 0 counts as
            done. Defaults to `None`: the workers are fixed.
        min_workers: With `max_workers`: the fewest workers the job keeps.
            A worker (not the chief) that fails is lost and its slot freed,
            and the job goes on while at least this many train (instead of
            `max_restarts` / `max_worker_failures`); a removal that would
            leave fewer is refused. Defaults to `None`: failures as without
            `max_workers`, removals down to the chief.
        host_discovery: With `max_workers`: a callable returning the hosts
            that may run workers now (`host` or `host:slots` each), or the
            path of a script printing them one per line, polled every 2 s
            (`keras_psdist.cluster.launcher.discovery`): workers are started
            on hosts that appear and asked to leave from hosts that go.
            Defaults to `None`.

    Returns:
        The exit code: in-graph, the chief's; between-graph, 0 if every worker
        still counted exits 0 (workers lost within `max_worker_failures` are
        logged, not counted), else the first non-zero code; then, with
        `evaluator`, the evaluator's if training succeeded. 1 if a server
        fails to start or dies while training runs (the training
        processes then get 20 s to stop on their own, each with an error
        naming it, before they are stopped), 124 on timeout, 130 on
        SIGINT, 143 on SIGTERM; a process killed by signal N counts as
        128 + N.

    Raises:
        ValueError: If an argument is invalid.

    Examples:

    >>> import sys
    >>> code = launch(  # doctest: +SKIP
    ...     [sys.executable, "train.py"], num_ps=1, num_workers=2)
    """
    command, mode = check_args(
        command, num_ps, num_workers, mode, host, timeout_s, startup_timeout_s
    )
    check_fault_tolerance(mode, num_workers, max_restarts, max_worker_failures)
    check_max_workers(
        mode,
        num_workers,
        max_workers,
        min_workers=min_workers,
        host_discovery=host_discovery,
    )
    discover = discovery_hook(host_discovery)
    if hosts is not None and not (
        callable(getattr(hosts, "address", None))
        and callable(getattr(hosts, "command", None))
    ):
        raise TypeError(
            f"hosts must have address(task) and command(task, command) methods "
            f"(e.g. NamespaceHosts.task_hosts(...)), got {hosts!r}."
        )
    settings = LaunchSettings(
        command=tuple(command),
        num_ps=num_ps,
        num_workers=num_workers,
        mode=mode,
        host=host,
        timeout_s=timeout_s,
        startup_timeout_s=startup_timeout_s,
        out=sys.stdout if out is None else out,
        max_restarts=max_restarts,
        max_worker_failures=max_worker_failures,
        verbose=verbose,
        hosts=hosts,
        evaluator=evaluator,
        max_workers=max_workers,
        min_workers=min_workers,
        discover=discover,
    )
    return _Launch(settings)()


class _Launch:
    """One `launch` call: state shared by start-up, monitoring and teardown."""

    def __init__(self, settings: LaunchSettings):
        self.settings = settings
        self.elastic: ElasticWorkers | None = None
        self.temporary: list[str] = []  # directories removed at the end
        self.output = Output(
            settings.out, hide=None if settings.verbose else is_tf_banner
        )
        self.children: list[Child] = []
        self.signals = Signals()
        self.preexec = parent_death_signal()
        self.restarts = 0
        self.lost: list[str] = []  # "worker:1 (SIGKILL (exit code 137))"

    def __call__(self) -> int:
        try:
            with self.signals:
                try:
                    config = self._start_servers()
                    return self._train(config)
                except Stop as stop:
                    self.log(stop.message)
                    return stop.code
                except KeyboardInterrupt:
                    self.log("interrupted; stopping every task")
                    return EXIT_SIGINT
                finally:
                    self._teardown(self.children)
                    for directory in self.temporary:
                        shutil.rmtree(directory, ignore_errors=True)
        except KeyboardInterrupt:  # A second Ctrl-C during teardown.
            kill_children(self.children)
            return EXIT_SIGINT

    def log(self, text: str) -> None:
        self.output.line("launch", text)

    # Start-up.

    def _layout(self) -> ClusterConfig:
        jobs = {"ps": self.settings.num_ps, "worker": self.settings.num_workers}
        if self.settings.mode == "in-graph":
            jobs["chief"] = 1
        if self.settings.hosts is not None:
            return ClusterConfig(
                {
                    job: tuple(
                        self.settings.hosts.address(f"{job}:{i}") for i in range(n)
                    )
                    for job, n in jobs.items()
                }
            )
        ports = iter(pick_free_ports(sum(jobs.values()), self.settings.host))
        return ClusterConfig(
            {
                job: tuple(
                    f"{self.settings.address_host}:{next(ports)}" for _ in range(n)
                )
                for job, n in jobs.items()
            }
        )

    def _server_tasks(self, config: ClusterConfig) -> list[tuple[str, int]]:
        jobs = ("ps", "worker") if self.settings.mode == "in-graph" else ("ps",)
        return [(job, i) for job in jobs for i in range(len(config.addresses(job)))]

    def _training_tasks(self, config: ClusterConfig) -> list[tuple[str, int]]:
        if self.settings.mode == "in-graph":
            return [("chief", 0)]
        return [("worker", i) for i in range(config.num_workers)]

    def _start_servers(self) -> ClusterConfig:
        for attempt in range(1, MAX_ATTEMPTS + 1):
            config = self._layout()
            self._log_layout(config)
            servers = []
            for job, i in self._server_tasks(config):
                servers.append(
                    self._spawn(
                        config.with_task(job, i), list(SERVER_COMMAND), is_server=True
                    )
                )
            try:
                self._wait_for_servers(servers)
                return config
            except PortTaken as e:
                self._teardown(servers)
                self.children = [c for c in self.children if c not in servers]
                if attempt == MAX_ATTEMPTS:
                    raise Stop(
                        1,
                        f"{e} Gave up after {MAX_ATTEMPTS} attempts with new ports. "
                        "Is something on this machine grabbing ports quickly?",
                    ) from None
                self.log(
                    f"{e} Retrying with new ports (attempt {attempt + 1} of "
                    f"{MAX_ATTEMPTS})."
                )
        raise AssertionError("unreachable")

    def _wait_for_servers(self, servers: list[Child]) -> None:
        def check_servers() -> None:
            self.signals.check()
            for child in servers:
                code = child.proc.poll()
                if code == PORT_IN_USE_EXIT_CODE:
                    raise PortTaken(f"{child.name} could not bind its port.")
                if code is not None:
                    raise Stop(
                        1,
                        f"{child.name} (server) exited with {describe(code)} "
                        "during start-up; see its output above. Stopping every "
                        "task.",
                    )

        # Ready means the server said so: its port accepting connections is
        # not enough, as another process may hold it.
        deadline = time.monotonic() + self.settings.startup_timeout_s
        while not all(child.ready.is_set() for child in servers):
            check_servers()
            if time.monotonic() >= deadline:
                waiting = [c for c in servers if not c.ready.is_set()]
                raise Stop(
                    1,
                    f"{names(waiting)} did not report ready within "
                    f"{self.settings.startup_timeout_s:g} s (--startup-timeout); see the "
                    "output above. Stopping every task.",
                )
            time.sleep(0.05)
        try:
            if self.settings.hosts is None:
                wait_reachable(
                    {c.name: c.address for c in servers},
                    max(1.0, deadline - time.monotonic()),
                    poll=check_servers,
                )
        except ConnectionError as e:
            check_servers()  # A server's death explains it better.
            raise Stop(1, f"Servers reported ready but {e}") from None
        self.log("all servers are up")
        ports = [c.address.rsplit(":", 1)[1] for c in servers]
        self.log(
            LAUNCH_SECURITY_NOTE.format(
                ports=f"port{'s' if len(ports) > 1 else ''} {', '.join(ports)}",
                them="them" if len(ports) > 1 else "it",
            )
        )

    def _log_layout(self, config: ClusterConfig) -> None:
        tasks = ", ".join(
            f"{job}:{i}={address}"
            for job, addresses in config.jobs.items()
            for i, address in enumerate(addresses)
        )
        self.log(f"cluster ({self.settings.mode}): {tasks}")

    # Training.

    def _train(self, config: ClusterConfig) -> int:
        deadline = Deadline(self.settings.timeout_s)
        configs = {
            f"{job}:{i}": config.with_task(job, i)
            for job, i in self._training_tasks(config)
        }
        elastic = None
        if self.settings.max_workers:
            elastic = ElasticWorkers(
                config,
                self._temporary_directory("keras-psdist-control-"),
                max_workers=self.settings.max_workers,
                min_workers=self.settings.min_workers,
                discover=self.settings.discover,
                hosts=self.settings.hosts,
                host=self.settings.host,
                address_host=self.settings.address_host,
                spawn=self._start_training_task,
                log=self.log,
            )
        self.elastic = elastic
        trainers = [
            self._start_training_task(
                task_config, None if elastic is None else elastic.env(name)
            )
            for name, task_config in configs.items()
        ]
        servers = [c for c in self.children if c.is_server]
        evaluation = None
        if self.settings.evaluator:
            evaluation = EvaluatorProcess(
                config,
                self._temporary_directory("keras-psdist-evaluator-"),
                spawn=self._start_training_task,
                deadline=deadline,
                check_signals=self.signals.check,
                log=self.log,
            )
        while True:
            self.signals.check()
            if evaluation is not None:
                evaluation.check()
            if elastic is not None:
                elastic.check(trainers, configs)
            # The trainers' codes first, the servers' after: a worker that
            # failed because its ps died is then reported as the ps's loss,
            # the cause (the ps ended before it, so this look sees it gone).
            codes = [child.proc.poll() for child in trainers]
            if all(code == 0 for code in codes):
                lost = f"; lost: {', '.join(self.lost)}" if self.lost else ""
                self.log(
                    f"{names(trainers)} finished (exit code 0){lost}; stopping "
                    "the servers."
                )
                return 0 if evaluation is None else evaluation.finish()
            for child in servers:
                code = child.proc.poll()
                if code is not None:
                    self._after_server_loss(child, code, trainers)
            for i, (child, code) in enumerate(zip(trainers, codes, strict=True)):
                if code in (None, 0):
                    continue
                trainers[i] = self._after_failure(child, code, configs[child.name])
            trainers = [child for child in trainers if child is not None]
            deadline.check()
            time.sleep(0.1)

    def _after_server_loss(
        self, server: Child, code: int, trainers: list[Child]
    ) -> None:
        """A server died while training ran: the training processes get
        `SERVER_LOSS_GRACE_S` to stop on their own (each with an error naming
        the lost task), then every task is stopped."""
        what = f"{server.name} (server) exited with {describe(code)} while training ran"
        self.log(
            f"{what}; waiting up to {SERVER_LOSS_GRACE_S:g} s for the training "
            "processes to stop."
        )
        deadline = time.monotonic() + SERVER_LOSS_GRACE_S
        while any(child.proc.poll() is None for child in trainers):
            self.signals.check()
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        raise Stop(1, f"{what}; stopping every task.")

    def _after_failure(
        self, child: Child, code: int, config: ClusterConfig
    ) -> Child | None:
        """A training process failed: its restart, None if the run goes on
        without it, or `Stop`."""
        what = f"{child.name} exited with {describe(code)}"
        is_chief = child.name in ("chief:0", "worker:0")
        if self.settings.mode == "in-graph" or is_chief:
            raise Stop(exit_code(code), f"{what}; stopping every task.")
        if self.elastic is not None and self.settings.min_workers is not None:
            self.lost.append(what)
            return self.elastic.lose(child, what)
        if self.restarts < self.settings.max_restarts:
            self.restarts += 1
            self.log(
                f"{what}; restarting it (restart {self.restarts}; --max-restarts "
                f"allows {self.settings.max_restarts})."
            )
            self.children.remove(child)
            self._teardown([child])
            return self._start_training_task(config)
        if len(self.lost) < self.settings.max_worker_failures:
            self.lost.append(f"{child.name} ({describe(code)})")
            self.log(
                f"{what}; lost it and going on without it ({len(self.lost)} lost; "
                f"--max-worker-failures allows {self.settings.max_worker_failures})."
            )
            return None
        raise Stop(exit_code(code), f"{what}; stopping every task.")

    def _temporary_directory(self, prefix: str) -> str:
        """A new directory, removed when the launch ends."""
        directory = tempfile.mkdtemp(prefix=prefix)
        self.temporary.append(directory)
        return directory

    def _start_training_task(
        self,
        config: ClusterConfig,
        env: dict[str, str] | None = None,
        idle: bool = False,
    ) -> Child:
        """Runs the training command as `config`'s task, with `env` added to
        its environment (on idle CPU time only, if `idle`)."""
        return self._spawn(
            config,
            list(self.settings.command),
            is_server=False,
            extra_env=env,
            idle=idle,
        )

    def _spawn(
        self,
        config: ClusterConfig,
        command: list[str],
        is_server: bool,
        extra_env: dict[str, str] | None = None,
        idle: bool = False,
    ) -> Child:
        env = dict(os.environ, **(extra_env or {}))
        env["TF_CONFIG"] = json.dumps(config.to_tf_config())
        env["PYTHONUNBUFFERED"] = "1"
        env[LAUNCH_MODE_ENV] = self.settings.mode
        if is_server:
            env[NOTE_SAID_ENV] = "1"
        # A crash (a segfault in TensorFlow) then prints every thread's stack.
        env.setdefault("PYTHONFAULTHANDLER", "1")
        # TensorFlow's log: everything with `verbose`; else the servers' only
        # from errors up, the training processes' from warnings up (a user's
        # setting wins).
        env.setdefault(
            "TF_CPP_MIN_LOG_LEVEL",
            "0" if self.settings.verbose else "2" if is_server else "1",
        )
        name = config.task_name
        # The evaluator has no address (it serves nothing) and runs on this
        # host: it only reads the checkpoints.
        address = None if config.is_evaluator else config.task_address
        if self.settings.hosts is not None and address is not None:
            command = list(self.settings.hosts.command(name, command))
        preexec = self.preexec
        if idle:

            def preexec() -> None:
                if self.preexec is not None:
                    self.preexec()
                idle_priority()

        try:
            proc = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=preexec,
            )
        except OSError as e:
            # 127: the shell's "command not found".
            raise Stop(127, f"cannot start {name} ({' '.join(command)}): {e}") from None
        ready = threading.Event()
        # READY_LINE up to the pid, which a wrapper around the server may change.
        ready_prefix = READY_LINE.partition(" (pid")[0].format(
            name=name, address=address
        )

        def on_line(text: str) -> None:
            if is_server and text.startswith(ready_prefix):
                ready.set()

        reader = threading.Thread(
            target=self.output.copy,
            args=(name, proc.stdout, on_line),
            name=f"keras-psdist-launch-{name}",
            daemon=True,
        )
        reader.start()
        child = Child(name, address, proc, reader, is_server, ready)
        self.children.append(child)
        self.log(f"{name} pid {proc.pid}: {' '.join(command)}")
        return child

    # Teardown.

    def _teardown(self, children: list[Child]) -> None:
        stop_children(children, self.signals, self.log, GRACE_S)


def idle_priority() -> None:
    """This process runs only when a CPU would otherwise idle (Linux's
    `SCHED_IDLE`; elsewhere the lowest `nice`, 19): the evaluator then takes
    no CPU time the training processes on the same machine want."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)
