"""A worker's end of a session, its watchdog, and its wait for a release, in
sync-replica training (in one process).

The chief's end is everyone's: once the chief's `fit` has ended, no update
comes, so a worker still training (a straggler that backup workers left
behind, or one the chief counted lost) must stop at its next step or wait,
not run out its epochs with every gradient dropped. What each piece does
about it is checked on its own here: the worker's wait and step (a real
`SyncReplicas`, its queues in this process), its watchdog and the stop of
its `fit` (the shared state replaced by a recorder). The whole protocol
across processes is tested in `test_sync_replicas.py` and `test_faults.py`.
"""

import itertools
import logging
import threading
import types

import keras
import pytest
import tensorflow as tf

from keras_psdist.integration import training_hooks
from keras_psdist.sync import protocol
from keras_psdist.sync.protocol import SyncConfig
from keras_psdist.sync.training import SyncTraining

pytestmark = pytest.mark.waits


# ------------------------------------- the watchdog and the stop of a fit


class _Value:
    def __init__(self, value):
        self.value = value

    def numpy(self):
        return self.value


class _FakeSync:
    """A worker's view of the shared state: what the chief finished, and
    what this worker knows of it."""

    def __init__(self, finished_session, is_chief=False):
        self.config = SyncConfig(2, 3, step_timeout=120.0)
        self.worker = 0 if is_chief else 2
        self.is_chief = is_chief
        self.device = "/job:ps/task:0/device:CPU:0"
        self.finished = _Value(finished_session)
        self.global_step = _Value(96)
        self.ended = []  # sessions the watchdog ended here
        self.known_end = 0  # the last session this worker knows ended
        self.skipped = 0
        self.markers = []

    def end_session(self, session):
        self.ended.append(session)
        self.known_end = max(self.known_end, session)

    def session_ended(self, session):
        return self.known_end >= session

    def steps_skipped(self):
        return self.skipped

    def send_marker(self, kind, worker=None):
        self.markers.append(kind)


class _Heartbeats:
    """Every worker beating: the chief is alive."""

    timeout = 3.0

    def lost(self):
        return []


def _worker(finished_session, is_chief=False):
    sync = _FakeSync(finished_session, is_chief)
    sync.is_chief = False  # no chief's reduction to build
    training = SyncTraining(
        strategy=None,
        sync=sync,
        aggregator=None,
        attack=None,
        parameter_devices=(),
        heartbeats=_Heartbeats(),
        config=types.SimpleNamespace(task_name=sync.config.name(sync.worker)),
    )
    sync.is_chief = is_chief
    training._session = 1  # inside its first fit
    return training, sync


class _Fit:
    """A Keras `fit` of `epochs` x `steps`, as `_Progress` (the callback the
    sync `fit` adds) sees it."""

    def __init__(self, training, steps=25, epochs=2, initial_epoch=0):
        self.model = types.SimpleNamespace(stop_training=False)
        self.callback = training_hooks._Progress(training)
        self.callback.set_model(self.model)
        self.callback.set_params({"steps": steps, "epochs": epochs, "verbose": 0})
        self.callback.on_train_begin()
        self.epoch = initial_epoch - 1

    def run(self, steps):
        """Runs the next `steps` steps of the epoch, a new epoch first."""
        self.epoch += 1
        self.callback.on_epoch_begin(self.epoch)
        for batch in range(steps):
            self.callback.on_train_batch_begin(batch)
            self.callback.on_train_batch_end(batch)
            if self.model.stop_training:
                return


@pytest.fixture
def said(capsys, caplog):
    """`said()`: what the test's code said since the last call, printed or
    logged (absl's logger, whose level a command line parsed in this
    process may have raised), and the records of it that are warnings."""
    seen = 0

    def since_last():
        nonlocal seen
        records = caplog.records[seen:]
        seen = len(caplog.records)
        logged = "".join(r.getMessage() + "\n" for r in records)
        warnings = [r for r in records if r.levelno >= logging.WARNING]
        return capsys.readouterr().out + logged, warnings

    with caplog.at_level(logging.INFO, logger="absl"):
        yield since_last


