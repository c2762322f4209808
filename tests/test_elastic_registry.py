"""The elastic registry's slots (`keras_psdist.cluster.elastic.SlotTable`) in
one process: the local CPU stands in for the ps task, and `SlotTable` objects
opened in one resource container play the processes of a job (the resources
are real and shared, as on a ps task)."""

import itertools
import threading

import pytest
import tensorflow as tf

from keras_psdist.cluster.elastic import LEFT, MEMBER, SlotTable
from keras_psdist.cluster.shared_variables import SharedVariables
from keras_psdist.errors import JoinRefusedError

pytestmark = pytest.mark.waits

DEVICE = "/job:localhost/replica:0/task:0/device:CPU:0"
NAMES = ("chief:0", "worker:1", "worker:2")
SLOT = 1
PERIOD = 0.1
_containers = itertools.count()


def _job(processes):
    """`processes` registries that share one registry (the first creates it,
    as the chief does), all for slot 1, and the job's heartbeat vector."""
    container = f"test_elastic_registry_{next(_containers)}"
    registries = [
        SlotTable(
            SharedVariables(p == 0, "chief:0", 10.0, container=container),
            DEVICE,
            SLOT,
            len(NAMES),
            names=NAMES,
        )
        for p in range(processes)
    ]
    with tf.device(DEVICE):
        beats = tf.Variable(tf.zeros([len(NAMES)], tf.int64))
    return registries, beats


def _beat(beats):
    beats.assign_add(tf.one_hot(SLOT, len(NAMES), dtype=tf.int64))


def _admit_all(registries, beats, timeout):
    """Admits every registry at once, each in its thread; returns each one's
    outcome (None: admitted, else the error)."""
    outcomes = [None] * len(registries)
    start = threading.Barrier(len(registries))

    def admit(i):
        start.wait()
        try:
            registries[i].admit(beats, PERIOD, timeout)
        except Exception as e:  # noqa: BLE001 (kept for the assertions)
            outcomes[i] = e

    threads = [
        threading.Thread(target=admit, args=(i,), daemon=True)
        for i in range(len(registries))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "an admit hung"
    return outcomes


@pytest.mark.timeout(120)
def test_two_joiners_that_find_the_holder_gone_take_its_slot_once():
    (holder, *joiners), beats = _job(3)
    holder.admit(beats, PERIOD, timeout=0.5)
    _beat(beats)  # ... then it dies: its beat stands still.
    outcomes = _admit_all(joiners, beats, timeout=0.5)

    admitted = [j for j, o in zip(joiners, outcomes, strict=True) if o is None]
    refused = [o for o in outcomes if o is not None]
    assert len(admitted) == 1, f"outcomes: {outcomes}"
    assert len(refused) == 1 and isinstance(refused[0], JoinRefusedError), outcomes
    message = str(refused[0])
    assert "another process took worker:1 while this one was being admitted" in (
        message
    )
    assert "free worker index below max_workers=3" in message
    (winner,) = admitted
    state, holder_token, _ = winner.look(SLOT)
    assert (state, holder_token) == (MEMBER, winner.token)
    # The old holder, were it alive, may not train as worker:1 again, nor
    # mark the new holder's slot left.
    holder.left()
    assert winner.look(SLOT)[:2] == (MEMBER, winner.token)
    with pytest.raises(JoinRefusedError, match="another process has taken worker:1"):
        holder.rejoin()


@pytest.mark.timeout(120)
def test_a_holder_whose_beat_pauses_as_long_as_a_ps_flap_keeps_its_slot():
    # Heartbeats pause while the holder finds a ps lost, up to its server
    # watch's grace (`heartbeat_timeout`) and the watch's looks: a pause a
    # little longer than the timeout is a live process.
    timeout = 2.0
    (holder, joiner), beats = _job(2)
    holder.admit(beats, PERIOD, timeout)
    _beat(beats)
    paused = threading.Event()

    def flap_then_beat():
        paused.set()
        stop.wait(timeout + 1.0)
        while not stop.is_set():
            _beat(beats)
            stop.wait(PERIOD)

    stop = threading.Event()
    thread = threading.Thread(target=flap_then_beat, daemon=True)
    thread.start()
    try:
        paused.wait()
        with pytest.raises(JoinRefusedError, match="worker:1 is already training"):
            joiner.admit(beats, PERIOD, timeout)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert holder.look(SLOT)[:2] == (MEMBER, holder.token)


@pytest.mark.timeout(60)
def test_a_slot_left_by_its_holder_is_taken_at_once():
    (holder, joiner), beats = _job(2)
    holder.admit(beats, PERIOD, timeout=30.0)
    holder.left()
    assert holder.look(SLOT)[0] == LEFT
    joiner.admit(beats, PERIOD, timeout=30.0)  # no wait: nobody holds it
    assert joiner.look(SLOT)[:2] == (MEMBER, joiner.token)


# ----------------------------------- leaving after a fit failed by a lost ps


class _Registry:
    """A registry whose `left()` runs `left` (blocks, or raises): as a write
    to a ps that is cut off or gone would."""

    names = NAMES
    slot = SLOT

    def __init__(self, left):
        self._left = left
        self.lefts = 0

    def rejoin(self):
        pass

    def left(self):
        self.lefts += 1
        self._left()


LOST = {"ps:0": "127.0.0.1:1 (Connection refused)"}


def _lost_ps_errors():
    from keras_psdist.errors import TaskLostError

    return [
        # The fit's error names the lost ps (`reporting_lost_tasks`).
        (TaskLostError(LOST, "worker:1"), {}),
        # A raw op error, and the ps does not answer a probe.
        (tf.errors.UnavailableError(None, None, "Connection reset by peer"), LOST),
    ]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", [0, 1], ids=["task_lost", "unreachable"])
def test_an_elastic_fit_failed_by_a_lost_ps_raises_its_error_and_writes_nothing(
    case, fit_failing_with
):
    from keras_psdist.cluster.elastic import ElasticTraining

    error, unreachable = _lost_ps_errors()[case]
    release = threading.Event()
    registry = _Registry(left=lambda: release.wait(60))  # a write that hangs
    training = ElasticTraining(registry, unreachable_servers=lambda: unreachable)
    try:
        raised = fit_failing_with(error, training)
    finally:
        release.set()
    assert raised is error, f"the fit raised {raised!r} (None: it hung), not {error!r}"
    assert registry.lefts == 0


@pytest.mark.timeout(60)
def test_an_elastic_fit_whose_leaving_fails_raises_its_own_error(fit_failing_with):
    from keras_psdist.cluster.elastic import ElasticTraining

    def left():
        raise tf.errors.UnavailableError(None, None, "Connection reset by peer")

    registry = _Registry(left)
    training = ElasticTraining(registry, unreachable_servers=lambda: {})
    error = ValueError("the fit's own error")
    assert fit_failing_with(error, training) is error
    assert registry.lefts == 1  # it tried: the ps answered a probe


@pytest.mark.timeout(60)
def test_an_elastic_fit_that_ends_marks_its_slot_left():
    from keras_psdist.cluster.elastic import ElasticTraining

    registry = _Registry(left=lambda: None)
    training = ElasticTraining(registry, unreachable_servers=lambda: LOST)
    with training.session():
        pass
    assert registry.lefts == 1
