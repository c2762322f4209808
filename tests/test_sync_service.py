"""The chief's update service decides, element by element (in one process).

The queues and tokens are replaced by recorders, so each rule of
`keras_psdist.sync.service` is checked on its own: stale gradients dropped
and their worker woken, an update every `replicas_to_aggregate` fresh
gradients, the end of a run, and sessions. The whole protocol across
processes is tested in `test_sync_replicas.py`.
"""

import numpy as np
import pytest

from keras_psdist import aggregators, count_rules
from keras_psdist.errors import WorkerLostError
from keras_psdist.sync import protocol
from keras_psdist.sync.protocol import SyncConfig
from keras_psdist.sync.resizing import Counts, Resizing
from keras_psdist.sync.service import FIT_FINISHED, UpdateService, counts_summary


class _Step:
    def __init__(self, value):
        self.value = value

    def numpy(self):
        return self.value


class _FakeSync:
    def __init__(self, replicas_to_aggregate, total_num_replicas, max_workers=None):
        self.config = SyncConfig(
            replicas_to_aggregate, total_num_replicas, 60.0, max_workers=max_workers
        )
        self.worker = 0  # the service runs on the chief, worker 0
        self.global_step = _Step(0)
        self.layout = protocol.Layout(("dense",), (None,))
        self.shapes = (None,)
        self.finished = []  # the sessions marked finished, in order

    def mark_finished(self, session):
        self.finished.append(session)


class _Staging:
    """Slots in a dict: the gradient a slot holds, and which are taken."""

    def __init__(self):
        self.held = {}
        self._next = 0

    def stage(self, value):
        slot, self._next = self._next, self._next + 1
        self.held[slot] = value
        return slot

    def give_back(self, slot):
        del self.held[slot]  # a slot given back twice fails here

    def variables(self, slot):
        return self.held[slot]


class _Recorder(UpdateService):
    """The service with its side effects recorded instead of sent."""

    def __init__(self, replicas_to_aggregate, total_num_replicas, resizing=None):
        self.updates = []
        # Per update: (its gradients, the counts it was made with).
        self.made_with = []

        def update(members, counts):
            self.updates.append(sum(members) / len(members))
            self.made_with.append((len(members), counts))

        super().__init__(
            _FakeSync(
                replicas_to_aggregate,
                total_num_replicas,
                max_workers=None if resizing is None else 8,
            ),
            update=update,
            resizing=resizing,
        )
        self.staging = _Staging()
        self.woken = []
        self.releases = []
        self._begin(1)

    def _wake(self, worker, token):
        self.woken.append((worker, token))

    def _publish(self):
        pass

    def _publish_lost(self):
        pass

    def _release(self, step, counts):
        self.releases.append(step)

    def gradient(self, worker, step, value):
        self._handle(protocol.GRADIENT, worker, step, self.staging.stage(value))

    def leave(self, worker):
        self._handle(protocol.LEAVE, worker, -1, None)

    def lose(self, worker):
        self._handle(protocol.LOST, worker, -1, None)

    @property
    def staged(self):
        """Gradients still held: those of the pending update."""
        return sorted(self.staging.held.values())

    def counts(self, row):
        return self._counts[row].tolist()


def test_an_update_every_replicas_to_aggregate_fresh_gradients():
    service = _Recorder(replicas_to_aggregate=2, total_num_replicas=3)
    service.gradient(0, 0, 1.0)
    assert service.updates == []
    service.gradient(2, 0, 3.0)
    assert service.updates == [2.0]  # the mean of workers 0 and 2
    assert service.releases == [1]
    assert service.counts(protocol.APPLIED) == [1, 0, 1]


def test_a_late_gradient_is_dropped_counted_and_its_worker_woken():
    service = _Recorder(replicas_to_aggregate=2, total_num_replicas=3)
    service.gradient(0, 0, 1.0)
    service.gradient(1, 0, 1.0)
    service.gradient(2, 0, 100.0)  # step 0's update is made: stale
    assert service.updates == [1.0]
    assert service.counts(protocol.DROPPED_STALE) == [0, 0, 1]
    assert service.woken == [(2, 1)]  # released with the current step
    assert service.staged == []  # every gradient's slot given back


