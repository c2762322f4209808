"""The cluster's background loops (heartbeats, the loss reporter's look,
the membership watcher) survive a lost ps and surface a programming error.

A lost ps shows up in them as one of TensorFlow's `OpError`s: logged, and the
loop goes on (the server watch reports the loss). Anything else is a bug in
the loop's own code: it is not swallowed, so the thread ends with it and
Python's thread hook prints it.
"""

from __future__ import annotations

import threading

import pytest
import tensorflow as tf

from keras_psdist.cluster import elastic, liveness


class _Step:
    """A stand-in for one look or beat: raises `error` once, then stops the
    loop (by setting `stop`)."""

    def __init__(self, error: Exception, stop: threading.Event):
        self.error, self.stop, self.calls = error, stop, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == 1:
            raise self.error
        self.stop.set()


def _heartbeats(step):
    beats = liveness.Heartbeats.__new__(liveness.Heartbeats)
    beats._stop, beats._server_watch, beats.period = step.stop, None, 0.0
    beats.beat = step
    return beats._beat_forever


def _loss_reporter(step):
    reporter = liveness.LossReporter.__new__(liveness.LossReporter)
    heartbeats = liveness.Heartbeats.__new__(liveness.Heartbeats)
    heartbeats._server_watch = None
    reporter._stop, reporter._every, reporter._heartbeats = step.stop, 0.0, heartbeats
    reporter.check = step
    return reporter._watch


def _membership(step):
    watcher = elastic.MembershipWatcher.__new__(elastic.MembershipWatcher)
    watcher._stop, watcher._every = step.stop, 0.0
    watcher.look = step
    return watcher._watch


LOOPS = {
    "heartbeats": _heartbeats,
    "loss_reporter": _loss_reporter,
    "membership": _membership,
}


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_lost_ps_is_logged_and_the_loop_goes_on(loop):
    step = _Step(
        tf.errors.UnavailableError(None, None, "ps:0 is gone"), threading.Event()
    )
    LOOPS[loop](step)()
    assert step.calls == 2


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_programming_error_surfaces(loop):
    step = _Step(TypeError("a bug in the loop"), threading.Event())
    with pytest.raises(TypeError, match="a bug in the loop"):
        LOOPS[loop](step)()
    assert step.calls == 1
