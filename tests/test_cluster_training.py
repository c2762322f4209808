"""Training across processes on TensorFlow's gRPC runtime (`keras-psdist launch`).

Each test starts a whole cluster (ps and worker servers, and the training
processes) with `keras_psdist.cluster.launch`, which tears every process down
when the job ends, fails or times out. The two main launches (in-graph, and
between-graph async) run every task on a host of its own, a network
namespace with its own address (`launching.cluster_hosts`); the others run on
localhost.
"""

import importlib.util
import json
import os
import socket
import subprocess
from pathlib import Path

import launching  # tests/cluster_jobs, see conftest.py
import layer_zoo
import numpy as np
import pytest
import tutorial_patterns
import zygote

import keras_psdist as kpd
from keras_psdist import cluster

pytestmark = pytest.mark.multiprocess

JOB = Path(__file__).parent / "cluster_jobs" / "digits_job.py"
LAUNCH_TIMEOUT_S = 420


def _job_module():
    spec = importlib.util.spec_from_file_location("digits_job", JOB)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _launch(tmp_path, mode, num_ps, num_workers, then=(), evaluator=False):
    in_graph = mode == "sync"
    with launching.cluster_hosts(num_ps, num_workers, chief=in_graph) as (_, hosts):
        code, log = launching.launch_job(
            JOB,
            [tmp_path, mode, *then],
            num_ps=num_ps,
            num_workers=num_workers,
            mode="in-graph" if in_graph else "between-graph",
            timeout_s=LAUNCH_TIMEOUT_S,
            hosts=hosts,
            evaluator=evaluator,
        )
    assert code == 0, f"launch exited {code}:\n{log[-6000:]}"
    reports = {
        p.stem.replace("_", ":"): json.loads(p.read_text())
        for p in tmp_path.glob("*.json")
    }
    return reports, log


@pytest.fixture(scope="module")
def in_graph_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("in_graph")
    reports, log = _launch(tmp_path, "sync", num_ps=2, num_workers=2)
    return reports["chief:0"], tmp_path, log


@pytest.mark.xdist_group("in_graph_cluster")
def test_in_graph_places_variables_on_ps_tasks_and_spreads_them(in_graph_run):
    report, _, _ = in_graph_run
    assert report["mode"] == "in-graph"
    assert report["compute_devices"] == [
        "/job:worker/replica:0/task:0/device:CPU:0",
        "/job:worker/replica:0/task:1/device:CPU:0",
    ]
    devices = set(report["variable_devices"].values())
    assert all(d.startswith("/job:ps/") for d in devices), devices
    assert devices == {
        "/job:ps/replica:0/task:0/device:CPU:0",
        "/job:ps/replica:0/task:1/device:CPU:0",
    }


@pytest.mark.xdist_group("in_graph_cluster")
def test_in_graph_steps_are_called_on_the_first_worker_not_the_chief(in_graph_run):
    # The ops of Keras's loop over steps (its predicates, each step's batch)
    # run beside the replicas: the call's results are on worker 0's host.
    report, _, _ = in_graph_run
    worker_0 = "/job:worker/replica:0/task:0/device:CPU:0"
    assert report["step_device"] == worker_0
    assert report["step_output_devices"] == [worker_0]
    # docs/cluster.md's custom loop, called there as the docs say.
    assert report["custom_step"][1] == 12.0


@pytest.mark.xdist_group("in_graph_cluster")
def test_in_graph_learns_and_equals_the_one_process_run(in_graph_run, cpu_devices):
    report, tmp_path, _ = in_graph_run
    assert report["accuracy"] >= 0.9
    job = _job_module()
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:2], parameter_devices=cpu_devices[2:4]
    )
    model = job.build(strategy)
    _, accuracy = job.train(model)
    cluster_weights = np.load(tmp_path / "weights.npz")
    for i, w in enumerate(model.weights):
        np.testing.assert_allclose(
            cluster_weights[f"arr_{i}"], w.numpy(), rtol=0, atol=1e-5
        )
    assert accuracy == pytest.approx(report["accuracy"], abs=1e-6)