def test_a_gradient_ahead_of_the_global_step_is_an_error():
    service = _Recorder(replicas_to_aggregate=2, total_num_replicas=2)
    with pytest.raises(RuntimeError, match="another chief"):
        service.gradient(1, 5, 1.0)


def test_several_gradients_per_worker_when_aggregating_more_than_workers():
    service = _Recorder(replicas_to_aggregate=3, total_num_replicas=2)
    assert service._sync.config.pushes_per_update == 2
    for worker, value in [(0, 1.0), (0, 2.0), (1, 3.0)]:
        service.gradient(worker, 0, value)
    assert service.updates == [2.0]
    assert service.counts(protocol.APPLIED) == [2, 1]


def test_when_too_few_workers_remain_the_rest_are_released_not_waited_for():
    """Workers faster than the chief finished first: the chief trains on
    alone, released at once, its gradients dropped at the end."""
    service = _Recorder(replicas_to_aggregate=2, total_num_replicas=3)
    service.gradient(0, 0, 5.0)  # a fresh gradient, waiting for a second
    service.leave(2)
    assert service.woken == []  # two workers remain: an update can still come
    service.leave(1)
    # The chief alone cannot make an update: its pending gradient is dropped
    # and it is freed, as is every later gradient of it.
    assert service.counts(protocol.DROPPED_AT_END) == [1, 0, 0]
    assert service.woken == [(0, protocol.FREE_PASS)]
    service.gradient(0, 0, 5.0)
    assert service.counts(protocol.DROPPED_AT_END) == [2, 0, 0]
    assert service.woken[-1] == (0, protocol.FREE_PASS)
    assert service.updates == []
    assert service.staged == []


# ------------------------------------------- the chief's end is everyone's

END_1 = protocol.END + 1  # the end token of session 1, the recorder's


@pytest.mark.timeout(60)
def test_the_chief_leaving_ends_the_session_for_the_stragglers():
    """The chief's fit ended: no update comes after it. The worker still
    training (a straggler) gets the end token at once, not free passes for
    the rest of its epochs; what it sends meanwhile is dropped at the end."""
    service = _Recorder(replicas_to_aggregate=2, total_num_replicas=3)
    service.gradient(0, 0, 1.0)
    service.gradient(1, 0, 1.0)  # update 1
    service.gradient(2, 0, 9.0)  # the straggler's: stale
    service.gradient(1, 1, 1.0)  # pending: waits for a second fresh one
    assert service.staged == [1.0]
    service.leave(1)
    service.leave(0)  # the chief
    assert service._sync.finished == [1]
    assert service.woken == [(2, 1), (2, END_1)]
    # Worker 1's pending gradient cannot make an update any more.
    assert service.counts(protocol.DROPPED_AT_END) == [0, 1, 0]
    service.gradient(2, 1, 9.0)  # sent before it knew
    assert service.counts(protocol.DROPPED_AT_END) == [0, 1, 1]
    assert service.woken[-1] == (2, END_1)
    assert service.updates == [1.0]
    assert service._active == {2}  # the session ends when it has left
    assert service.staged == []


@pytest.mark.timeout(60)
def test_a_worker_faster_than_the_chief_leaving_ends_nothing():
    """Only the chief's end is everyone's: a worker that finishes first
    leaves, and the chief and the others train on as before."""
    service = _Recorder(replicas_to_aggregate=2, total_num_replicas=3)
    service.leave(2)
    assert service._sync.finished == [] and service.woken == []
    service.gradient(0, 0, 1.0)
    service.gradient(1, 0, 3.0)
    assert service.updates == [2.0]
    service.leave(1)  # the chief alone: released at once, not ended
    assert service.woken == [(0, protocol.FREE_PASS)]
    assert service._sync.finished == []


@pytest.mark.timeout(60)
def test_a_worker_counted_lost_is_ended_too():
    """It may be alive (starved of CPU) or come back: either way no update
    of the session comes for it."""
    service = _Recorder(replicas_to_aggregate=2, total_num_replicas=4)
    service.lose(3)
    service.leave(0)
    assert sorted(service.woken) == [(1, END_1), (2, END_1), (3, END_1)]


