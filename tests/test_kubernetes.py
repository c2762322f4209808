"""`keras-psdist k8s`: a job's manifests, valid against Kubernetes' own
schemas (offline, `kubernetes-validate`), each pod's `TF_CONFIG` the one its
index gives (its entrypoint run by `sh` here)."""

import json
import os
import subprocess
import sys

import kubernetes_validate
import pytest

from keras_psdist.cluster import from_tf_config
from keras_psdist.cluster.kubernetes import render

KUBERNETES = "1.30"
COMMAND = ["python", "train.py", "--epochs", "3"]


def _items(job, kind):
    return {m["metadata"]["name"]: m for m in job["items"] if m["kind"] == kind}


def _tf_config(item, index):
    """The TF_CONFIG pod `index` of `item` starts with (its `sh -c` run here,
    with `exec env` for the command)."""
    container = item["spec"]["template"]["spec"]["containers"][0]
    shell, flag, script = container["command"]
    script = script[: script.rindex("exec ")] + "exec env"
    env = {
        "PATH": os.environ["PATH"],
        "POD_NAME": f"{item['metadata']['name']}-{index}",
    }
    env["JOB_COMPLETION_INDEX"] = str(index)
    env.update({e["name"]: e["value"] for e in container["env"] if "value" in e})
    out = subprocess.run([shell, flag, script], env=env, capture_output=True, text=True)
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("TF_CONFIG=")]
    return from_tf_config(line[len("TF_CONFIG=") :])


@pytest.mark.parametrize("mode", ["in-graph", "between-graph"])
def test_every_manifest_is_valid_kubernetes(mode):
    job = render(
        "digits", "registry.example/train:1", COMMAND, 2, 3, mode=mode, evaluator=True
    )
    assert job["kind"] == "List"
    for item in job["items"]:
        kubernetes_validate.validate(item, KUBERNETES, strict=True)


def test_between_graph_servers_and_training_job():
    job = render("digits", "img:1", COMMAND, 2, 3, mode="between-graph", port=2222)
    services = _items(job, "Service")
    assert set(services) == {"digits-ps", "digits-worker"}
    assert all(s["spec"]["clusterIP"] == "None" for s in services.values())
    (ps,) = _items(job, "StatefulSet").values()
    assert ps["spec"]["replicas"] == 2 and ps["spec"]["serviceName"] == "digits-ps"
    container = ps["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][2].endswith("exec keras-psdist serve")
    assert container["readinessProbe"] == {
        "tcpSocket": {"port": 2222},
        "periodSeconds": 2,
    }
    (workers,) = _items(job, "Job").values()
    assert workers["spec"]["completionMode"] == "Indexed"
    assert workers["spec"]["completions"] == workers["spec"]["parallelism"] == 3
    assert workers["spec"]["template"]["spec"]["subdomain"] == "digits-worker"
    assert workers["spec"]["template"]["spec"]["containers"][0]["command"][2].endswith(
        "exec python train.py --epochs 3"
    )
    # Each pod's TF_CONFIG: the whole cluster, its own task.
    for index in (0, 1):
        config = _tf_config(ps, index)
        assert config.task_name == f"ps:{index}"
        assert config.addresses("ps") == (
            "digits-ps-0.digits-ps:2222",
            "digits-ps-1.digits-ps:2222",
        )
    config = _tf_config(workers, 2)
    assert config.task_name == "worker:2"
    assert config.task_address == "digits-worker-2.digits-worker:2222"


def test_in_graph_the_chief_trains_and_the_workers_serve():
    job = render("digits", "img:1", COMMAND, 1, 2, evaluator=True)
    assert set(_items(job, "StatefulSet")) == {"digits-ps", "digits-worker"}
    jobs = _items(job, "Job")
    assert set(jobs) == {"digits-chief", "digits-evaluator"}
    assert _tf_config(jobs["digits-chief"], 0).task_name == "chief:0"
    assert (
        _tf_config(_items(job, "StatefulSet")["digits-worker"], 1).task_name
        == "worker:1"
    )
    evaluator = _tf_config(jobs["digits-evaluator"], 0)
    assert evaluator.is_evaluator and set(evaluator.jobs) == {"chief", "ps", "worker"}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"name": "Digits"}, "`name` must be a DNS label"),
        ({"name": "d" * 41}, "at most 40 characters"),
        ({"image": ""}, "`image` must name a container image"),
        (
            {"command": "python train.py"},
            "`command` must be the training command as a list",
        ),
        ({"num_ps": 0}, "`num_ps` must be an integer >= 1"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    args = {
        "name": "digits",
        "image": "img",
        "command": COMMAND,
        "num_ps": 1,
        "num_workers": 1,
    }
    with pytest.raises(ValueError, match=match):
        render(**{**args, **kwargs})


def test_the_command_line_prints_what_kubectl_applies():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "keras_psdist",
            "k8s",
            "--name",
            "digits",
            "--image",
            "img:1",
            "--num-ps",
            "1",
            "--num-workers",
            "2",
            "--mode",
            "between-graph",
            "--evaluator",
            "--",
            "python",
            "train.py",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    assert [m["kind"] for m in job["items"]].count("Job") == 2
    missing = subprocess.run(
        [sys.executable, "-m", "keras_psdist", "k8s", "--image", "img", "--", "python"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and "`k8s` needs --name" in missing.stderr