@pytest.mark.xdist_group("in_graph_cluster")
def test_in_graph_partitioned_table_equals_the_unpartitioned_run(
    in_graph_run, cpu_devices
):
    """The embedding table, split over the 2 ps tasks, trains to the weights
    of the same model unpartitioned in one process."""
    report, tmp_path, _ = in_graph_run
    shards = report["shards"]
    assert [name.rsplit("/", 1)[-1] for name, _, _ in shards] == ["part_0", "part_1"]
    assert {device for _, device, _ in shards} == {
        "/job:ps/replica:0/task:0/device:CPU:0",
        "/job:ps/replica:0/task:1/device:CPU:0",
    }
    assert [shape for _, _, shape in shards] == [[544, 8], [544, 8]]
    job = _job_module()
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:2], parameter_devices=cpu_devices[2:4]
    )
    model = job.build_embedding(strategy)
    job.train_embedding(model)
    cluster_weights = np.load(tmp_path / "embedding_weights.npz")
    assert len(cluster_weights.files) == len(model.weights)
    for i, w in enumerate(model.weights):
        np.testing.assert_allclose(
            cluster_weights[f"arr_{i}"], w.numpy(), rtol=0, atol=1e-5
        )


@pytest.mark.xdist_group("in_graph_cluster")
def test_in_graph_partial_batches_equal_the_one_process_run(in_graph_run, cpu_devices):
    """Every layer type on global batches of 1 for 2 worker tasks: worker 1
    runs on a stand-in (no kernel on an empty batch), and the weights are
    those of the same replicas in one process."""
    _, tmp_path, _ = in_graph_run
    job = _job_module()
    strategy = kpd.PSStrategy(
        devices=cpu_devices[:2], parameter_devices=cpu_devices[2:4]
    )
    model = job.build_layer_zoo(strategy)
    model.fit(layer_zoo.partial_batches(2), epochs=2, verbose=0)
    cluster_weights = np.load(tmp_path / "zoo_weights.npz")
    assert len(cluster_weights.files) == len(model.weights)
    for i, w in enumerate(model.weights):
        np.testing.assert_allclose(
            cluster_weights[f"arr_{i}"], w.numpy(), rtol=0, atol=1e-5
        )


@pytest.mark.xdist_group("in_graph_cluster")
def test_in_graph_xla_trains_as_without_it(in_graph_run):
    """`compile(jit_compile=True)` on the cluster: each replica's pass is
    compiled on its worker task; 2 epochs end at `jit_compile=False`'s
    weights (XLA may reorder sums)."""
    report, _, _ = in_graph_run
    assert report["xla_max_weight_difference"] < 1e-4, report


@pytest.mark.xdist_group("in_graph_cluster")
@pytest.mark.parametrize("pattern", sorted(tutorial_patterns.PATTERNS))
def test_in_graph_runs_every_tutorial_pattern(in_graph_run, pattern):
    """`tests/cluster_jobs/tutorial_patterns.py` on the in-graph cluster
    (each task on a host of its own), in the same launch."""
    if pattern in tutorial_patterns.IN_GRAPH_CRASHES:
        pytest.skip(
            "TensorFlow 2.21 crashes (SIGSEGV) returning an iterator made "
            "inside a tf.function on a remote task; see tutorial_patterns"
        )
    report, _, _ = in_graph_run
    assert report["tutorial_patterns"][pattern] == "ok", report["tutorial_patterns"][
        pattern
    ]


@pytest.mark.xdist_group("in_graph_cluster")
def test_in_graph_streams_every_task_output(in_graph_run):
    _, _, log = in_graph_run
    for prefix in ("[chief:0]", "[ps:0]", "[ps:1]", "[worker:0]", "[worker:1]"):
        assert prefix in log
    assert "[chief:0] chief:0: accuracy" in log


