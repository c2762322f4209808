"""Elastic membership (`PSStrategy(mode="between-graph", max_workers=M)`,
`SyncReplicaStrategy(max_workers=M)`, `keras-psdist launch --max-workers`):
workers join and leave a running job during one `fit` of the chief, every
update counted; bad joiners are refused without touching the job.

`cluster_jobs/elastic_job.py` says what each process does. One launch per
kind (async, sync): 2 workers grow to 4, two bad joiners are refused, 4
shrink to 3, then the chief ends the run.
"""

import json

import launching  # tests/cluster_jobs, see conftest.py
import numpy as np
import pytest

from keras_psdist.cluster.launcher.arguments import check_max_workers

pytestmark = pytest.mark.multiprocess

JOB = launching.Path(__file__).parent / "cluster_jobs" / "elastic_job.py"
LR = 2.0**-6


def _run(tmp_path_factory, kind):
    out = tmp_path_factory.mktemp(f"elastic_{kind}")
    code, log = launching.launch_job(
        JOB,
        [out, 0, kind, 0.05],
        num_ps=1,
        num_workers=2,
        mode="between-graph",
        max_workers=4,
        timeout_s=400,
    )
    assert code == 0, (
        f"launch exited {code}:\n{launching.without_progress(log)[-8000:]}"
    )
    chief = json.loads((out / "chief.json").read_text())
    workers = {k: json.loads((out / f"worker_{k}.json").read_text()) for k in (1, 2, 3)}
    tensorboard = {}
    for path in (out / "tensorboard").glob("events.out.tfevents.*"):
        import tensorflow as tf

        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                number = tf.make_ndarray(value.tensor).item()
                tensorboard.setdefault(value.tag, []).append((event.step, number))
    chief["tensorboard"] = tensorboard
    return chief, workers, log


@pytest.fixture(scope="module")
def async_run(tmp_path_factory):
    return _run(tmp_path_factory, "async")


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory):
    return _run(tmp_path_factory, "sync")


@pytest.mark.xdist_group("elastic_async")
def test_the_final_weights_are_the_updates_every_worker_applied(async_run):
    """Each update of worker k subtracts exactly 2**-6 * (k + 1) from every
    weight: the weights account for every counted update, none lost or
    counted twice."""
    chief, _, _ = async_run
    applied = chief["applied"]
    assert all(a > 0 for a in applied), applied
    expected = -LR * sum((k + 1) * a for k, a in enumerate(applied))
    np.testing.assert_array_equal(chief["weights"], [expected] * 4)


def _grew_to_4_then_shrank_to_3(chief):
    """The chief's report saw 2, then 4, then 3 workers, in that order."""
    counts = [n for _, n in chief["events"]]
    sequence = [n for i, n in enumerate(counts) if i == 0 or counts[i - 1] != n]
    position = 0
    for wanted in (2, 4, 3):
        position = sequence.index(wanted, position) + 1


@pytest.mark.xdist_group("elastic_async")
def test_workers_join_and_leave_during_one_fit(async_run):
    chief, workers, log = async_run
    # Grown to 4 (both joiners applied updates), shrunk to 3, then ended.
    assert set(chief["join_s"]) == {"2", "3"}
    assert chief["states"] == [2, 2, 2, 2]  # every slot left cleanly at the end
    # What each worker counted of itself is what the chief read.
    for k, report in workers.items():
        assert report["applied"][k] == chief["applied"][k]
    _grew_to_4_then_shrank_to_3(chief)
    # TensorBoard has the same changes, at the chief's steps.
    written = chief["tensorboard"]["membership/num_workers"]
    assert [[step, n] for step, n in written] == [list(e) for e in chief["events"]]
    assert "worker:2 joined" in log and "worker:3 joined" in log
    assert "worker:3 left" in log
    assert "is lost" not in log  # a worker that left is not lost
    assert "adding worker:2" in log and "asked worker:3 to leave" in log


