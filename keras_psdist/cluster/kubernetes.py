"""Kubernetes manifests for a keras_psdist job (`keras-psdist k8s`).

Kubeflow's trainer v2 dropped TensorFlow's `TFJob`, so a TensorFlow job on
Kubernetes writes its `TF_CONFIG` by hand. This renders the whole job:

- per task type a headless Service (`clusterIP: None`), so that every pod
  has a stable name: `<name>-ps-0.<name>-ps:2222`;
- the server tasks (ps; in-graph also the workers) as a StatefulSet each,
  running `keras-psdist serve`, ready when their port accepts connections;
- the training tasks (between-graph the workers, in-graph the chief) as an
  Indexed Job, running the command; the optional evaluator as a Job of one;
- every pod's `TF_CONFIG` written at its start from its index (the
  StatefulSet pod's ordinal, the Indexed Job's `JOB_COMPLETION_INDEX`).

The output is one `v1` `List` in JSON, which `kubectl apply -f` takes. The
servers run until deleted (`kubectl delete -f` the same file) once the
training Job has completed.

This module does not import TensorFlow.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from typing import Any

from keras_psdist.cluster.config import EVALUATOR
from keras_psdist.cluster.mode_names import IN_GRAPH

DEFAULT_PORT = 2222
_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def render(
    name: str,
    image: str,
    command: Sequence[str],
    num_ps: int,
    num_workers: int,
    mode: str = IN_GRAPH,
    evaluator: bool = False,
    port: int = DEFAULT_PORT,
) -> dict[str, Any]:
    """The job's manifests, as one `v1` `List`.

    Args:
        name: The job's name, a DNS label prefix (lower-case letters,
            digits, `-`; at most 40 characters: pod names add to it).
        image: The container image holding the script and keras_psdist.
        command: The training command, e.g. `["python", "train.py"]`.
        num_ps: Parameter-server tasks.
        num_workers: Worker tasks.
        mode: `"in-graph"` (a chief drives the workers, which serve) or
            `"between-graph"` (every worker runs the command).
        evaluator: Add the side-car evaluator (`keras_psdist.SidecarEvaluator`).
        port: Every task's port.

    Raises:
        ValueError: If an argument is invalid; the message names it.

    Examples:

    >>> job = render("digits", "example/train:1", ["python", "train.py"], 1, 2,
    ...              mode="between-graph")
    >>> [(m["kind"], m["metadata"]["name"]) for m in job["items"]]
    ... # doctest: +NORMALIZE_WHITESPACE
    [('Service', 'digits-ps'), ('Service', 'digits-worker'),
     ('StatefulSet', 'digits-ps'), ('Job', 'digits-worker')]
    """
    if not isinstance(name, str) or len(name) > 40 or not _NAME.fullmatch(name):
        raise ValueError(
            "`name` must be a DNS label of at most 40 characters (lower-case "
            f"letters, digits and '-', starting with a letter). Received: {name!r}"
        )
    if not isinstance(image, str) or not image:
        raise ValueError(f"`image` must name a container image. Received: {image!r}")
    if isinstance(command, str) or not command:
        raise ValueError(
            "`command` must be the training command as a list, e.g. "
            f"['python', 'train.py']. Received: {command!r}"
        )
    for what, value in (("num_ps", num_ps), ("num_workers", num_workers)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`{what}` must be an integer >= 1. Received: {value!r}")
    jobs = {"ps": num_ps, "worker": num_workers}
    if mode == IN_GRAPH:
        jobs = {"chief": 1, **jobs}
    cluster = {
        job: [f"{name}-{job}-{i}.{name}-{job}:{port}" for i in range(n)]
        for job, n in jobs.items()
    }
    training = "chief" if mode == IN_GRAPH else "worker"
    items: list[dict[str, Any]] = [_service(name, job, port) for job in jobs]
    for job, n in jobs.items():
        if job == training:
            items.append(
                _training_job(name, job, n, image, command, cluster, mode, port)
            )
        else:
            items.append(_server_set(name, job, n, image, cluster, mode, port))
    if evaluator:
        items.append(_evaluator_job(name, image, command, cluster, mode))
    return {"apiVersion": "v1", "kind": "List", "items": items}


def to_json(manifests: dict[str, Any]) -> str:
    """The manifests as `kubectl apply -f` reads them."""
    return json.dumps(manifests, indent=2)


def _labels(name: str, job: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, "keras-psdist/job": job}


def _service(name: str, job: str, port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{name}-{job}", "labels": _labels(name, job)},
        "spec": {
            "clusterIP": "None",
            # A pod gets its name before it is ready: the servers and the
            # training tasks find each other while starting.
            "publishNotReadyAddresses": True,
            "selector": _labels(name, job),
            "ports": [{"name": "grpc", "port": port}],
        },
    }


def _entrypoint(job: str, index: str, cluster, mode: str, run: str) -> list:
    """`sh -c`: TF_CONFIG with the pod's `index` (a shell word, e.g.
    `${JOB_COMPLETION_INDEX}`), then `run`."""
    template = json.dumps(
        {"cluster": cluster, "task": {"type": job, "index": "@INDEX@"}}
    ).replace('"@INDEX@"', "%s")  # (no "%" in a cluster's addresses)
    return [
        "sh",
        "-c",
        f'export TF_CONFIG="$(printf {shlex.quote(template)} "{index}")"'
        f" KERAS_PSDIST_LAUNCH_MODE={mode}; exec {run}",
    ]


def _container(
    job, image, entrypoint, port=None, ready=False, env=()
) -> dict[str, Any]:
    """A pod's one container, listening on `port` if given; with `ready`,
    ready when the port accepts connections."""
    container: dict[str, Any] = {
        "name": job,
        "image": image,
        "command": entrypoint,
        "env": list(env),
    }
    if port is not None:
        container["ports"] = [{"name": "grpc", "containerPort": port}]
    if ready:
        container["readinessProbe"] = {"tcpSocket": {"port": port}, "periodSeconds": 2}
    return container


def _server_set(name, job, n, image, cluster, mode, port) -> dict[str, Any]:
    # A StatefulSet pod's ordinal is its name's last part.
    entrypoint = _entrypoint(
        job, "${POD_NAME##*-}", cluster, mode, "keras-psdist serve"
    )
    pod_name = {
        "name": "POD_NAME",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": f"{name}-{job}", "labels": _labels(name, job)},
        "spec": {
            "serviceName": f"{name}-{job}",
            "replicas": n,
            # Every server at once: none waits for another to be ready.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": _labels(name, job)},
            "template": {
                "metadata": {"labels": _labels(name, job)},
                "spec": {
                    "containers": [
                        _container(
                            job, image, entrypoint, port, ready=True, env=[pod_name]
                        )
                    ]
                },
            },
        },
    }


def _job(name, job, container, pod_spec=None, **spec) -> dict[str, Any]:
    """A batch Job of `job`'s pods, each running `container` once."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"{name}-{job}", "labels": _labels(name, job)},
        "spec": {
            **spec,
            "template": {
                "metadata": {"labels": _labels(name, job)},
                "spec": {
                    **(pod_spec or {}),
                    "restartPolicy": "Never",
                    "containers": [container],
                },
            },
        },
    }


def _training_job(name, job, n, image, command, cluster, mode, port) -> dict[str, Any]:
    run = shlex.join(command)
    entrypoint = _entrypoint(job, "${JOB_COMPLETION_INDEX}", cluster, mode, run)
    return _job(
        name,
        job,
        _container(job, image, entrypoint, port),
        # With the Service's name as subdomain, pod i of this Indexed Job is
        # `<name>-<job>-<i>.<name>-<job>`.
        pod_spec={"subdomain": f"{name}-{job}"},
        completions=n,
        parallelism=n,
        completionMode="Indexed",
        backoffLimit=0,
    )


def _evaluator_job(name, image, command, cluster, mode) -> dict[str, Any]:
    run = shlex.join(command)
    entrypoint = _entrypoint(EVALUATOR, "0", cluster, mode, run)
    return _job(
        name, EVALUATOR, _container(EVALUATOR, image, entrypoint), backoffLimit=2
    )
