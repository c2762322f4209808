"""Where a PSStrategy's replicas, inputs and parameters are: one host or a cluster.

A `Topology` is what `PSExtended` needs to know about the machines (its
`mode` is how the processes are laid out; which execution mode trains on
them is `keras_psdist.modes`):

| mode       | replicas                          | parameters        | input pipelines      |
|------------|-----------------------------------|-------------------|----------------------|
| `local`    | this process's GPUs, else CPUs    | host CPU (or GPU) | this process         |
| `in-graph` | every worker task's GPUs, else    | every ps task's   | one per worker task, |
|            | its CPU, driven by this client    | CPU               | on that worker       |
| `between-graph` | this worker task's GPUs, else CPU | every ps task's | this worker, on its |
|            |                                   | CPU, shared       | shard of the data    |

`connect_in_graph` and `connect_between_graph` join TensorFlow's own gRPC runtime
(`tf.config.experimental_connect_to_cluster`); nothing here speaks a protocol
of its own. It checks, before TensorFlow does, what TensorFlow would turn into
a hang or an opaque abort: tasks that do not answer within `connect_timeout`
seconds, and this task's own port being held by another process.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from keras_psdist import devices as devices_lib
from keras_psdist._tf import context, device_util, without_thread_spinning
from keras_psdist.cluster.config import (
    LAUNCH_MODE_ENV,
    ClusterConfig,
    from_environment,
    from_resolver,
    not_a_resolver,
)
from keras_psdist.cluster.ports import check_port_free, wait_reachable


@dataclasses.dataclass(frozen=True)
class Topology:
    """Devices of a run.

    Attributes:
        mode: `"local"`, `"in-graph"` or `"between-graph"`.
        compute_devices: One replica per device, in replica order.
        parameter_devices: Devices that hold variables.
        input_workers: `(host device, its compute devices)` per input
            pipeline, covering `compute_devices` in order.
        client_device: This process's CPU, by its name in the cluster.
        config: The cluster, or `None` on one host.
    """

    mode: str
    compute_devices: tuple[str, ...]
    parameter_devices: tuple[str, ...]
    input_workers: tuple[tuple[str, tuple[str, ...]], ...]
    client_device: str
    config: ClusterConfig | None = None
    # Between-graph with elastic membership: the most worker processes the
    # run may have (`keras_psdist.cluster.elastic`), which sizes every
    # per-worker structure; else None (the TF_CONFIG's workers).
    max_workers: int | None = None

    @property
    def is_chief(self) -> bool:
        """Whether this process initialises shared state and writes checkpoints."""
        return self.config is None or not self.between_graph or self.config.is_chief

    @property
    def between_graph(self) -> bool:
        """Whether every worker task runs the training script."""
        return self.mode == "between-graph"

    @property
    def reduction_device(self) -> str:
        """Where a step's gradients are combined.

        On one host and in-graph, on the first parameter device, beside the
        variables. Between-graph, each worker combines only its own replicas'
        gradients, so on the worker: its only device, else its host CPU.
        """
        if not self.between_graph:
            return self.parameter_devices[0]
        if len(self.compute_devices) == 1:
            return self.compute_devices[0]
        return self.input_workers[0][0]

    @property
    def step_host(self) -> str | None:
        """Where a step function's own ops run: the ones of no replica and
        no variable (Keras's loop over `steps_per_execution` steps, its
        end-of-data checks), or `None` for the caller's device.

        In-graph across a cluster, the first worker's host: called from the
        chief, each of those ops would pass every step's predicates and
        data between the chief and the workers (about 4 CPU-ms per step on
        the chief); on the first worker they run beside its replicas, as a
        `ClusterCoordinator` runs a function on a worker. Elsewhere the
        caller is where the replicas are.
        """
        if self.mode != "in-graph" or self.config is None:
            return None
        return self.input_workers[0][0]

    @property
    def chief_name(self) -> str:
        """The chief's task, e.g. `"worker:0"`, for messages."""
        if self.config is None:
            return "this process"
        return "chief:0" if self.config.has_chief else "worker:0"

    @property
    def worker_index(self) -> int:
        """This process's index among the processes that train
        (between-graph), else 0."""
        if not self.between_graph:
            return 0
        return _training_tasks(self.config).index(
            (self.config.task_type, self.config.task_id)
        )

    @property
    def num_training_processes(self) -> int:
        """How many processes run the training script."""
        if not self.between_graph:
            return 1
        if self.max_workers is not None:
            return self.max_workers
        return num_training_tasks(self.config)

    @property
    def training_task_names(self) -> tuple[str, ...]:
        """The tasks that run the script, by worker index (`"chief:0"`,
        `"worker:0"`, ...), for messages."""
        if not self.between_graph:
            return ("chief:0",) if self.config is not None else ("this process",)
        if self.max_workers is not None:
            chief = self.config.has_chief
            return ("chief:0",) * chief + tuple(
                f"worker:{i}" for i in range(self.max_workers - chief)
            )
        return training_task_names(self.config)