@pytest.mark.timeout(60)
def test_the_watchdog_ends_a_session_the_chief_finished():
    training, sync = _worker(finished_session=1)
    # The chief is alive (it beats), yet no update of this fit will come.
    assert training._check_liveness() is None
    assert sync.ended == [1]  # its next step sends nothing


@pytest.mark.timeout(60)
def test_a_session_the_chief_still_serves_goes_on():
    training, sync = _worker(finished_session=0)
    assert training._check_liveness() is None
    assert sync.ended == []
    fit = _Fit(training)
    fit.run(25)
    assert not fit.model.stop_training


@pytest.mark.timeout(60)
@pytest.mark.parametrize("finished_session", [0, 1])
def test_a_lost_chief_is_reported_unless_it_finished_the_session(finished_session):
    """A chief that finished its fit may exit before this worker leaves:
    its silence then is no fault."""

    class _ChiefLost(_Heartbeats):
        def lost(self):
            return [0]

        def silent_for(self, worker):
            return 4.0

    training, sync = _worker(finished_session)
    training._heartbeats = _ChiefLost()
    reason = training._check_liveness()
    if finished_session:
        assert reason is None and sync.ended == [1]
    else:
        assert "the chief (worker:0) is lost" in reason


def _end_at(sync, step_count):
    """The end token comes in the wait of the fit's `step_count`-th step."""
    original = sync.session_ended
    calls = iter(range(1, 10**6))

    def session_ended(session):
        if next(calls) >= step_count:
            sync.known_end = 1
        return original(session)

    sync.session_ended = session_ended


@pytest.mark.timeout(60)
@pytest.mark.parametrize("interactive", [True, False])
def test_a_straggler_stops_its_fit_and_says_why_not_as_a_warning(interactive, said):
    """Nothing is wrong: it is said as Keras says `early stopping` (printed,
    or logged at INFO when Keras logs instead of printing), once, with the
    steps the fit did not run."""
    training, sync = _worker(finished_session=1)
    _end_at(sync, 34)  # in its second epoch
    was = keras.config.is_interactive_logging_enabled()
    if not interactive:
        keras.config.disable_interactive_logging()
    try:
        fit = _Fit(training)
        fit.run(25)
        assert not fit.model.stop_training
        fit.run(25)
        # steps_per_execution > 1: the next batch end is said nothing more.
        fit.callback.on_train_batch_end(9)
    finally:
        if was:
            keras.config.enable_interactive_logging()
    assert fit.model.stop_training
    text, warnings = said()
    assert warnings == []
    assert text.count("stops its fit early") == 1, text
    assert (
        "keras_psdist sync-replicas: worker:2 stops its fit early: the chief "
        "finished its fit at global step 96, and no update comes after the "
        "chief's last, so this worker's remaining steps would only be dropped. "
        "It ran 34 of its 50 steps: 16 not run." in text
    )
    training._end(failed=False)
    assert sync.markers == [protocol.LEAVE]  # it leaves, as at any end
    assert said()[0] == ""  # nothing more said


@pytest.mark.timeout(60)
def test_a_resumed_fit_counts_from_its_initial_epoch(said):
    training, sync = _worker(finished_session=1)
    _end_at(sync, 5)
    fit = _Fit(training, steps=25, epochs=3, initial_epoch=1)  # BackupAndRestore
    fit.run(25)
    assert fit.model.stop_training
    assert "It ran 5 of its 50 steps: 45 not run." in said()[0]


@pytest.mark.timeout(60)
def test_a_fit_of_unknown_length_says_how_far_it_got(said):
    training, sync = _worker(finished_session=1)
    sync.known_end = 1
    assert training.progress(9, None)
    assert "It ran 9 steps; the rest of its epochs are not run." in said()[0]


@pytest.mark.timeout(60)
def test_a_fit_ended_at_its_last_step_is_not_said_to_stop_early(said):
    training, sync = _worker(finished_session=1)
    _end_at(sync, 50)
    fit = _Fit(training)
    fit.run(25)
    fit.run(25)
    training._end(failed=False)
    assert said()[0] == ""


@pytest.mark.timeout(60)
def test_the_chief_is_never_stopped_early(said):
    training, sync = _worker(finished_session=0, is_chief=True)
    sync.known_end = 1
    fit = _Fit(training)
    fit.run(25)
    assert not fit.model.stop_training and said()[0] == ""


