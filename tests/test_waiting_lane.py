"""The suite's `xdist` scheduling (`tests/waiting_lane.py`): with three
workers or more the last is a lane for the tests marked `waits`, and no
worker idles while a test is left."""

import types

import pytest
import waiting_lane  # tests/, beside this module


class _Node:
    """A stand-in for xdist's `WorkerController`: records what it was sent."""

    def __init__(self, name):
        self.gateway = types.SimpleNamespace(id=name)
        self.sent = []
        self.shutting_down = False

    def send_runtest_some(self, indices):
        self.sent += indices

    def shutdown(self):
        self.shutting_down = True

    def __repr__(self):
        return self.gateway.id


# Node ids as a worker reports them under `--dist loadgroup`: `@` and the
# names of the test's groups, joined by `_`. Twenty-two tests that compute,
# two of them sharing a launch; five that wait, in four groups.
COLLECTION = [
    *(f"tests/test_a.py::test_{i}" for i in range(20)),
    "tests/test_b.py::test_1@launch",
    "tests/test_b.py::test_2@launch",
    "tests/test_c.py::test_1@cut_waits:cut",
    "tests/test_c.py::test_2@cut_waits:cut",
    "tests/test_d.py::test_1@waits:test_d",
    "tests/test_e.py::test_1@flap_waits:flap",
    "tests/test_f.py::test_1@waits:test_f",
]
WAITING = {i for i, nodeid in enumerate(COLLECTION) if "waits:" in nodeid}
LAUNCH = {i for i, nodeid in enumerate(COLLECTION) if nodeid.endswith("@launch")}
CUT = {i for i, nodeid in enumerate(COLLECTION) if nodeid.endswith("@cut_waits:cut")}
EVERYTHING = set(range(len(COLLECTION)))


def _scheduler(num_workers, scheduling=waiting_lane.WaitingLaneScheduling):
    config = types.SimpleNamespace(
        getvalue=lambda name: [f"{num_workers}*popen"] if name == "tx" else None,
        option=types.SimpleNamespace(loadscopereorder=True),
    )
    scheduler = scheduling(config)
    nodes = [_Node(f"gw{i}") for i in range(num_workers)]
    for node in nodes:
        scheduler.add_node(node)
        scheduler.add_node_collection(node, COLLECTION)
    scheduler.schedule()
    return scheduler, nodes


def _run(scheduler, nodes):
    """Completes the tests sent to `nodes`, one per node in turn, until
    none has any left; returns the indices each ran."""
    ran = {node: [] for node in nodes}
    for _ in range(10 * len(COLLECTION)):
        busy = [node for node in nodes if node.sent]
        if not busy:
            break
        for node in busy:
            index = node.sent.pop(0)
            ran[node].append(index)
            scheduler.mark_test_complete(node, index)
    return ran


def test_the_last_of_three_workers_takes_the_waiting_tests_first():
    _, (cpu0, cpu1, lane) = _scheduler(3)
    assert lane.sent and set(lane.sent) <= WAITING
    assert cpu0.sent and cpu1.sent
    assert not set(cpu0.sent + cpu1.sent) & WAITING


def test_every_test_runs_once_and_the_lane_goes_on_with_the_others():
    scheduler, nodes = _scheduler(3)
    ran = _run(scheduler, nodes)
    assert sorted(i for indices in ran.values() for i in indices) == sorted(EVERYTHING)
    assert all(node.shutting_down for node in nodes)
    # Tests that share a group run in one worker.
    assert any(LAUNCH <= set(indices) for indices in ran.values())
    assert any(CUT <= set(indices) for indices in ran.values())
    cpu0, cpu1, lane = nodes
    # The lane ran every waiting test, then computed beside the others.
    assert set(ran[lane]) > WAITING
    assert not (set(ran[cpu0]) | set(ran[cpu1])) & WAITING


def test_a_worker_takes_waiting_tests_when_nothing_else_is_left():
    scheduler, (cpu0, cpu1, lane) = _scheduler(3)
    # The lane is slow: the other two finish everything else first.
    ran = _run(scheduler, [cpu0, cpu1])
    taken = set(ran[cpu0]) | set(ran[cpu1])
    assert taken == EVERYTHING - set(lane.sent)
    assert taken & WAITING, "the idle workers left the waiting tests queued"


def test_fewer_than_three_workers_schedule_as_loadgroup():
    _, ours = _scheduler(2)
    _, theirs = _scheduler(2, waiting_lane.LoadGroupScheduling)
    assert [node.sent for node in ours] == [node.sent for node in theirs]
    assert set(ours[0].sent) & WAITING or set(ours[1].sent) & WAITING


@pytest.mark.waits
def test_a_test_marked_waits_gets_a_group_the_lane_finds(request):
    groups = [m.args[0] for m in request.node.iter_markers("xdist_group")]
    assert waiting_lane.waits("_".join(sorted(groups))), groups


def test_a_test_not_marked_waits_gets_no_such_group(request):
    groups = [m.args[0] for m in request.node.iter_markers("xdist_group")]
    assert not waiting_lane.waits("_".join(sorted(groups))), groups
