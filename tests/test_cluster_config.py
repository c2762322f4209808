"""Tests for `keras_psdist.cluster.config`: TF_CONFIG validation and ports."""

import json
import socket
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from keras_psdist.cluster import config as cluster_config
from keras_psdist.cluster import ports as ports_lib
from keras_psdist.cluster.config import ClusterConfig
from keras_psdist.errors import PortInUseError

CLUSTER = {
    "ps": ["127.0.0.1:2222", "127.0.0.1:2223"],
    "worker": ["127.0.0.1:2224", "127.0.0.1:2225"],
}


def _tf_config(cluster=None, task=None) -> dict:
    value = {"cluster": CLUSTER if cluster is None else cluster}
    if task is not None:
        value["task"] = task
    return value


@pytest.mark.parametrize(
    "value, expected",
    [
        ("{not json", ["TF_CONFIG is not valid JSON", "{not json", '"cluster"']),
        ("[1, 2]", ["must be a JSON object", "[1, 2]"]),
        ({"task": {"type": "ps", "index": 0}}, ['has no "cluster"', '"ps": [']),
        ({"cluster": ["127.0.0.1:1"]}, ["must map job names", "['127.0.0.1:1']"]),
        (
            _tf_config({**CLUSTER, "evaluater": ["127.0.0.1:9"]}),
            [
                "unknown job(s) 'evaluater'",
                "Expected only: chief, ps, worker (and 'evaluator', which is "
                "outside the training cluster)",
            ],
        ),
        (
            _tf_config({"worker": ["127.0.0.1:1"]}),
            ["no 'ps' tasks", "at least one 'ps' and one 'worker'", "jobs: worker"],
        ),
        (
            _tf_config({"ps": ["127.0.0.1:1"], "worker": []}),
            ["no 'worker' tasks", "jobs: ps, worker"],
        ),
        (
            _tf_config({**CLUSTER, "chief": ["127.0.0.1:8", "127.0.0.1:9"]}),
            ["exactly one 'chief'", "Received: 2", "Keep one"],
        ),
        (
            _tf_config({"ps": ["127.0.0.1"], "worker": ["127.0.0.1:1"]}),
            ["task ps:0", '"host:port"', "1..65535", "Received: '127.0.0.1'"],
        ),
        (
            _tf_config({"ps": ["127.0.0.1:0"], "worker": ["127.0.0.1:1"]}),
            ["task ps:0", "Received: '127.0.0.1:0'"],
        ),
        (
            _tf_config({"ps": ["127.0.0.1:1"], "worker": ["h:70000"]}),
            ["task worker:0", "Received: 'h:70000'"],
        ),
        (
            _tf_config({"ps": [":2222"], "worker": ["h:1"]}),
            ["task ps:0", "Received: ':2222'"],
        ),
        (
            _tf_config({"ps": ["::1:2222"], "worker": ["h:1"]}),
            ['IPv6 as "[::1]:2222"', "Received: '::1:2222'"],
        ),
        (
            _tf_config({"ps": "127.0.0.1:1", "worker": ["h:1"]}),
            ["job 'ps' must be a list", "Received: 127.0.0.1:1"],
        ),
        (
            _tf_config({"ps": ["h:1"], "worker": ["h:2", "h:1"]}),
            ["gives ps:0 and worker:1 the same address 'h:1'", "its own port"],
        ),
        (
            _tf_config(task={"type": "chief", "index": 0}),
            ["Task type 'chief' (from TF_CONFIG) is not a job", "ps, worker"],
        ),
        (
            _tf_config(task={"type": "worker", "index": 2}),
            ["Task index 2 (from TF_CONFIG) is out of range", "has 2 task(s)"],
        ),
        (
            _tf_config(task={"type": "worker", "index": -1}),
            ["Task index -1", "0 <= index <= 1"],
        ),
        (
            _tf_config(task={"type": "worker", "index": "1"}),
            ["must be an integer", "Received: '1'"],
        ),
        (
            _tf_config(task={"type": "worker", "index": True}),
            ["must be an integer", "Received: True"],
        ),
        (
            _tf_config(task={"index": 0}),
            ['"task" has no "type"', "{'index': 0}"],
        ),
        (
            _tf_config(task={"type": "ps"}),
            ['"task" has no "index"', '{"type": "ps", "index": 0}'],
        ),
        (_tf_config(task="ps:0"), ['"task" must be an object', "ps:0"]),
    ],
)
def test_invalid_tf_config_says_what_and_how_to_fix(value, expected):
    with pytest.raises(ValueError) as info:
        cluster_config.from_tf_config(value)
    message = str(info.value)
    for part in expected:
        assert part in message, message
    assert "TF_CONFIG" in message, message