def num_training_tasks(config: ClusterConfig) -> int:
    """How many tasks run the training script between-graph (chief and workers)."""
    return len(_training_tasks(config))


def training_task_names(config: ClusterConfig) -> tuple[str, ...]:
    """The between-graph training tasks by worker index: `("chief:0",
    "worker:0", ...)` with a chief job, else `("worker:0", "worker:1", ...)`."""
    return tuple(f"{job}:{i}" for job, i in _training_tasks(config))


def local_topology(
    devices: Sequence[str] | None, parameter_devices: Sequence[str] | None
) -> Topology:
    """The one-host topology: replicas on this process's devices."""
    compute = devices_lib.resolve(devices, "devices") or (
        devices_lib.default_compute_devices()
    )
    params = devices_lib.resolve(parameter_devices, "parameter_devices") or (
        devices_lib.default_parameter_devices(compute)
    )
    host = device_util.canonicalize("/device:CPU:0")
    return Topology(
        "local", tuple(compute), tuple(params), ((host, tuple(compute)),), host
    )


def resolve_config(cluster_resolver) -> ClusterConfig | None:
    """The cluster from `cluster_resolver` (see `check_cluster_resolver`),
    else from TF_CONFIG, else `None`."""
    if cluster_resolver is not None:
        if isinstance(cluster_resolver, ClusterConfig):
            return cluster_resolver
        return from_resolver(cluster_resolver)
    return from_environment()


def check_cluster_resolver(cluster_resolver: Any) -> None:
    """Raises `ValueError` unless `cluster_resolver` is `None`, a
    `ClusterConfig` or a cluster resolver (anything with `cluster_spec()`).

    Examples:

    >>> check_cluster_resolver(None)
    >>> check_cluster_resolver("ps:2222")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: `cluster_resolver` must be a tf.distribute.cluster_resolver.ClusterResolver or a keras_psdist.cluster.ClusterConfig. Received: cluster_resolver='ps:2222' (a str). ...
    """
    if cluster_resolver is None or isinstance(cluster_resolver, ClusterConfig):
        return
    if not callable(getattr(cluster_resolver, "cluster_spec", None)):
        raise not_a_resolver(cluster_resolver, "cluster_resolver")