@pytest.mark.xdist_group("elastic_async")
def test_a_joiner_with_a_bad_tf_config_is_refused_without_disturbing_the_job(
    async_run,
):
    # (Admitted or refused before it touches anything of the mode: the
    # sync launch does not repeat it.)
    chief, _, _ = async_run
    (live_code, live_out), (beyond_code, beyond_out) = chief["refused"]
    assert live_code != 0 and "JoinRefusedError" in live_out, live_out
    assert "worker:1 is already training in this job" in live_out
    assert beyond_code != 0 and "JoinRefusedError" in beyond_out, beyond_out
    assert "max_workers=4" in beyond_out
    assert "the bad joiner was admitted" not in live_out + beyond_out
    assert chief["members_after_refusals"] == [0, 1, 2, 3]
    assert chief["version_unchanged"] is True


# ------------------------------------------------------------ sync replicas


@pytest.mark.xdist_group("elastic_sync")
def test_sync_the_final_weights_are_the_updates_the_chief_made(sync_run):
    """Each update subtracts exactly 2**-6 (the mean of gradients that are
    all 1), whatever its counts: the weights say how many updates were
    applied, none lost or applied twice."""
    chief, _, _ = sync_run
    # Every update audited, each named with its inputs if it is not -LR.
    assert chief["audited_updates"] == chief["global_step"]
    assert chief["wrong_updates"] == []
    np.testing.assert_array_equal(chief["weights"], [-LR * chief["global_step"]] * 4)


@pytest.mark.xdist_group("elastic_sync")
def test_sync_every_gradient_is_applied_or_dropped_once(sync_run):
    """Per slot, what its worker sent is what the chief applied plus what it
    dropped; and the gradients applied are, update by update, the counts in
    force (`replicas_to_aggregate` at each change)."""
    chief, workers, _ = sync_run
    for k, report in [(0, chief), *workers.items()]:
        assert report["sent"] == chief["applied"][k] + chief["dropped"][k], k
    changes = chief["count_changes"]  # [global step from which, n, R]

    def in_force(update):
        return [r for step, _, r in changes if step <= update][-1]

    assert sum(chief["applied"]) == sum(map(in_force, range(chief["global_step"])))
    assert all(a > 0 for a in chief["applied"][1:]), chief["applied"]


@pytest.mark.xdist_group("elastic_sync")
def test_sync_counts_follow_the_workers_at_step_boundaries(sync_run):
    """ "all_but_one": 1 of 2 workers, 2 of 3, 3 of 4, 2 of 3 again; said in
    the log and written to TensorBoard at the chief's steps."""
    chief, _, log = sync_run
    _grew_to_4_then_shrank_to_3(chief)
    seen = [(n, r) for _, n, r in chief["count_changes"]]
    position = 0
    for wanted in [(2, 1), (3, 2), (4, 3), (3, 2)]:
        position = seen.index(wanted, position) + 1
    assert all(r == max(1, n - 1) for n, r in seen)
    assert "4 workers: replicas_to_aggregate=3, backups=1, num_byzantine=0" in log
    assert "worker:2 joined at global step" in log
    assert "is lost" not in log
    written = [n for _, n in chief["tensorboard"]["membership/replicas_to_aggregate"]]
    assert 3 in written and written[0] == 1


def test_sync_refuses_more_replicas_to_aggregate_than_workers_when_elastic(
    monkeypatch,
):
    from keras_psdist import cluster, modes
    from keras_psdist.cluster.config import LAUNCH_MODE_ENV

    monkeypatch.delenv(LAUNCH_MODE_ENV, raising=False)
    config = cluster.ClusterConfig(FOUR, "worker", 1)
    arguments = modes.Arguments(
        cluster_resolver=config, max_workers=6, replicas_to_aggregate=5
    ).checked()
    with pytest.raises(
        ValueError,
        match=r"replicas_to_aggregate=5 is more than the 4 workers.*'all_but_one'",
    ):
        modes.SyncReplicasMode(arguments, "SyncReplicaStrategy").validate()


# ---------------------------------------------------------------- in-graph

INGRAPH_JOB = launching.Path(__file__).parent / "cluster_jobs" / "ingraph_resize_job.py"


