"""The cluster a process belongs to: TF_CONFIG parsing and validation.

A cluster has a `ps` job and a `worker` job, and optionally one `chief` task
(the in-graph client). Addresses are `"host:port"`; a task's index is its
position in its job's list. TF_CONFIG uses the layout every TensorFlow
cluster resolver and Kubernetes operator uses:

    {"cluster": {"ps": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222"]},
     "task": {"type": "worker", "index": 0}}

This module does not import TensorFlow at import time (only
`ClusterConfig.cluster_spec` and `from_resolver` use it), so the command line
can reject a bad TF_CONFIG without paying for a TensorFlow import.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from keras_psdist.cluster.ports import split_address

# Set by `keras-psdist launch` in every process it starts: how it launched
# them (`in-graph` or `between-graph`), so that a strategy of the other mode
# fails at once instead of training on a share of the data, or waiting for
# workers that only serve.
LAUNCH_MODE_ENV = "KERAS_PSDIST_LAUNCH_MODE"
# Set by `keras-psdist launch --evaluator` in the evaluator's environment: a
# file the launcher creates once every training task has ended
# (`keras_psdist.SidecarEvaluator` then evaluates what is left and returns).
EVALUATOR_STOP_FILE_ENV = "KERAS_PSDIST_EVALUATOR_STOP_FILE"
# Elastic membership (`keras-psdist launch --max-workers`,
# `keras_psdist.cluster.elastic`): the most workers of the job, the
# launcher's control directory, and the file that asks a worker to leave.
MAX_WORKERS_ENV = "KERAS_PSDIST_MAX_WORKERS"
CONTROL_DIR_ENV = "KERAS_PSDIST_CONTROL_DIR"
LEAVE_FILE_ENV = "KERAS_PSDIST_LEAVE_FILE"

# Job names in the order they are listed.
JOB_NAMES = ("chief", "ps", "worker")

# The task that evaluates the chief's checkpoints (`keras_psdist.evaluator`).
# It is no part of the training cluster (it serves nothing and no task
# connects to it), as in TensorFlow's convention: a TF_CONFIG may list it in
# "cluster" (one address, unused) or not at all.
EVALUATOR = "evaluator"

_DEFAULT_SOURCE = "ClusterConfig"


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """A validated cluster layout and, optionally, which task this process is.

    Args:
        jobs: Job name (`"ps"`, `"worker"` or `"chief"`) -> task addresses
            (`"host:port"`); a task's index is its position in the sequence.
            Needs at least one `ps` and one `worker` task, at most one `chief`.
        task_type: This process's job, or `None` for a process outside the
            cluster (e.g. a launcher). Defaults to `None`.
        task_id: This process's index within `task_type`. Defaults to `None`.

    Raises:
        ValueError: If the layout or the task is invalid; the message says
            what was received and how to fix it.

    Examples:

    >>> config = ClusterConfig(
    ...     {"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]},
    ...     task_type="worker",
    ...     task_id=0,
    ... )
    >>> config.task_address, config.num_ps, config.is_chief
    ('127.0.0.1:2223', 1, True)
    >>> config.device("ps", 0)
    '/job:ps/replica:0/task:0/device:CPU:0'
    >>> from_tf_config(config.to_tf_config()) == config
    True
    """

    jobs: Mapping[str, tuple[str, ...]]
    task_type: str | None = None
    task_id: int | None = None

    def __post_init__(self):
        jobs = _validate(self.jobs, self.task_type, self.task_id, _DEFAULT_SOURCE)
        object.__setattr__(self, "jobs", jobs)

    def __hash__(self) -> int:
        return hash((tuple(self.jobs.items()), self.task_type, self.task_id))

    def addresses(self, job: str) -> tuple[str, ...]:
        """The addresses of `job`'s tasks, `()` when the cluster has no such job."""
        return self.jobs.get(job, ())

    @property
    def task_address(self) -> str:
        """This task's `"host:port"`.

        Raises:
            ValueError: If the config has no task.
        """
        self._require_task("task_address")
        if self.is_evaluator:
            raise ValueError(
                "The evaluator task has no address: it is outside the training "
                "cluster and serves nothing. Received: task evaluator:0."
            )
        return self.jobs[self.task_type][self.task_id]

    @property
    def task_name(self) -> str:
        """This task as `"job:index"`, e.g. `"ps:0"`."""
        self._require_task("task_name")
        return f"{self.task_type}:{self.task_id}"

    @property
    def num_ps(self) -> int:
        return len(self.addresses("ps"))

    @property
    def num_workers(self) -> int:
        return len(self.addresses("worker"))

    @property
    def has_chief(self) -> bool:
        return bool(self.addresses("chief"))

    @property
    def is_evaluator(self) -> bool:
        """Whether this process is the side-car evaluator (TF_CONFIG task
        `{"type": "evaluator", "index": 0}`): it trains nothing, it evaluates
        the chief's checkpoints (`keras_psdist.SidecarEvaluator`)."""
        return self.task_type == EVALUATOR

    @property
    def is_chief(self) -> bool:
        """Whether this task is the chief: `chief:0` if the cluster has a chief
        job, else `worker:0` (TensorFlow's convention)."""
        chief = ("chief", 0) if self.has_chief else ("worker", 0)
        return (self.task_type, self.task_id) == chief

    def device(self, job: str, task: int, kind: str = "CPU", index: int = 0) -> str:
        """The full device name of device `kind:index` on task `job:task`.

        Raises:
            ValueError: If the cluster has no such task.
        """
        _check_task(self.jobs, job, task, _DEFAULT_SOURCE)
        return f"/job:{job}/replica:0/task:{task}/device:{kind}:{index}"

    def with_task(self, task_type: str | None, task_id: int | None) -> ClusterConfig:
        """A copy of this config for task `task_type:task_id` (validated)."""
        return ClusterConfig(self.jobs, task_type, task_id)

    def to_tf_config(self) -> dict[str, Any]:
        """The TF_CONFIG dict (`json.dumps` it for the environment variable).

        `"task"` is left out when the config has no task.
        """
        value: dict[str, Any] = {
            "cluster": {job: list(addresses) for job, addresses in self.jobs.items()}
        }
        if self.task_type is not None:
            value["task"] = {"type": self.task_type, "index": self.task_id}
        return value

    def cluster_spec(self, jobs: Mapping[str, Iterable[int] | None] | None = None):
        """The cluster as a `tf.train.ClusterSpec` (imports TensorFlow).

        Args:
            jobs: Restrict the spec to these jobs: job name -> the tasks to
                keep, as indices or as an `{index: address}` dict (whose
                addresses must match this config's), or `None` for all of the
                job's tasks. A restricted job keeps its tasks' real indices (a
                sparse spec), which is how a between-graph worker sees
                `{ps, itself}`. Defaults to `None`, the whole cluster.

        Raises:
            ValueError: If `jobs` names a job or task the cluster lacks, or
                gives a task another address.

        Examples:

        >>> config = ClusterConfig(
        ...     {"ps": ["127.0.0.1:2222"], "worker": ["h:1", "h:2"]})
        >>> config.cluster_spec({"ps": None, "worker": [1]}).as_dict()
        {'ps': ['127.0.0.1:2222'], 'worker': {1: 'h:2'}}
        """
        import tensorflow as tf

        if jobs is None:
            return tf.train.ClusterSpec(
                {job: list(addresses) for job, addresses in self.jobs.items()}
            )
        spec: dict[str, Any] = {}
        for job, tasks in jobs.items():
            if job not in self.jobs:
                raise ValueError(
                    f"Cannot restrict the cluster spec to job {job!r}: the cluster "
                    f"has jobs {_list(self.jobs)}. Received: jobs={dict(jobs)!r}"
                )
            if tasks is None:
                spec[job] = list(self.jobs[job])
                continue
            spec[job] = {}
            for task in tasks:
                _check_task(self.jobs, job, task, _DEFAULT_SOURCE)
                address = self.jobs[job][task]
                if isinstance(tasks, Mapping) and tasks[task] != address:
                    raise ValueError(
                        f"Cannot restrict the cluster spec: {job}:{task} is at "
                        f"{address!r} in this cluster. Received: {tasks[task]!r}"
                    )
                spec[job][task] = address
        return tf.train.ClusterSpec(spec)

    def _require_task(self, what: str) -> None:
        if self.task_type is None:
            raise ValueError(
                f"`{what}` needs this process's task, but the cluster config has "
                'none. Set TF_CONFIG\'s "task" (e.g. {"type": "ps", "index": 0}) '
                "or call `with_task(task_type, task_id)`."
            )


def from_tf_config(value: str | Mapping, source: str = "TF_CONFIG") -> ClusterConfig:
    """Parses and validates a TF_CONFIG value (a JSON string or a dict).

    Args:
        value: The TF_CONFIG JSON text, or the decoded dict.
        source: Where `value` came from, named in error messages. Defaults to
            `"TF_CONFIG"`.

    Returns:
        The `ClusterConfig`; `task_type` is `None` when there is no `"task"`.

    Raises:
        ValueError: If `value` is not valid JSON or not a valid cluster; the
            message names `source`, what was received and the fix.

    Examples:

    >>> config = from_tf_config(
    ...     '{"cluster": {"ps": ["h:2222"], "worker": ["h:2223"]},'
    ...     ' "task": {"type": "ps", "index": 0}}')
    >>> config.task_type, config.task_id, config.addresses("worker")
    ('ps', 0, ('h:2223',))
    """
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{source} is not valid JSON ({e}). Received: {_short(value)}. "
                f'Expected e.g. {{"cluster": {{"ps": ["host:2222"], "worker": '
                f'["host:2223"]}}, "task": {{"type": "worker", "index": 0}}}}'
            ) from None
    if not isinstance(value, Mapping):
        raise ValueError(
            f'{source} must be a JSON object with a "cluster" key. Received: '
            f"{_short(value)}"
        )
    if "cluster" not in value:
        raise ValueError(
            f'{source} has no "cluster": it needs the address of every task, e.g. '
            '"cluster": {"ps": ["host:2222"], "worker": ["host:2223"]}. '
            f"Received: {_short(value)}"
        )
    task = value.get("task") or {}
    if not isinstance(task, Mapping):
        raise ValueError(
            f'{source}\'s "task" must be an object like {{"type": "worker", '
            f'"index": 0}}. Received: "task": {_short(task)}'
        )
    task_type = task.get("type")
    task_id = task.get("index")
    if task and task_type is None:
        raise ValueError(
            f'{source}\'s "task" has no "type": set it to one of the cluster\'s '
            f'jobs, e.g. {{"type": "worker", "index": 0}}. Received: "task": '
            f"{_short(task)}"
        )
    if task_type is not None and task_id is None:
        raise ValueError(
            f'{source}\'s "task" has no "index": set it to this task\'s position '
            f'in its job, e.g. {{"type": "{task_type}", "index": 0}}. Received: '
            f'"task": {_short(task)}'
        )
    jobs = _validate(value["cluster"], task_type, task_id, source)
    return ClusterConfig(jobs, task_type, task_id)