def check_launch_mode(config: ClusterConfig, mode: str, owner: str) -> None:
    """Raises `ValueError` when this process cannot train in `mode`: a task
    other than the chief under in-graph, a ps task under between-graph, or a
    `keras-psdist launch` of the other mode (its processes carry
    `KERAS_PSDIST_LAUNCH_MODE`). The message names what was found and the
    command that would work, in the launcher's words."""
    if config.is_evaluator:
        raise ValueError(
            f"{owner} trains, but this process is the evaluator (TF_CONFIG task "
            "evaluator:0), which trains nothing: it evaluates the chief's "
            "checkpoints. Branch on it before building the strategy: "
            "`if keras_psdist.cluster.is_evaluator(): "
            "keras_psdist.SidecarEvaluator(model, data, checkpoint_dir=...).start()` "
            "(docs/evaluator.md)."
        )
    launched = os.environ.get(LAUNCH_MODE_ENV)
    task = f"{config.task_type}:{config.task_id}"
    if mode == "between-graph" and (
        launched == "in-graph" or config.task_type not in ("worker", "chief")
    ):
        if launched == "in-graph":
            found = (
                f"this process ({task}) was started by `keras-psdist launch` in "
                "its default in-graph mode, which runs the script once, on the "
                "chief, while the worker tasks only serve: "
                + (
                    "it would train alone on "
                    f"1/{num_training_tasks(config)} of the data"
                    if owner.startswith("PSStrategy")
                    else "it would wait for gradients from workers that never send any"
                )
            )
        else:
            found = f"this process is {task}, which cannot run the training script"
        alternative = (
            ", or keep the in-graph launch and use `PSStrategy()` "
            "(mode='in-graph', synchronous steps driven by the chief)"
            if owner.startswith("PSStrategy")
            else ""
        )
        raise ValueError(
            f"{owner} trains between-graph: every worker task runs this script "
            f"and the ps tasks serve. But {found}. Launch it with "
            f"`{launch_command_line(config, 'between-graph')}`{alternative}."
        )
    if mode == "in-graph" and (
        launched == "between-graph" or config.task_type not in (None, "chief")
    ):
        found = f"this process is {task}" + (
            ", started by `keras-psdist launch --mode between-graph`, which "
            "runs the script on every worker task"
            if launched == "between-graph"
            else ", and its TF_CONFIG is a worker's"
        )
        raise ValueError(
            f"{owner} trains in-graph: the script runs once, on the chief, which "
            f"drives every worker task's replicas; ps and worker tasks only "
            f"serve (`keras-psdist serve`). But {found}. Launch it with "
            f"`{launch_command_line(config, 'in-graph')}`, or keep this launch and use "
            "`PSStrategy(mode='between-graph')` (asynchronous updates) or "
            "`SyncReplicaStrategy()` (synchronous updates, backup workers)."
        )


def launch_command_line(config: ClusterConfig, mode: str) -> str:
    """The `keras-psdist launch` command that runs this script in `mode` on a
    cluster the size of `config`'s."""
    # The same replicas: in-graph, one per worker task (the chief only
    # drives them); between-graph, one per task that runs the script.
    num_workers = (
        num_training_tasks(config) if mode == "in-graph" else config.num_workers
    )
    words = ["keras-psdist", "launch"]
    if mode == "between-graph":
        words += ["--mode", "between-graph"]
    words += ["--num-ps", str(max(1, config.num_ps)), "--num-workers", str(num_workers)]
    return " ".join(words) + " -- " + script_command()


def script_command() -> str:
    """This process's command line, as `python script.py args` for messages."""
    argv = list(sys.argv)
    if not argv or argv[0] in ("", "-c", "-"):
        return "python train.py"
    return shlex.join(["python", *argv])