@pytest.mark.timeout(60)
def test_a_gradient_of_a_session_already_ended_gets_that_sessions_end():
    """A worker late for a session the chief has finished (restarted): the
    end token of its own session, so its fit stops too."""
    service = _Recorder(replicas_to_aggregate=2, total_num_replicas=2)
    service._begin(2)
    service._late(protocol.GRADIENT, 1, 1, service.staging.stage(1.0))
    assert service.woken == [(1, END_1)]
    assert service.counts(protocol.DROPPED_AT_END) == [0, 1]
    assert service.staged == []


def test_counts_account_for_every_gradient():
    rng = np.random.default_rng(0)
    service = _Recorder(replicas_to_aggregate=2, total_num_replicas=4)
    sent = np.zeros(4, int)
    tags = [0] * 4
    for _ in range(200):
        worker = int(rng.integers(4))
        service.gradient(worker, tags[worker], 1.0)
        sent[worker] += 1
        tags[worker] = service._step  # the worker's next tag
    total = sum(np.array(service.counts(row)) for row in range(3))
    np.testing.assert_array_equal(total, sent)
    assert len(service.updates) == service._step
    # Slots hold only the pending update's gradients.
    assert len(service.staged) == len(service._members) < 2


def _run_with_every_kind_of_count():
    service = _Recorder(replicas_to_aggregate=2, total_num_replicas=3)
    service.gradient(0, 0, 1.0)
    service.gradient(1, 0, 1.0)
    service.gradient(2, 0, 1.0)  # stale
    service.leave(0)
    service.leave(1)
    service.gradient(2, 1, 1.0)  # worker 2 trains on alone: dropped at the end
    return service


@pytest.mark.parametrize("interactive", [True, False])
def test_the_end_of_a_fit_is_said_plainly_not_as_a_warning(interactive, capsys, caplog):
    """Drops are what backup workers are for: the summary is printed (or, when
    Keras logs instead of printing, logged at INFO), never a warning, and says
    what each kind of drop is."""
    import logging

    import keras

    service = _run_with_every_kind_of_count()
    was = keras.config.is_interactive_logging_enabled()
    if not interactive:
        keras.config.disable_interactive_logging()
    try:
        # absl's logger, whose level a command line parsed in this process
        # may have raised.
        with caplog.at_level(logging.INFO, logger="absl"):
            service.log_counts(FIT_FINISHED)
    finally:
        if was:
            keras.config.enable_interactive_logging()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    said = capsys.readouterr().out if interactive else caplog.text
    assert (
        "keras_psdist sync-replicas (finished a fit): 1 update; gradients per "
        "worker (worker:0, worker:1, worker:2): applied [1, 1, 0]" in said
    )
    assert (
        "dropped as stale [0, 0, 1] (arrived after the update of their step: a "
        "backup worker's late gradients, not applied)" in said
    )
    assert (
        "dropped at the end [0, 0, 1] (sent after the last update, when the "
        "chief's fit had ended or too few workers were still training to make "
        "another: not applied)" in said
    )
    assert not interactive or not caplog.records


def test_the_summary_explains_only_the_drops_there_are():
    counts = np.array([[5, 5], [0, 0], [0, 0]])
    summary = counts_summary("progress", 5, counts, lambda w: f"worker:{w}")
    assert summary.endswith(
        "applied [5, 5]; dropped as stale [0, 0]; dropped at the end [0, 0]"
    )


# ------------------------------------------------- workers join and leave


def _resizing(members, replicas_to_aggregate="all_but_one", aggregator="mean", f=None):
    """The run's members (a list the test changes) and its count rule."""
    return Resizing(
        replicas_to_aggregate, f, aggregators.get(aggregator), lambda: members
    )


def _elastic(members, **kwargs):
    resizing = _resizing(members, **kwargs)
    start = resizing.counts(len(members))
    return _Recorder(start.replicas_to_aggregate, len(members), resizing=resizing)