def from_environment(environ: Mapping[str, str] = os.environ) -> ClusterConfig | None:
    """The cluster from the `TF_CONFIG` environment variable.

    Returns:
        The `ClusterConfig`, or `None` when TF_CONFIG is unset, empty or `{}`
        (a single-process run).

    Raises:
        ValueError: If TF_CONFIG is set but invalid.

    Examples:

    >>> from_environment({}) is None
    True
    >>> from_environment(
    ...     {"TF_CONFIG": '{"cluster": {"ps": ["h:1"], "worker": ["h:2"]}}'}
    ... ).num_workers
    1
    """
    text = environ.get("TF_CONFIG", "").strip()
    if not text:
        return None
    try:
        if json.loads(text) == {}:
            return None
    except json.JSONDecodeError:
        pass  # from_tf_config reports it.
    return from_tf_config(text, source="TF_CONFIG")


def is_evaluator(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether TF_CONFIG makes this process the evaluator (`"task": {"type":
    "evaluator", "index": 0}`, as `keras-psdist launch --evaluator` sets it).

    A script run on every task branches on it before building a strategy:
    the evaluator follows the chief's checkpoints instead of training
    (`keras_psdist.SidecarEvaluator`).

    Examples:

    >>> is_evaluator({})
    False
    >>> is_evaluator({"TF_CONFIG": '{"cluster": {"ps": ["h:1"], "worker": ["h:2"]}, '
    ...               '"task": {"type": "evaluator", "index": 0}}'})
    True
    """
    config = from_environment(environ)
    return config is not None and config.is_evaluator


def from_resolver(resolver) -> ClusterConfig:
    """The cluster of any `tf.distribute.cluster_resolver.ClusterResolver`.

    Reads `resolver.cluster_spec().as_dict()` (a job's tasks may be a list or
    an `{index: address}` dict covering every index from 0), `task_type` and
    `task_id`.

    Raises:
        ValueError: If `resolver` is not a cluster resolver, or its cluster
            is not a valid cluster.

    Examples:

    >>> import tensorflow as tf
    >>> resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
    ...     tf.train.ClusterSpec({"ps": ["h:1"], "worker": ["h:2"]}),
    ...     task_type="ps", task_id=0)
    >>> from_resolver(resolver).task_address
    'h:1'
    """
    if not callable(getattr(resolver, "cluster_spec", None)):
        raise not_a_resolver(resolver, "resolver")
    source = f"{type(resolver).__name__}"
    cluster = resolver.cluster_spec().as_dict()
    task_type = getattr(resolver, "task_type", None)
    task_id = getattr(resolver, "task_id", None)
    if task_type is None:
        task_id = None
    jobs = _validate(cluster, task_type, task_id, source)
    return ClusterConfig(jobs, task_type, task_id)


def not_a_resolver(value: Any, what: str) -> ValueError:
    """The error for a `cluster_resolver` (named `what`) that is none: what
    it must be, what was received, and for TF_CONFIG's text or dict, the
    call that reads it."""
    hint = ""
    if isinstance(value, str | Mapping):
        hint = (
            " For TF_CONFIG's JSON (text or dict), pass "
            f"{what}=keras_psdist.cluster.from_tf_config(...); to read the "
            f"TF_CONFIG environment variable, leave {what} out."
        )
    # A strategy's `cluster_resolver` also takes a ClusterConfig.
    config = (
        " or a keras_psdist.cluster.ClusterConfig" if what == "cluster_resolver" else ""
    )
    kind = type(value).__name__
    return ValueError(
        f"`{what}` must be a tf.distribute.cluster_resolver.ClusterResolver"
        f"{config}. Received: {what}={_short(repr(value))} "
        f"({'an' if kind[0] in 'aeiou' else 'a'} {kind}).{hint}"
    )


def _validate(
    cluster: Any, task_type: Any, task_id: Any, source: str
) -> Mapping[str, tuple[str, ...]]:
    """Checks a cluster and task; returns the jobs as an immutable mapping."""
    if not isinstance(cluster, Mapping):
        raise ValueError(
            f'{source}\'s "cluster" must map job names to address lists, e.g. '
            '{"ps": ["host:2222"], "worker": ["host:2223"]}. Received: '
            f"{_short(cluster)}"
        )
    unknown = sorted(str(job) for job in cluster if job not in (*JOB_NAMES, EVALUATOR))
    if unknown:
        raise ValueError(
            f"{source} has unknown job(s) {', '.join(map(repr, unknown))}. "
            f"Expected only: {', '.join(JOB_NAMES)} (and {EVALUATOR!r}, which is "
            "outside the training cluster). Rename or remove them."
        )
    if EVALUATOR in cluster:
        _evaluator_addresses(cluster[EVALUATOR], source)
    jobs = {
        job: _job_addresses(cluster[job], job, source)
        for job in JOB_NAMES
        if job in cluster
    }
    for job in ("ps", "worker"):
        if not jobs.get(job):
            raise ValueError(
                f"{source}'s cluster has no {job!r} tasks: a parameter-server "
                "cluster needs at least one 'ps' and one 'worker' task. Received "
                f"jobs: {_list(jobs) or 'none'}"
            )
    if "chief" in jobs and len(jobs["chief"]) != 1:
        raise ValueError(
            f"{source}'s cluster must have exactly one 'chief' task when it has a "
            f"chief job. Received: {len(jobs['chief'])} ({list(jobs['chief'])}). "
            "Keep one and make the others workers."
        )
    seen: dict[str, str] = {}
    for job, addresses in jobs.items():
        for index, address in enumerate(addresses):
            name = f"{job}:{index}"
            if address in seen:
                raise ValueError(
                    f"{source} gives {seen[address]} and {name} the same address "
                    f"{address!r}. Every task needs its own port."
                )
            seen[address] = name
    if task_type is None:
        if task_id is not None:
            raise ValueError(
                f"{source} has a task index but no task type. Received: "
                f"task_type=None, task_id={task_id!r}. Set both or neither."
            )
    elif task_type == EVALUATOR:
        if isinstance(task_id, bool) or task_id != 0:
            raise ValueError(
                f"{source}'s evaluator task must have index 0: a job has at most "
                f"one evaluator. Received: task evaluator:{task_id!r}."
            )
    else:
        _check_task(jobs, task_type, task_id, source)
    return types.MappingProxyType(jobs)


def _evaluator_addresses(value: Any, source: str) -> None:
    """An "evaluator" job in "cluster": at most one task (its address is not
    used: the evaluator serves nothing)."""
    if isinstance(value, str) or not isinstance(value, Sequence | Mapping):
        raise ValueError(
            f'{source}\'s job {EVALUATOR!r} must be a list of "host:port" '
            f"addresses. Received: {_short(value)}"
        )
    if len(value) > 1:
        raise ValueError(
            f"{source} lists {len(value)} evaluator tasks; a job has at most one. "
            f"Received: {_short(value)}. Keep one."
        )


def _job_addresses(value: Any, job: str, source: str) -> tuple[str, ...]:
    """A job's address list from a list or an `{index: address}` dict."""
    if isinstance(value, Mapping):
        try:
            by_index = {int(index): address for index, address in value.items()}
        except (TypeError, ValueError):
            by_index = None
        if by_index is None or sorted(by_index) != list(range(len(by_index))):
            raise ValueError(
                f"{source}'s job {job!r} must list the address of every task "
                f"0..n-1. Received: {_short(value)}"
            )
        value = [by_index[index] for index in range(len(by_index))]
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ValueError(
            f'{source}\'s job {job!r} must be a list of "host:port" addresses. '
            f"Received: {_short(value)}"
        )
    addresses = tuple(value)
    for index, address in enumerate(addresses):
        split_address(address, f"{source}'s task {job}:{index}")
    return addresses


def _check_task(jobs: Mapping, task_type: Any, task_id: Any, source: str) -> None:
    if task_type not in jobs:
        raise ValueError(
            f"Task type {task_type!r} (from {source}) is not a job of the "
            f"cluster. Expected one of: {_list(jobs)}."
        )
    if isinstance(task_id, bool) or not isinstance(task_id, int):
        raise ValueError(
            f"Task index (from {source}) must be an integer. Received: "
            f"{task_id!r} for task type {task_type!r}."
        )
    if not 0 <= task_id < len(jobs[task_type]):
        raise ValueError(
            f"Task index {task_id} (from {source}) is out of range: job "
            f"{task_type!r} has {len(jobs[task_type])} task(s), so expected "
            f"0 <= index <= {len(jobs[task_type]) - 1}."
        )


def _list(jobs: Iterable[str]) -> str:
    return ", ".join(jobs)


def _short(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
