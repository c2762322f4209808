"""The cluster of a Slurm job step: which task each rank is.

Inside an allocation, `srun` starts one process per Slurm task on the
allocated nodes. `keras-psdist slurm` (run by `srun` on every rank) reads the
step from Slurm's environment, as TensorFlow's `SlurmClusterResolver` does,
gives each rank its task and runs it: a server (`keras-psdist serve`) or the
training command, with `TF_CONFIG` set::

    srun --nodes 3 --ntasks-per-node 2 \\
        keras-psdist slurm --num-ps 2 --mode between-graph -- python train.py

Ranks are tasks in order: in-graph, rank 0 is the chief, then the ps tasks,
then the workers; between-graph, the ps tasks, then the workers (the first
worker is the chief). A task listens on its node at `port` plus its index
among the node's tasks. Slurm's default block distribution (a node's ranks
are consecutive) is assumed; another is refused, naming the fix.

This module does not import TensorFlow.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from keras_psdist.cluster.config import LAUNCH_MODE_ENV, ClusterConfig
from keras_psdist.cluster.mode_names import IN_GRAPH
from keras_psdist.cluster.ports import connect_error

# A server task stops once the training tasks, seen up, have all been gone
# this long (Slurm's step ends only when every rank has exited): longer than
# a live training process can stay out of reach and go on, its default
# `heartbeat_timeout` (30 s) plus its server watch's looks (about 6 s,
# `task_loss.exit_within`).
TRAINING_GONE_S = 40.0
# ... or once no training task has come up this long after it started
# (else it would serve until the allocation ends): room for a slow start,
# as the workers' `init_timeout` (120 s) waits for the chief, several times.
TRAINING_NEVER_S = 600.0

# Where TensorFlow's SlurmClusterResolver starts too.
DEFAULT_PORT = 8888


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compressed host list, expanded in order.

    Examples:

    >>> expand_hostlist("n[1-2],m5,o[03-04,7]")
    ['n1', 'n2', 'm5', 'o03', 'o04', 'o7']
    """
    parts, depth, current = [], 0, ""
    for c in hostlist:
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += c
    parts.append(current)
    hosts = []
    for part in parts:
        match = re.fullmatch(r"([^\[\],]+)(?:\[([0-9,\-]+)\])?(.*)", part)
        if match is None or match.group(3) or depth != 0:
            raise ValueError(
                f"Cannot read Slurm's host list {hostlist!r} (at {part!r}): "
                "expected names like node1 or node[1-3,7]."
            )
        prefix, ranges = match.group(1), match.group(2)
        if ranges is None:
            hosts.append(prefix)
            continue
        for item in ranges.split(","):
            first, _, last = item.partition("-")
            last = last or first
            if not (first.isdigit() and last.isdigit()) or int(last) < int(first):
                raise ValueError(
                    f"Cannot read Slurm's host list {hostlist!r}: bad range "
                    f"{item!r} in {part!r}."
                )
            hosts += [
                f"{prefix}{str(i).zfill(len(first))}"
                for i in range(int(first), int(last) + 1)
            ]
    return hosts