@pytest.mark.timeout(60)
def test_a_joiner_s_first_gradient_changes_the_counts_when_no_update_waits():
    service = _elastic([0, 1])  # all but one of 2: 1 per update
    service.gradient(0, 0, 1.0)
    assert service.made_with[-1] == (1, Counts(2, 1, 0))
    # Worker 2's first gradient: it joins; nothing pending, so the counts
    # change at once and its gradient is the first of the next update.
    service.gradient(2, 1, 3.0)
    # (The first change is the session's start.)
    assert service.changes == [(0, Counts(2, 1, 0)), (1, Counts(3, 2, 0))]
    assert service.updates == [1.0]
    service.gradient(0, 1, 1.0)
    assert service.updates == [1.0, 2.0]
    assert service.made_with[-1] == (2, Counts(3, 2, 0))
    assert service.counts(protocol.APPLIED)[:3] == [2, 0, 1]


@pytest.mark.timeout(60)
def test_a_join_while_an_update_waits_changes_the_counts_after_it():
    """The pending update is made with the counts it began with (the
    joiner's fresh gradient is one of them); the released workers step
    under the new counts."""
    service = _elastic([0, 1, 2])  # 2 per update
    service.gradient(0, 0, 1.0)
    service.gradient(3, 0, 3.0)  # joins; its gradient completes the update
    assert service.made_with == [(2, Counts(3, 2, 0))]
    assert service.changes[1:] == [(1, Counts(4, 3, 0))]
    assert service.releases == [1]  # released after the change
    for worker in (0, 1):
        service.gradient(worker, 1, 1.0)
    assert service.updates == [2.0]  # 3 wanted now
    service.gradient(2, 1, 1.0)
    assert service.made_with[-1] == (3, Counts(4, 3, 0))


@pytest.mark.timeout(60)
def test_a_leave_changes_the_counts_at_once_and_makes_the_update_it_can():
    """No update waits for a worker that is gone: with one fewer backup, the
    pending update is made from the gradients it has when they are enough."""
    service = _elastic([0, 1, 2, 3])  # 3 per update
    service.gradient(0, 0, 1.0)
    service.gradient(1, 0, 3.0)
    service.leave(3)  # 3 remain: 2 per update, and 2 are there
    assert service.made_with == [(2, Counts(3, 2, 0))]
    assert service.changes[1:] == [(0, Counts(3, 2, 0))]
    assert service.releases == [1]
    service.gradient(0, 1, 1.0)
    service.lose(2)  # 2 remain: 1 per update, worker 0's is there
    assert service.made_with[-1] == (1, Counts(2, 1, 0))
    assert service.changes[-1] == (1, Counts(2, 1, 0))
    assert service.staged == []


class _AllOrOne(count_rules.CountRule):
    """A user's rule: every worker from 4 on, else one."""

    def count(self, n, round_up):
        return n if n >= 4 else 1


@pytest.mark.timeout(60)
def test_a_shrink_below_the_gradients_waiting_updates_with_the_first_ones():
    service = _elastic([0, 1, 2, 3], replicas_to_aggregate=_AllOrOne())
    for worker, value in [(0, 1.0), (1, 2.0), (2, 3.0)]:
        service.gradient(worker, 0, value)
    service.lose(3)  # 1 per update now: worker 0's is it, the others a backup's
    assert service.updates == [1.0]
    assert service.counts(protocol.APPLIED)[:4] == [1, 0, 0, 0]
    assert service.counts(protocol.DROPPED_STALE)[:4] == [0, 1, 1, 0]
    assert (1, 1) in service.woken and (2, 1) in service.woken
    assert service.staged == []


@pytest.mark.timeout(60)
def test_num_byzantine_follows_the_workers_and_a_rule_that_cannot_run_stops():
    service = _elastic(
        [0, 1, 2, 3, 4, 5], replicas_to_aggregate="all", aggregator="krum", f=0.2
    )
    assert service.counts_now == Counts(6, 6, 1)
    service.leave(5)
    assert service.counts_now == Counts(5, 5, 1)  # Krum: n >= 2f + 3
    service.leave(4)  # 4 workers, f = 0.2 * 4 rounded down: 0
    assert service.counts_now == Counts(4, 4, 0)
    service = _elastic(
        [0, 1, 2, 3, 4], replicas_to_aggregate="all", aggregator="krum", f=1
    )
    with pytest.raises(
        WorkerLostError,
        match=r"replicas_to_aggregate=4, num_byzantine=1.*--min-workers",
    ):
        service.lose(4)