def test_error_names_the_source():
    with pytest.raises(ValueError, match=r"^my.json is not valid JSON"):
        cluster_config.from_tf_config("{", source="my.json")


def test_valid_tf_config_with_and_without_task():
    config = cluster_config.from_tf_config(
        json.dumps(_tf_config(task={"type": "worker", "index": 1}))
    )
    assert config.addresses("ps") == ("127.0.0.1:2222", "127.0.0.1:2223")
    assert config.addresses("chief") == ()
    assert (config.num_ps, config.num_workers, config.has_chief) == (2, 2, False)
    assert config.task_address == "127.0.0.1:2225"
    assert config.task_name == "worker:1"
    assert not config.is_chief
    assert config.with_task("worker", 0).is_chief
    assert config.device("ps", 1, "GPU", 2) == "/job:ps/replica:0/task:1/device:GPU:2"

    no_task = cluster_config.from_tf_config(_tf_config())
    assert no_task.task_type is None and no_task.task_id is None
    assert not no_task.is_chief
    with pytest.raises(ValueError, match="needs this process's task"):
        _ = no_task.task_address
    # An empty "task" is no task.
    assert cluster_config.from_tf_config(_tf_config(task={})).task_type is None


def test_chief_is_the_chief_when_there_is_one():
    config = ClusterConfig({**CLUSTER, "chief": ["127.0.0.1:2230"]})
    assert config.has_chief
    assert config.with_task("chief", 0).is_chief
    assert not config.with_task("worker", 0).is_chief


@pytest.mark.parametrize(
    "task_type, task_id", [(None, None), ("ps", 1), ("worker", 0), ("chief", 0)]
)
def test_tf_config_round_trip(task_type, task_id):
    config = ClusterConfig(
        {**CLUSTER, "chief": ["[::1]:2230"]}, task_type=task_type, task_id=task_id
    )
    value = config.to_tf_config()
    assert ("task" in value) == (task_type is not None)
    assert cluster_config.from_tf_config(json.dumps(value)) == config
    assert cluster_config.from_tf_config(value) == config
    assert hash(cluster_config.from_tf_config(value)) == hash(config)


def test_config_is_immutable_and_validated():
    config = ClusterConfig(CLUSTER)
    with pytest.raises(TypeError):
        config.jobs["ps"] = ("h:1",)
    with pytest.raises(ValueError, match=r"from ClusterConfig\) is out of range"):
        config.with_task("ps", 5)
    with pytest.raises(ValueError, match="task index but no task type"):
        ClusterConfig(CLUSTER, task_id=0)
    with pytest.raises(ValueError, match=r"Task index 7 .* job 'worker' has 2 task"):
        config.device("worker", 7)


def test_from_environment():
    assert cluster_config.from_environment({}) is None
    assert cluster_config.from_environment({"TF_CONFIG": ""}) is None
    assert cluster_config.from_environment({"TF_CONFIG": "  {} "}) is None
    value = json.dumps(_tf_config(task={"type": "ps", "index": 0}))
    config = cluster_config.from_environment({"TF_CONFIG": value})
    assert config.task_address == "127.0.0.1:2222"
    with pytest.raises(ValueError, match="TF_CONFIG is not valid JSON"):
        cluster_config.from_environment({"TF_CONFIG": "{oops"})


def test_cluster_spec_whole_and_restricted():
    config = ClusterConfig(CLUSTER, "worker", 1)
    assert config.cluster_spec().as_dict() == CLUSTER
    spec = config.cluster_spec({"ps": None, "worker": {1: "127.0.0.1:2225"}})
    assert spec.as_dict() == {"ps": CLUSTER["ps"], "worker": {1: "127.0.0.1:2225"}}
    assert spec.task_address("worker", 1) == "127.0.0.1:2225"
    with pytest.raises(ValueError, match="the cluster has jobs ps, worker"):
        config.cluster_spec({"chief": None})
    with pytest.raises(ValueError, match="worker:1 is at '127.0.0.1:2225'"):
        config.cluster_spec({"worker": {1: "127.0.0.1:9"}})


def test_from_resolver():
    spec = tf.train.ClusterSpec({**CLUSTER, "chief": ["127.0.0.1:2230"]})
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec, task_type="worker", task_id=1
    )
    config = cluster_config.from_resolver(resolver)
    assert config.task_address == "127.0.0.1:2225"
    assert config.addresses("chief") == ("127.0.0.1:2230",)
    assert config.num_workers == 2

    no_task = tf.distribute.cluster_resolver.SimpleClusterResolver(spec)
    assert cluster_config.from_resolver(no_task).task_type is None

    # A job given as {index: address} covering every index.
    sparse = tf.train.ClusterSpec({"ps": {0: "h:1"}, "worker": {1: "h:3", 0: "h:2"}})
    config = cluster_config.from_resolver(
        tf.distribute.cluster_resolver.SimpleClusterResolver(sparse)
    )
    assert config.addresses("worker") == ("h:2", "h:3")

    gap = tf.train.ClusterSpec({"ps": ["h:1"], "worker": {1: "h:3"}})
    with pytest.raises(
        ValueError, match=r"SimpleClusterResolver's job 'worker'.*0\.\.n-1"
    ):
        cluster_config.from_resolver(
            tf.distribute.cluster_resolver.SimpleClusterResolver(gap)
        )