@pytest.mark.hosts
@pytest.mark.xdist_group("in_graph_cluster")
def test_in_graph_ran_every_task_on_a_host_of_its_own(in_graph_run):
    _, _, log = in_graph_run
    # ps:0=10.231.0.2:2222, ...: five tasks, five addresses, none loopback.
    addresses = launching.host_addresses(log)
    assert len(addresses) == 5 and len({a for _, a in addresses}) == 5, addresses
    assert not any(a.startswith("127.") for _, a in addresses)


@pytest.fixture(scope="module")
def async_run(tmp_path_factory):
    """2 workers on 1 ps, and the side-car evaluator following the chief's
    checkpoints (`reports["evaluator"]`). The script goes on with the
    partial-batch runs (`partial_batches_launch`): more strategies in the
    same launch."""
    tmp_path = tmp_path_factory.mktemp("async")
    reports, log = _launch(
        tmp_path,
        "async",
        num_ps=1,
        num_workers=2,
        then=("0", "then_partial_batches"),
        evaluator=True,
    )
    return reports, tmp_path, log


@pytest.mark.xdist_group("between_graph_cluster")
def test_async_workers_share_the_variables_on_the_ps(async_run):
    reports, _, _ = async_run
    assert set(reports) == {"worker:0", "worker:1", "evaluator"}
    reports = {k: v for k, v in reports.items() if k != "evaluator"}
    for report in reports.values():
        assert report["mode"] == "between-graph"
        assert set(report["variable_devices"].values()) == {
            "/job:ps/replica:0/task:0/device:CPU:0"
        }
    # Seeded differently, yet both start from the chief's initial weights.
    assert reports["worker:0"]["initial_checksum"] == pytest.approx(
        reports["worker:1"]["initial_checksum"], rel=1e-6
    )
    # Both workers' updates land in the one shared `iterations` counter: the
    # last worker to finish sees more steps than its own. (Keras increments it
    # by read-modify-write, so increments made at the same instant by two
    # workers count once: it is not exactly the sum.)
    steps = [r["steps"] for r in reports.values()]
    last = max(r["iterations"] for r in reports.values())
    assert min(steps) > 0
    assert max(steps) < last <= sum(steps)


@pytest.mark.xdist_group("between_graph_cluster")
def test_async_workers_build_a_lazy_model_in_the_traced_step_on_the_ps(async_run):
    """TensorFlow's custom-training tutorial with its model and Adam built by
    the first traced step, in each worker process: each variable is made
    once, on the ps task, shared by both workers (their Adam's step count
    carries the other's steps), and the loss goes down."""
    reports, _, _ = async_run
    loops = [reports[w]["lazy_loop"] for w in ("worker:0", "worker:1")]
    for loop in loops:
        # 2 kernels, 2 biases, Adam's 2 slots of each and its 2 counters.
        assert loop["created"] >= 4 + 8, loop
        assert loop["devices"] == ["/job:ps/replica:0/task:0/device:CPU:0"], loop
        assert loop["losses"][-1] < loop["losses"][0], loop["losses"]
    assert max(loop["iterations"] for loop in loops) > len(loops[0]["losses"])


@pytest.mark.hosts
@pytest.mark.xdist_group("between_graph_cluster")
def test_async_ran_every_task_on_a_host_of_its_own(async_run):
    _, _, log = async_run
    addresses = launching.host_addresses(log)
    assert [task for task, _ in addresses] == ["ps:0", "worker:0", "worker:1"]
    assert len({a for _, a in addresses}) == 3, addresses


@pytest.mark.xdist_group("between_graph_cluster")
def test_async_workers_learn(async_run):
    """Worker 1 compiles its replica's forward and backward pass with XLA
    (`compile(jit_compile=True)`), worker 0 does not; both learn."""
    reports, _, _ = async_run
    for report in (reports["worker:0"], reports["worker:1"]):
        # Async updates interleave differently every run (and more under
        # load), so the bound is loose; chance is 0.1.
        assert report["accuracy"] >= 0.8, report
    assert reports["worker:1"]["jit_compile"] is True
    assert reports["worker:1"]["xla_traced_replicas"] >= 1
    assert reports["worker:0"]["xla_traced_replicas"] == 0