@pytest.mark.timeout(60)
def test_a_custom_loop_left_behind_says_its_steps_sent_nothing(said):
    # No Keras fit to stop: its steps after the chief's end skip the push
    # and the wait, and the end of the loop says how many.
    training, sync = _worker(finished_session=1)
    sync.known_end = 1
    sync.skipped = 3
    training._end(failed=False)
    text, warnings = said()
    assert warnings == []
    assert (
        "worker:2: the chief finished its fit (global step 96) before this "
        "worker's loop ended; its last 3 steps sent nothing" in text
    )


# ------------------------------------------- a worker's step and its wait

_namespaces = itertools.count()
DEVICE = "/job:localhost/replica:0/task:0/device:CPU:0"


@pytest.fixture
def sync():
    """A worker's `SyncReplicas` (worker 1 of 2), in its first session, its
    shared state in this process under a fresh namespace."""
    from keras_psdist.cluster.shared_variables import SharedVariables

    sync = protocol.SyncReplicas(
        SyncConfig(2, 2, step_timeout=60.0),
        worker=1,
        is_chief=True,  # it creates the shared state
        device=DEVICE,
        shared=SharedVariables(True, "worker:0", 10.0),
        local_device=DEVICE,
        namespace=f"keras_psdist/test_wait_{next(_namespaces)}",
    )
    assert sync.begin_session() == 1
    return sync


def _enqueue_token(sync, value):
    protocol.enqueue(DEVICE, sync.token_queues[1], [tf.constant(value, tf.int64)])


def _wait_in_thread(sync, tag):
    """Starts the wait of a step tagged `tag`; returns `done` (an Event) and
    `finish(timeout)`, which joins it and, if it is still blocked, frees it
    (it then fails) so that the test ends."""

    @tf.function
    def wait():
        tag_, session = tf.constant(tag, tf.int64), tf.constant(1, tf.int64)
        sync._note(sync._wait_for_release(tag_, session), session)

    done = threading.Event()
    thread = threading.Thread(target=lambda: (wait(), done.set()), daemon=True)
    thread.start()

    def finish(timeout):
        thread.join(timeout=timeout)
        if not done.is_set():
            sync.poison([1])
            thread.join(timeout=30)
        return done.is_set()

    return done, finish


@pytest.mark.timeout(120)
def test_a_wait_behind_a_leftover_token_ends_when_the_step_has_moved(sync):
    """A token no newer than the worker's tag sits in its queue (left by an
    earlier wake), so the chief's release skipped the queue (it fills empty
    queues only). The update was made: the global step is past the tag. The
    wait must see the step and end, not block for a token that never comes
    (that left two workers each waiting for the other until step_timeout)."""
    sync.global_step.assign(5)  # the update past tag 4 was made...
    _enqueue_token(sync, 3)  # ...not sent
    _, finish = _wait_in_thread(sync, tag=4)
    assert finish(timeout=30), "the wait blocked behind the leftover token"
    assert int(sync._local_step.numpy()) == 5  # goes on from the new step
    assert not sync.session_ended(1)


@pytest.mark.timeout(120)
def test_a_blocked_wait_ends_at_its_sessions_end_token(sync):
    """The straggler waits for an update that will not come (the chief's
    fit ended): the end token frees it, and it knows its session is over."""
    done, finish = _wait_in_thread(sync, tag=0)
    assert not done.wait(timeout=2)  # nothing in its queue: it waits
    sync.mark_finished(1)
    _enqueue_token(sync, protocol.END + 1)
    assert finish(timeout=30), "the end token did not end the wait"
    assert sync.session_ended(1)


@pytest.mark.timeout(120)
def test_an_end_token_of_an_earlier_session_is_a_leftover(sync):
    """It came after its worker had moved on to its next fit (the chief sent
    it before it handled the worker's leave): the wait goes on as behind any
    leftover token, and the session is not taken for ended."""
    sync.begin_session()  # session 2
    _enqueue_token(sync, protocol.END + 1)

    @tf.function
    def wait():
        tag, session = tf.constant(0, tf.int64), tf.constant(2, tf.int64)
        sync._note(sync._wait_for_release(tag, session), session)

    done = threading.Event()
    thread = threading.Thread(target=lambda: (wait(), done.set()), daemon=True)
    thread.start()
    assert not done.wait(timeout=2), "an earlier session's end ended this wait"
    sync.global_step.assign(1)
    _enqueue_token(sync, 1)  # the release of update 1
    thread.join(timeout=30)
    if not done.is_set():
        sync.poison([1])
        thread.join(timeout=30)
    assert done.is_set()
    assert not sync.session_ended(2)
    assert int(sync._local_step.numpy()) == 1


