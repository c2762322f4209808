"""A worker's watchdog, and its wait for a release, in sync-replica
training (in one process).

The shared state on the ps is replaced by a recorder, so what the watchdog
does at each look is checked on its own; the whole protocol across processes
is tested in `test_sync_replicas.py` and `test_faults.py`.

The case here: the chief finished a `fit` while it counted this worker lost
(its heartbeat had stopped for `heartbeat_timeout`: restarted near the end,
or starved of CPU). No update of that fit will come for the worker, whether
or not the chief's process is still there to pop its gradients, so its fit
must end, not wait for `step_timeout`.
"""

import types

import pytest

from keras_psdist.sync import protocol
from keras_psdist.sync.protocol import SyncConfig
from keras_psdist.sync.training import SyncTraining


class _Value:
    def __init__(self, value):
        self.value = value

    def numpy(self):
        return self.value


class _FakeSync:
    """A worker's view of the shared state: what the chief finished, and the
    passes sent to this worker's token queue."""

    def __init__(self, finished_session):
        self.config = SyncConfig(2, 3, step_timeout=120.0)
        self.worker = 2
        self.is_chief = False
        self.device = "/job:ps/task:0/device:CPU:0"
        self.finished = _Value(finished_session)
        self.passes = []

    def free(self, worker):
        self.passes.append((worker, protocol.FREE_PASS))


class _Heartbeats:
    """Every worker beating: the chief is alive."""

    timeout = 3.0

    def lost(self):
        return []


def _worker(finished_session, model):
    sync = _FakeSync(finished_session)
    training = SyncTraining(
        strategy=None,
        sync=sync,
        aggregator=None,
        attack=None,
        parameter_devices=(),
        heartbeats=_Heartbeats(),
        config=types.SimpleNamespace(task_name="worker:2"),
    )
    training._session = 1  # inside its first fit
    training._model = model
    return training, sync


def test_a_fit_the_chief_finished_without_this_worker_stops_and_is_let_go():
    model = types.SimpleNamespace(stop_training=False)
    training, sync = _worker(finished_session=1, model=model)
    # The chief is alive (it beats), yet the worker must not wait for it.
    assert training._check_liveness() is None
    assert model.stop_training
    assert sync.passes == [(2, protocol.FREE_PASS)]
    # One pass per look while the fit lasts: with steps_per_execution > 1 a
    # fit has several waits left.
    assert training._check_liveness() is None
    assert sync.passes == [(2, protocol.FREE_PASS)] * 2


def test_a_fit_the_chief_still_serves_goes_on():
    model = types.SimpleNamespace(stop_training=False)
    training, sync = _worker(finished_session=0, model=model)
    assert training._check_liveness() is None
    assert not model.stop_training
    assert sync.passes == []


def test_a_custom_loop_left_behind_stalls_with_the_reason():
    # No Keras model to stop: the loop's wait times out, and says why.
    training, _ = _worker(finished_session=1, model=None)
    assert training._check_liveness() is None
    reason = training._stall_reason(idle=121.0)
    assert "worker:2: no step finished for 121 s" in reason
    assert "chief finished this run without this worker" in reason
    assert "heartbeat_timeout" in reason


@pytest.mark.parametrize("finished_session", [0, 1])
def test_a_lost_chief_is_reported_unless_the_fit_was_let_go(finished_session):
    class _ChiefLost(_Heartbeats):
        def lost(self):
            return [0]

        def silent_for(self, worker):
            return 4.0

    model = types.SimpleNamespace(stop_training=False)
    training, _ = _worker(finished_session, model)
    training._heartbeats = _ChiefLost()
    reason = training._check_liveness()
    if finished_session:
        assert reason is None and model.stop_training  # finished, then left
    else:
        assert "the chief (worker:0) is lost" in reason


# ------------------------------------------ a worker's wait for its release


def test_a_wait_behind_a_leftover_token_ends_when_the_step_has_moved():
    """A token no newer than the worker's tag sits in its queue (left by an
    earlier wake), so the chief's release skipped the queue (it fills empty
    queues only). The update was made: the global step is past the tag. The
    wait must see the step and end, not block for a token that never comes
    (that left two workers each waiting for the other until step_timeout)."""
    import threading

    import tensorflow as tf

    from keras_psdist.cluster.shared_variables import SharedVariables

    device = "/job:localhost/replica:0/task:0/device:CPU:0"
    sync = protocol.SyncReplicas(
        SyncConfig(2, 2, step_timeout=60.0),
        worker=1,
        is_chief=True,
        device=device,
        shared=SharedVariables(True, "worker:0", 10.0),
        local_device=device,
        namespace="keras_psdist/test_wait",
    )
    queue = sync.token_queues[1]
    sync.global_step.assign(5)  # the update past tag 4 was made...
    protocol.enqueue(device, queue, [tf.constant(3, tf.int64)])  # ...not sent

    @tf.function
    def wait():
        sync._wait_for_release(tf.constant(4, tf.int64))

    done = threading.Event()
    thread = threading.Thread(target=lambda: (wait(), done.set()), daemon=True)
    thread.start()
    thread.join(timeout=30)
    if not done.is_set():
        sync.poison([1])  # frees the blocked wait (it then fails), for cleanup
        thread.join(timeout=30)
    assert done.is_set(), "the wait blocked behind the leftover token"
    assert int(sync._local_step.numpy()) == 5  # goes on from the new step