def expand_tasks_per_node(value: str) -> list[int]:
    """Slurm's tasks-per-node list, one count per node.

    Examples:

    >>> expand_tasks_per_node("3(x2),2,1")
    [3, 3, 2, 1]
    """
    counts = []
    for part in value.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            raise ValueError(
                f"Cannot read Slurm's tasks per node {value!r} (at {part!r}): "
                "expected e.g. 2(x3),1."
            )
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def from_slurm(
    num_ps: int,
    mode: str = IN_GRAPH,
    port: int = DEFAULT_PORT,
    environ: Mapping[str, str] | None = None,
) -> ClusterConfig:
    """This rank's task in the cluster of the Slurm job step `environ` describes.

    Args:
        num_ps: How many of the step's tasks are parameter servers.
        mode: `"in-graph"` (rank 0 the chief) or `"between-graph"`.
        port: The port of a node's first task; its others use the next ones.
        environ: Slurm's environment. Defaults to `os.environ`.

    Raises:
        ValueError: If Slurm's environment is missing or unreadable, or the
            step has too few tasks; the message names what and the fix.

    Examples:

    >>> env = {"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "4",
    ...        "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}
    >>> config = from_slurm(num_ps=1, mode="between-graph", environ=env)
    >>> config.task_name, config.task_address, config.addresses("ps")
    ('worker:2', 'node2:8889', ('node1:8888',))
    """
    env = os.environ if environ is None else environ

    def read(*names: str) -> str:
        for name in names:
            if env.get(name):
                return env[name]
        raise ValueError(
            f"Slurm's {' or '.join(names)} is not set: run this under `srun` "
            "inside an allocation (e.g. `srun --ntasks 3 keras-psdist slurm "
            "--num-ps 1 -- python train.py`)."
        )

    rank = int(read("SLURM_PROCID"))
    hosts = expand_hostlist(read("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"))
    counts = expand_tasks_per_node(
        read("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    )
    if len(counts) != len(hosts):
        raise ValueError(
            f"Slurm lists {len(hosts)} node(s) ({', '.join(hosts)}) but tasks "
            f"per node for {len(counts)} ({counts}): the environment is not "
            "one job step's."
        )
    distribution = env.get("SLURM_DISTRIBUTION", "block")
    if not distribution.startswith("block"):
        raise ValueError(
            f"keras-psdist slurm needs the block distribution (a node's ranks "
            f"consecutive, Slurm's default). Received: SLURM_DISTRIBUTION="
            f"{distribution!r}. Run `srun --distribution=block ...`."
        )
    addresses = [
        f"{host}:{port + i}"
        for host, n in zip(hosts, counts, strict=True)
        for i in range(n)
    ]
    total = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or 0)
    if total and total != len(addresses):
        raise ValueError(
            f"Slurm's step has {total} tasks but its nodes list "
            f"{len(addresses)} ({counts} on {', '.join(hosts)})."
        )
    chiefs = 1 if mode == IN_GRAPH else 0
    workers = len(addresses) - chiefs - num_ps
    if num_ps < 1 or workers < 1:
        raise ValueError(
            f"A parameter-server cluster needs at least one ps and one worker "
            f"task{' besides the chief' if chiefs else ''}: the step has "
            f"{len(addresses)} task(s) and --num-ps {num_ps}. Ask srun for "
            f"{chiefs + max(num_ps, 1) + 1} or more tasks, or fewer ps."
        )
    if not 0 <= rank < len(addresses):
        raise ValueError(
            f"SLURM_PROCID={rank} is outside the step's {len(addresses)} tasks."
        )
    jobs = {}
    if chiefs:
        jobs["chief"] = addresses[:1]
    jobs["ps"] = addresses[chiefs : chiefs + num_ps]
    jobs["worker"] = addresses[chiefs + num_ps :]
    task_type, first = "worker", chiefs + num_ps
    if rank < chiefs:
        task_type, first = "chief", 0
    elif rank < chiefs + num_ps:
        task_type, first = "ps", chiefs
    return ClusterConfig(jobs, task_type, rank - first)


def training_job(mode: str) -> str:
    """The job that runs the training command: the chief in-graph, the
    workers between-graph (the others serve)."""
    return "chief" if mode == IN_GRAPH else "worker"


def run_task(
    config: ClusterConfig,
    mode: str,
    command: Sequence[str],
    *,
    gone_s: float = TRAINING_GONE_S,
    never_s: float = TRAINING_NEVER_S,
) -> int:
    """Runs this rank's task: the training command (replacing this process),
    or `keras-psdist serve` until the training tasks have come and gone.

    Args:
        config: This rank's task.
        mode: The run's mode.
        command: The training command.
        gone_s: A server stops once the training tasks, seen up, have all
            been gone this long. Defaults to `TRAINING_GONE_S`.
        never_s: A server stops once no training task has come up this long
            after it started. Defaults to `TRAINING_NEVER_S`.

    Returns:
        The server's exit code: 0 when it was stopped because training
        ended, 1 when no training task ever came up.
    """
    env = dict(
        os.environ,
        TF_CONFIG=json.dumps(config.to_tf_config()),
        **{LAUNCH_MODE_ENV: mode},
    )
    if config.task_type == training_job(mode):
        print(f"[slurm] {config.task_name}: {' '.join(command)}", flush=True)
        os.execvpe(command[0], list(command), env)
    print(f"[slurm] {config.task_name}: serving at {config.task_address}", flush=True)
    server = subprocess.Popen([sys.executable, "-m", "keras_psdist", "serve"], env=env)
    try:
        return _serve_while_training(server, config, mode, gone_s, never_s)
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()


def _serve_while_training(
    server, config: ClusterConfig, mode: str, gone_s: float, never_s: float
) -> int:
    addresses = config.addresses(training_job(mode))
    started = time.monotonic()
    seen, gone_since = False, None
    while server.poll() is None:
        if any(connect_error(address, 0.5) is None for address in addresses):
            seen, gone_since = True, None
        elif seen:
            gone_since = gone_since or time.monotonic()
            if time.monotonic() - gone_since > gone_s:
                print(
                    f"[slurm] {config.task_name}: the training tasks have ended; "
                    f"stopping the server (none has answered for {gone_s:g} s).",
                    flush=True,
                )
                return 0
        elif time.monotonic() - started > never_s:
            print(
                f"[slurm] {config.task_name}: no training task came up within "
                f"{never_s:g} s ({', '.join(addresses)}); stopping the server. "
                "Did the training command start on the worker ranks? A slower "
                "start needs a larger `--serve-start-timeout`.",
                flush=True,
            )
            return 1
        time.sleep(min(1.0, gone_s / 5, never_s / 5))
    return server.returncode
