"""The `xdist` scheduling of the suite: the tests that wait run in a lane of
their own, beside the workers that compute.

Some tests spend most of their time waiting: for a fault to be noticed, a
grace period to run out, a cut link to time out (`pytest.mark.waits`; the
fault-injection modules, Slurm, the task-loss watch). Their processes use a
fraction of a core meanwhile. On two cores with two workers, a worker in
such a test leaves its core mostly idle (about 190 of 1,540 core-seconds of
a default run, measured from /proc/stat).

With three or more workers, `WaitingLaneScheduling` gives the last worker
the waiting tests and the others everything else: the README's `-n 3` on
two cores keeps both cores computing while the lane waits. Once no waiting
test is left to start, the lane computes too: the tests that launch
processes leave cores idle on their own (default runs, `-n 3`: 769 s with
the lane ending there; 742 s and 751 s with it computing on; 727 s and
740 s once the XLA tests, marked `heavy`, ran first rather than last). A
computing worker that runs out of its own kind takes the waiting tests
left, so none idles while work is left. With fewer than three workers it
schedules as `loadgroup`.

The tests that wait are found by their node ids, which is all the
controller sees of them (not their marks): the conftest gives every test
marked `waits` one more `xdist_group`, named `WAITS` and its group, and
`xdist` ends the node id with the names of all of a test's groups.
"""

from __future__ import annotations

from xdist.scheduler import LoadGroupScheduling

# The start of the extra `xdist_group` of a test marked `waits`.
WAITS = "waits:"


def waits(scope: str) -> bool:
    """Whether the `loadgroup` scope `scope` (the names of a test's groups,
    joined by `_`) is of tests marked `waits`."""
    return WAITS in scope


class WaitingLaneScheduling(LoadGroupScheduling):
    """`loadgroup`, with the last of three or more workers a lane for the
    tests marked `waits`."""

    def _assign_work_unit(self, node) -> None:
        nodes = self.nodes
        lane = nodes[-1] if len(nodes) >= 3 else None
        if lane is not None:
            wanted = node is lane
            for scope in self.workqueue:
                if waits(scope) == wanted:
                    self.workqueue.move_to_end(scope, last=False)
                    break
        super()._assign_work_unit(node)