def connect_in_graph(
    config: ClusterConfig,
    devices: Sequence[str] | None,
    parameter_devices: Sequence[str] | None,
    connect_timeout: float,
) -> Topology:
    """Connects this process, the one client (the chief), to the cluster.

    Call `check_launch_mode` first: it says which launch would work when
    this process cannot play the mode's role.

    Args:
        config: The validated cluster, with this process's task.
        devices: Compute devices to use instead of every worker task's GPUs
            (else its CPU), as full names
            (`"/job:worker/replica:0/task:1/device:GPU:0"`).
        parameter_devices: Parameter devices instead of every ps task's CPU.
        connect_timeout: Seconds to wait for every task to accept connections.

    Raises:
        ConnectionError: if a task does not answer within `connect_timeout`.
        OSError: if this task's port is held by another process.
    """
    global _connected_in_graph
    wait_reachable(_targets(config, ("ps", "worker")), connect_timeout)
    key = repr(config.cluster_spec().as_dict())
    if _connected_in_graph is not None and key != _connected_in_graph:
        # A later strategy of this process over other workers (between
        # fits): the connection changes in place, the ps variables stay.
        _change_cluster(config)
    else:
        if _connected_in_graph is None and config.has_chief:
            check_port_free(config.addresses("chief")[0])
        # The pools the workers and ps tasks make for the chief sleep
        # between a step's bursts instead of spinning.
        without_thread_spinning()
        # A ClusterSpec, not the resolver: with a resolver whose master() is
        # local (every TFConfigClusterResolver's), TF silently does nothing.
        tf.config.experimental_connect_to_cluster(
            config.cluster_spec(),
            job_name="chief",
            task_index=0,
            make_master_device_default=False,
        )
    _connected_in_graph = key
    input_workers = []
    for task in range(config.num_workers):
        host = config.device("worker", task)
        input_workers.append((host, tuple(_task_compute_devices("worker", task))))
    return _with_user_devices(
        "in-graph",
        config,
        input_workers,
        devices,
        parameter_devices,
        # The client is `chief:0`, a job TF adds when the cluster has none.
        client="/job:chief/replica:0/task:0/device:CPU:0",
    )


# The cluster this process serves its task of, once connected between-graph:
# a later strategy of the same script (a second run) connects no more (the
# task's server already listens on its port).
_connected_between_graph: tuple | None = None
# The cluster this process's in-graph client is connected to (its spec's
# repr), once connected.
_connected_in_graph: str | None = None


def _change_cluster(config: ClusterConfig) -> None:
    """Connects this in-graph client to `config`'s cluster in place of the
    one it is connected to (`context.update_server_def`): the tasks of both
    keep what they hold (the ps variables), workers are added or dropped.

    Raises:
        ValueError: if the ps tasks or the chief's address differ (they hold
            the run's state and this process's own server), or a worker
            task keeps its index at another address.
    """
    current = context.get_server_def()
    jobs = {job.name: dict(job.tasks) for job in current.cluster.job}
    ps = dict(enumerate(config.addresses("ps")))
    chief = dict(enumerate(config.addresses("chief"))) if config.has_chief else None
    if jobs.get("ps") != ps or (chief is not None and jobs.get("chief") != chief):
        raise ValueError(
            "This process's in-graph client is connected to a cluster with ps "
            f"tasks {jobs.get('ps')} and chief {jobs.get('chief')}; a later "
            "strategy may change the worker tasks (between fits) but not "
            f"those. Received: ps {ps}, chief {chief}. Keep the ps and chief "
            "addresses, or start a new process for another cluster."
        )
    workers = dict(enumerate(config.addresses("worker")))
    moved = {
        k: (jobs["worker"][k], address)
        for k, address in workers.items()
        if k in jobs.get("worker", {}) and jobs["worker"][k] != address
    }
    if moved:
        k, (was, now) = next(iter(moved.items()))
        raise ValueError(
            f"worker:{k} of this process's in-graph client is at {was}; a later "
            f"strategy puts worker:{k} at {now}. TensorFlow names a task by its "
            "index, so a connected client cannot move one: keep each worker's "
            "index and address, add workers at the end and drop them from the "
            "end (or start a new process for another cluster)."
        )
    spec = dict(config.cluster_spec().as_dict())
    spec["chief"] = jobs["chief"]  # TF's own, when the config has none
    server_def = tf.train.ServerDef(
        cluster=tf.train.ClusterSpec(spec).as_cluster_def(),
        job_name="chief",
        task_index=0,
        protocol=current.protocol,
        default_session_config=current.default_session_config,
    )
    context.context().update_server_def(server_def)