@pytest.mark.timeout(120)
def test_a_release_ahead_of_the_end_token_still_ends_the_session(sync):
    """The last release sat in the queue before the end token: the wait
    takes the release (the new step, with no read of the ps), and the next
    step reads that the chief has finished beside its compute, so it does
    not push (over a slow link, seconds) before it finds the end token."""
    sync.global_step.assign(7)
    _enqueue_token(sync, 7)
    sync.mark_finished(1)
    _enqueue_token(sync, protocol.END + 1)
    _, finish = _wait_in_thread(sync, tag=6)
    assert finish(timeout=30)
    assert int(sync._local_step.numpy()) == 7
    variable = tf.Variable(tf.zeros([3]))

    @tf.function
    def step():
        sync.worker_step([tf.ones([3])], [variable])

    step()  # returns at once: it neither pushes nor waits
    queue = sync.gradient_queue(sync.layout)
    assert int(tf.raw_ops.QueueSizeV2(handle=queue).numpy()) == 0
    assert sync.steps_skipped() == 1
    assert sync.session_ended(1)


@pytest.mark.timeout(120)
def test_a_step_after_the_end_sends_nothing_and_waits_for_nothing(sync):
    variable = tf.Variable(tf.zeros([3]))

    @tf.function
    def step():
        sync.worker_step([tf.ones([3])], [variable])

    def queued():
        queue = sync.gradient_queue(sync.layout)
        return int(tf.raw_ops.QueueSizeV2(handle=queue).numpy())

    sync.end_session(1)  # what the watchdog does when it sees `finished`
    done = threading.Event()
    thread = threading.Thread(target=lambda: (step(), done.set()), daemon=True)
    thread.start()
    thread.join(timeout=30)
    if not done.is_set():
        sync.poison([1])
        thread.join(timeout=30)
    assert done.is_set(), "the step waited for a release"
    assert queued() == 0
    assert sync.steps_skipped() == 1


@pytest.mark.timeout(120)
def test_a_session_the_chief_finished_before_it_began_is_ended_at_once(sync):
    """A straggler slow to start (or restarted) begins a fit the chief has
    already finished: its end token, if any, is flushed with the rest, and
    `finished` says it all the same."""
    sync.mark_finished(2)
    _enqueue_token(sync, protocol.END + 2)
    assert sync.begin_session() == 2
    assert sync.session_ended(2)
    queue = sync.token_queues[1]
    assert int(tf.raw_ops.QueueSizeV2(handle=queue).numpy()) == 0
    sync.begin_session()  # the next fit is its own
    assert not sync.session_ended(3)


# ------------------------------- the end of a fit that failed by a lost ps


class _Registry:
    """An elastic registry whose `left()` waits on a ps that is gone."""

    names = ("chief:0", "worker:1", "worker:2")
    slot = 2

    def __init__(self):
        self.release = threading.Event()
        self.lefts = 0

    def rejoin(self):
        pass

    def left(self):
        self.lefts += 1
        self.release.wait(60)


@pytest.mark.timeout(120)
def test_a_sync_fit_failed_by_a_lost_ps_raises_its_error_and_leaves_nothing(
    fit_failing_with,
):
    from keras_psdist.errors import TaskLostError

    training, sync = _worker(finished_session=0)
    registry = _Registry()
    training._registry = registry
    sync.begin_session = lambda: 1
    lost = {"ps:0": "127.0.0.1:1 (Connection refused)"}
    sync.servers_lost = lambda: lost
    error = TaskLostError(lost, "worker:2")
    raised = fit_failing_with(error, training)
    registry.release.set()
    assert raised is error, f"the fit raised {raised!r} (None: it hung)"
    assert registry.lefts == 0