@pytest.mark.timeout(60)
def test_a_fit_that_ends_below_the_rule_s_workers_ends_the_session():
    """A worker whose `fit` ended leaves (its LEAVE): if the rule cannot run
    on the workers still training (the median with num_byzantine=1 on 2),
    their remaining gradients are dropped and they are released at once, as
    when too few remain for replicas_to_aggregate; it is not a lost worker,
    and the run does not fail."""
    service = _elastic([0, 1, 2], replicas_to_aggregate="all", aggregator="median", f=1)
    service.gradient(0, 0, 1.0)
    service.leave(2)
    assert service.updates == []
    assert service.counts(protocol.DROPPED_AT_END)[:3] == [1, 0, 0]
    # Workers 0 and 1 go on without an update (the session is at its end).
    assert service.woken == [(0, protocol.FREE_PASS), (1, protocol.FREE_PASS)]
    assert service.staged == []


@pytest.mark.timeout(60)
def test_an_elastic_run_too_small_for_its_rule_waits_for_workers_to_join():
    """At the start only the chief is a member: the median with
    num_byzantine=1 needs 3, so the first update waits for 3 gradients, the
    joiners' first ones among them."""
    members = [0]
    resizing = _resizing(members, replicas_to_aggregate="all", aggregator="median", f=1)
    resizing.max_workers = 4
    assert resizing.counts_to_wait_for(1) == Counts(3, 3, 1)
    service = _Recorder(3, 1, resizing=resizing)
    assert service.counts_now == Counts(3, 3, 1)
    service.gradient(0, 0, 1.0)
    service.gradient(1, 0, 2.0)  # joins
    assert service.updates == []
    service.gradient(2, 0, 6.0)  # joins: 3 workers, the rule runs
    assert service.updates == [3.0]  # (the recorder's update: their mean)
    assert service.made_with == [(3, Counts(3, 3, 1))]
    # With no count the rule runs on up to max_workers, the error names it.
    resizing = _resizing([0], replicas_to_aggregate="all", aggregator="krum", f=2)
    resizing.max_workers = 4
    with pytest.raises(WorkerLostError, match=r"Krum.*--min-workers"):
        resizing.counts_to_wait_for(1)


@pytest.mark.timeout(60)
def test_twenty_changes_lose_no_gradient_and_count_none_twice():
    """Random joins, leaves and losses between random gradients: every
    gradient sent is applied or dropped exactly once, every update has the
    counts in force when it was made, and the final "weights" (the sum of
    update means, all gradients 1) equal the updates made."""
    rng = np.random.default_rng(1)
    members = [0, 1]
    service = _elastic(members)
    out = [2, 3, 4, 5]  # slots free to join
    sent = np.zeros(8, int)
    tags = {}
    changes = 0
    while changes < 20 or service._members:
        if changes < 20 and rng.random() < 0.1:
            if out and (len(service._active) <= 2 or rng.random() < 0.5):
                worker = out.pop(int(rng.integers(len(out))))
                tags[worker] = service._step  # joins with its first gradient
                service.gradient(worker, tags[worker], 1.0)
                sent[worker] += 1
            else:
                worker = int(rng.choice(sorted(service._active - {0})))
                (service.leave if rng.random() < 0.5 else service.lose)(worker)
                out.append(worker)
                tags.pop(worker, None)
            changes += 1
            continue
        active = sorted(service._active)
        worker = int(rng.choice(active))
        tags.setdefault(worker, service._step)
        service.gradient(worker, tags[worker], 1.0)
        sent[worker] += 1
        tags[worker] = service._step
    total = sum(np.array(service.counts(row)) for row in range(3))
    np.testing.assert_array_equal(total, sent)
    assert (
        len(service.updates) == service._step
        and service.updates == [1.0] * service._step
    )
    assert all(n == counts.replicas_to_aggregate for n, counts in service.made_with)
    assert sum(n for n, _ in service.made_with) == sum(service.counts(protocol.APPLIED))
    assert len(service.changes) >= 10
    assert service.staged == []