@pytest.mark.xdist_group("between_graph_cluster")
def test_async_checkpoints_are_written_by_the_chief_only(async_run):
    reports, tmp_path, _ = async_run
    assert reports["worker:0"]["is_chief"] and not reports["worker:1"]["is_chief"]
    assert (tmp_path / "checkpoint_worker_0.weights.h5").exists()
    assert not (tmp_path / "checkpoint_worker_1.weights.h5").exists()


@pytest.mark.xdist_group("between_graph_cluster")
def test_the_evaluator_evaluates_every_checkpoint_of_the_chief_once(async_run):
    """`launch(evaluator=True)`: one more process, TF_CONFIG task
    `evaluator:0`, evaluated each epoch's checkpoint as the chief wrote it,
    at its optimizer step, and finished when the launcher said training had
    ended (after the last checkpoint: none is missed). Building a strategy
    there is refused with the fix."""
    reports, tmp_path, log = async_run
    evaluator = reports["evaluator"]
    assert evaluator["task"] == "evaluator:0"
    names = [name for name, _, _ in evaluator["evaluations"]]
    epochs = sorted(p.name for p in (tmp_path / "epochs").iterdir())
    assert names == epochs == [f"epoch{e:02d}.weights.h5" for e in range(1, 9)]
    steps = [step for _, step, _ in evaluator["evaluations"]]
    assert steps == sorted(set(steps)) and steps[0] > 0, steps
    assert steps[-1] <= reports["worker:0"]["iterations"]
    _, _, last = evaluator["evaluations"][-1]
    assert set(last) == {"loss", "accuracy"} and last["accuracy"] >= 0.8, last
    events = list((tmp_path / "evaluator_logs" / "evaluation").glob("events.*"))
    assert events, list(tmp_path.iterdir())
    assert "told evaluator:0 that training has ended" in log
    assert "evaluator:0 finished (exit code 0)" in log
    assert "SidecarEvaluator" in evaluator["strategy_refusal"]


# ------------------------------------------------------------ bad set-ups


def _listening_socket():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def _address(s):
    return f"127.0.0.1:{s.getsockname()[1]}"


def test_bad_tf_config_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:1"]}}')
    with pytest.raises(ValueError, match="TF_CONFIG.*ps"):
        kpd.PSStrategy()


def test_unreachable_ps_is_a_clear_error_not_a_hang():
    (port,) = cluster.pick_free_ports(1)
    config = cluster.ClusterConfig(
        {"ps": [f"127.0.0.1:{port}"], "worker": [f"127.0.0.1:{port + 1}"]}
    )
    with pytest.raises(ConnectionError, match=f"ps:0 at 127.0.0.1:{port}"):
        kpd.PSStrategy(cluster_resolver=config, connect_timeout=2)


def test_default_connect_timeout_fails_within_30_seconds():
    import inspect

    default = inspect.signature(kpd.PSStrategy).parameters["connect_timeout"].default
    assert default < 30


def test_own_port_in_use_is_a_clear_error():
    ps = _listening_socket()
    held = _listening_socket()
    try:
        config = cluster.ClusterConfig(
            {"ps": [_address(ps)], "worker": [_address(held)]},
            task_type="worker",
            task_id=0,
        )
        with pytest.raises(OSError, match=str(held.getsockname()[1])):
            kpd.PSStrategy(cluster_resolver=config, mode="between-graph")
    finally:
        ps.close()
        held.close()


def test_a_second_strategy_of_another_cluster_is_a_clear_error(monkeypatch):
    # As if this process's first between-graph strategy had connected to
    # another cluster: TensorFlow serves one task per process.
    from keras_psdist.cluster import runtime

    monkeypatch.setattr(
        runtime, "_connected_between_graph", ("{'ps': ['10.0.0.1:1']}", "worker", 0)
    )
    ps, worker = _listening_socket(), _listening_socket()
    try:
        config = cluster.ClusterConfig(
            {"ps": [_address(ps)], "worker": [_address(worker)]}, "worker", 0
        )
        with pytest.raises(ValueError, match="already serves a task of another"):
            kpd.PSStrategy(cluster_resolver=config, mode="between-graph")
    finally:
        ps.close()
        worker.close()