def test_wait_reachable_raises_within_its_timeout_for_a_closed_port():
    (port,) = ports_lib.pick_free_ports(1)
    start = time.monotonic()
    with pytest.raises(ConnectionError) as info:
        ports_lib.wait_reachable({"ps:0": f"127.0.0.1:{port}"}, timeout_s=1.0)
    assert time.monotonic() - start < 10.0  # The timeout is honoured.
    message = str(info.value)
    assert f"ps:0 at 127.0.0.1:{port}" in message
    assert "keras-psdist serve" in message
    assert "TF_CONFIG" in message and "firewall" in message


def test_wait_reachable_returns_once_listening_and_names_each_unreachable():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        open_address = f"127.0.0.1:{listening.getsockname()[1]}"
        ports_lib.wait_reachable([open_address], timeout_s=5.0)
        closed = [f"127.0.0.1:{p}" for p in ports_lib.pick_free_ports(2)]
        with pytest.raises(ConnectionError) as info:
            ports_lib.wait_reachable(
                {"ps:0": open_address, "worker:0": closed[0], "worker:1": closed[1]},
                timeout_s=0.5,
            )
    message = str(info.value)
    assert "2 task(s)" in message
    assert f"worker:0 at {closed[0]}" in message
    assert f"worker:1 at {closed[1]}" in message
    assert "ps:0" not in message


def test_wait_reachable_poll_can_stop_waiting():
    (port,) = ports_lib.pick_free_ports(1)

    def poll():
        raise RuntimeError("server died")

    with pytest.raises(RuntimeError, match="server died"):
        ports_lib.wait_reachable([f"127.0.0.1:{port}"], 30.0, poll=poll)


def test_pick_free_ports_distinct_and_bindable():
    ports = ports_lib.pick_free_ports(20)
    assert len(set(ports)) == 20
    for port in ports[:3]:
        ports_lib.check_port_free(f"127.0.0.1:{port}")


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_check_port_free_raises_when_the_port_is_taken(host):
    with socket.socket() as held:
        held.bind((host, 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(PortInUseError) as info:
            ports_lib.check_port_free(f"127.0.0.1:{port}")
    assert isinstance(info.value, OSError)
    assert info.value.port == port
    assert f"Port {port}" in str(info.value)
    assert "already in use by another process" in str(info.value)


def test_check_port_free_rejects_a_bad_address():
    with pytest.raises(ValueError, match="Received: 'localhost'"):
        ports_lib.check_port_free("localhost")


def test_config_module_imports_without_tensorflow(tmp_path):
    # Loaded by path: `import keras_psdist...` would run the package's
    # __init__, which imports TensorFlow for the strategies.
    code = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location("
        f"'cfg', {cluster_config.__file__!r})\n"
        "module = sys.modules['cfg'] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        'module.from_tf_config(\'{"cluster": {"ps": ["h:1"], '
        '"worker": ["h:2"]}}\')\n'
        "assert 'tensorflow' not in sys.modules, 'imported tensorflow'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_only_an_in_graph_cluster_calls_its_steps_on_a_worker():
    # In-graph across a cluster the chief holds no replica: a step's own
    # ops (Keras's loop over steps) run on the first worker's host, not on
    # the caller. One host and between-graph, the caller is where the
    # replicas are.
    from keras_psdist.cluster.runtime import Topology

    config = ClusterConfig({**CLUSTER, "chief": ["127.0.0.1:2230"]}, "chief", 0)
    workers = [f"/job:worker/replica:0/task:{i}/device:CPU:0" for i in range(2)]
    ps = ("/job:ps/replica:0/task:0/device:CPU:0",)
    input_workers = tuple((w, (w,)) for w in workers)
    chief = "/job:chief/replica:0/task:0/device:CPU:0"
    in_graph = Topology("in-graph", tuple(workers), ps, input_workers, chief, config)
    assert in_graph.step_host == workers[0]
    between = Topology(
        "between-graph",
        (workers[1],),
        ps,
        input_workers[1:],
        workers[1],
        config.with_task("worker", 1),
    )
    assert between.step_host is None
    local = "/job:localhost/replica:0/task:0/device:CPU:0"
    one_host = Topology("local", (local,), (local,), ((local, (local,)),), local)
    assert one_host.step_host is None