def connect_between_graph(
    config: ClusterConfig,
    devices: Sequence[str] | None,
    parameter_devices: Sequence[str] | None,
    connect_timeout: float,
) -> Topology:
    """Connects this worker process to the ps tasks, as one of the clients.

    Args and raises as `connect_in_graph`; `devices` are this task's.
    """
    global _connected_between_graph
    wait_reachable(_targets(config, ("ps",)), connect_timeout)
    # Only the ps tasks and this task: a client creates a context on every
    # task it is told of, so listing the other workers would make each
    # worker wait for, and reach into, all the others.
    jobs = {"ps": dict(enumerate(config.addresses("ps")))}
    jobs[config.task_type] = {config.task_id: config.task_address}
    spec = config.cluster_spec(jobs)
    key = (repr(spec.as_dict()), config.task_type, config.task_id)
    if _connected_between_graph is None:
        check_port_free(config.task_address)
        # The ps tasks' pools for this worker sleep between a step's bursts
        # instead of spinning (they are idle while the worker computes).
        without_thread_spinning()
        tf.config.experimental_connect_to_cluster(
            spec,
            job_name=config.task_type,
            task_index=config.task_id,
            make_master_device_default=True,
        )
        _connected_between_graph = key
    elif _connected_between_graph != key:
        raise ValueError(
            "This process already serves a task of another cluster (its "
            f"first between-graph strategy connected to {_connected_between_graph[0]} "
            f"as {_connected_between_graph[1]}:{_connected_between_graph[2]}); "
            "TensorFlow serves one per process. Received: "
            f"{key[0]} as {config.task_type}:{config.task_id}. Create every "
            "strategy of a script from the same TF_CONFIG (or cluster_resolver)."
        )
    host = config.device(config.task_type, config.task_id)
    compute = tuple(_task_compute_devices(config.task_type, config.task_id))
    return _with_user_devices(
        "between-graph",
        config,
        [(host, compute)],
        devices,
        parameter_devices,
        client=host,
    )


def _with_user_devices(mode, config, input_workers, devices, parameter_devices, client):
    compute = tuple(d for _, ds in input_workers for d in ds)
    if devices is not None:
        chosen = tuple(devices_lib.resolve(devices, "devices"))
        input_workers = [
            (host, tuple(d for d in chosen if _same_task(d, host)))
            for host, _ in input_workers
        ]
        input_workers = [(h, ds) for h, ds in input_workers if ds]
        compute = tuple(d for _, ds in input_workers for d in ds)
        stray = sorted(set(chosen) - set(compute))
        if stray:
            raise ValueError(
                f"`devices` names devices outside the training tasks: {stray}. "
                f"Expected devices of: {[h for h, _ in input_workers]}."
            )
    params = tuple(
        devices_lib.resolve(parameter_devices, "parameter_devices")
        or (config.device("ps", i) for i in range(config.num_ps))
    )
    return Topology(mode, compute, params, tuple(input_workers), client, config)


def _task_compute_devices(job, task):
    """A task's GPUs, else its CPU, as listed by the connected runtime."""
    prefix = f"/job:{job}/replica:0/task:{task}/"
    listed = [
        device_util.canonicalize(d.name)
        for d in tf.config.list_logical_devices()
        if device_util.canonicalize(d.name).startswith(prefix)
    ]
    gpus = [d for d in listed if "/device:GPU:" in d]
    if gpus:
        return gpus
    cpus = [d for d in listed if "/device:CPU:" in d]
    if not cpus:
        raise ConnectionError(
            f"The runtime lists no device of {job}:{task} after connecting. "
            f"Listed: {listed}. Is {job}:{task} running `keras-psdist serve`?"
        )
    return cpus


def _same_task(device, host):
    return device.split("/device:")[0] == host.split("/device:")[0]


def _targets(config, jobs):
    return {
        f"{job}:{i}": address
        for job in jobs
        for i, address in enumerate(config.addresses(job))
    }


def _training_tasks(config):
    return [("chief", 0)] * config.has_chief + [
        ("worker", i) for i in range(config.num_workers)
    ]