def test_wrong_role_for_the_mode_is_a_clear_error():
    ps, worker = _listening_socket(), _listening_socket()
    try:
        jobs = {"ps": [_address(ps)], "worker": [_address(worker)]}
        with pytest.raises(ValueError, match="runs once, on the chief"):
            kpd.PSStrategy(cluster_resolver=cluster.ClusterConfig(jobs, "worker", 0))
        with pytest.raises(ValueError, match="every worker task runs this script"):
            kpd.PSStrategy(
                cluster_resolver=cluster.ClusterConfig(jobs, "ps", 0),
                mode="between-graph",
            )
    finally:
        ps.close()
        worker.close()


def test_async_without_a_cluster_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="needs a cluster"):
        kpd.PSStrategy(mode="between-graph")


def test_worker_without_a_chief_times_out_with_a_clear_message(tmp_path):
    """worker:1 of an async run whose chief never comes: it names the chief."""
    ps_port, w0, w1 = cluster.pick_free_ports(3)
    jobs = {
        "ps": [f"127.0.0.1:{ps_port}"],
        "worker": [f"127.0.0.1:{w0}", f"127.0.0.1:{w1}"],
    }
    # Both processes are forks of the test zygote (one TensorFlow import).
    env, python = zygote.python_in(dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    server = subprocess.Popen(
        [*python, "-m", "keras_psdist", "serve"],
        env={
            **env,
            "TF_CONFIG": json.dumps(
                cluster.ClusterConfig(jobs, "ps", 0).to_tf_config()
            ),
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    script = (
        "import keras, keras_psdist as kpd\n"
        "s = kpd.PSStrategy(mode='between-graph', init_timeout=3)\n"
        "with s.scope():\n"
        "    keras.layers.Dense(2).build((None, 3))\n"
    )
    worker_script = tmp_path / "worker.py"
    worker_script.write_text(script)
    try:
        worker = subprocess.run(
            [*python, str(worker_script)],
            env={
                **env,
                "TF_CONFIG": json.dumps(
                    cluster.ClusterConfig(jobs, "worker", 1).to_tf_config()
                ),
            },
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    assert worker.returncode != 0
    assert "Waited 3 s for the chief (worker:0)" in worker.stderr, worker.stderr[-3000:]


PARTIAL_BATCHES_JOB = Path(__file__).parent / "cluster_jobs" / "partial_batches_job.py"


@pytest.fixture(scope="module")
def partial_batches_launch(async_run):
    """The async digits launch's next runs: an async PSStrategy run, then a
    SyncReplicaStrategy run, on its 2 workers."""
    return async_run[1] / "partial_batches"


@pytest.mark.xdist_group("between_graph_cluster")
@pytest.mark.parametrize("kind", ["async", "sync"])
def test_between_graph_workers_skip_batches_too_small_to_reach_them(
    partial_batches_launch, kind
):
    """Every layer type on global batches of 4, 1, 4 over 2 worker processes
    (async PSStrategy, SyncReplicaStrategy): worker 1 gets nothing of the batch
    of one and skips that step; no process runs a kernel on an empty batch,
    and each epoch still trains on every example exactly once."""
    reports = [
        json.loads(p.read_text())
        for p in sorted(partial_batches_launch.glob(f"{kind}_worker_*.json"))
    ]
    assert [r["worker"] for r in reports] == [0, 1]
    assert all(r["finite"] for r in reports)
    total = sum(layer_zoo.batch_sizes(2))
    per_epoch = [
        sum(epoch) for epoch in zip(*(r["examples"] for r in reports), strict=True)
    ]
    assert per_epoch == [total, total], reports
    # Worker 0 trained on the batch of one, worker 1 did not.
    assert reports[0]["examples"][0] == reports[1]["examples"][0] + 1