def test_in_graph_a_later_strategy_changes_the_workers_in_place(tmp_path):
    """In-graph, the chief's replicas are fixed per strategy; between fits a
    new strategy over more or fewer workers connects in place (TensorFlow's
    `update_server_def`): 2 -> 3 -> 2 replicas, the weights carried over,
    the first model's ps variables still there; moving a task is refused."""
    code, log = launching.launch_job(
        INGRAPH_JOB, [tmp_path], num_ps=1, num_workers=3, timeout_s=300
    )
    assert code == 0, (
        f"launch exited {code}:\n{launching.without_progress(log)[-8000:]}"
    )
    report = json.loads((tmp_path / "report.json").read_text())
    phases = report["phases"]
    assert [p["replicas"] for p in phases] == [2, 3, 2]
    for before, after in zip(phases, phases[1:], strict=False):
        # The weights carried over: the next phase starts where this one ended.
        assert after["before"] == pytest.approx(before["after"], rel=1e-5)
    assert phases[-1]["after"] < phases[0]["before"] / 10
    assert report["first_model_after"] == pytest.approx(phases[0]["after"], rel=1e-6)
    assert "a later strategy puts worker:1 at" in report["moved_worker"]
    assert "keep each worker's index and address" in report["moved_worker"]
    assert report["other_ps"] != "accepted"


@pytest.mark.parametrize(
    "mode, num_workers, max_workers, message",
    [
        ("in-graph", 2, 4, "between-graph run"),
        ("between-graph", 3, 2, "at least the starting number"),
        ("between-graph", 2, True, "must be an integer"),
    ],
)
def test_the_launcher_refuses_a_bad_max_workers(
    mode, num_workers, max_workers, message
):
    with pytest.raises(ValueError, match=message):
        check_max_workers(mode, num_workers, max_workers)


FOUR = {"ps": ["127.0.0.1:1"], "worker": [f"127.0.0.1:{p}" for p in (2, 3, 4, 5)]}


@pytest.mark.parametrize(
    "mode_class, extra", [("BoundedStalenessMode", {"max_staleness": 2})]
)
def test_modes_that_are_not_elastic_refuse_max_workers(monkeypatch, mode_class, extra):
    from keras_psdist import cluster, modes
    from keras_psdist.cluster.config import LAUNCH_MODE_ENV

    monkeypatch.delenv(LAUNCH_MODE_ENV, raising=False)
    config = cluster.ClusterConfig(FOUR, "worker", 1)
    arguments = modes.Arguments(
        cluster_resolver=config, max_workers=4, **extra
    ).checked()
    with pytest.raises(ValueError, match="max_workers=4 lets workers join"):
        getattr(modes, mode_class)(arguments, "PSStrategy").validate()


def test_one_host_refuses_max_workers():
    import keras_psdist as kpd

    with pytest.raises(ValueError, match="max_workers=4 lets workers join"):
        kpd.PSStrategy(max_workers=4)


def test_a_slot_beyond_max_workers_is_refused_before_connecting(monkeypatch):
    from keras_psdist import cluster, modes
    from keras_psdist.cluster.config import LAUNCH_MODE_ENV
    from keras_psdist.errors import JoinRefusedError

    monkeypatch.delenv(LAUNCH_MODE_ENV, raising=False)
    config = cluster.ClusterConfig(FOUR, "worker", 3)
    arguments = modes.Arguments(cluster_resolver=config, max_workers=3).checked()
    mode = modes.BetweenGraphMode(arguments, "PSStrategy")
    with pytest.raises(JoinRefusedError, match=r"worker index 3.*max_workers=3"):
        mode.validate()


def test_the_launcher_gives_max_workers_to_the_strategy(monkeypatch):
    from keras_psdist import modes
    from keras_psdist.cluster.config import MAX_WORKERS_ENV

    monkeypatch.setenv(MAX_WORKERS_ENV, "6")
    assert modes.Arguments().checked().max_workers == 6
    monkeypatch.delenv(MAX_WORKERS_ENV)
    assert modes.Arguments().checked().max_workers is None
