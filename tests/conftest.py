"""Shared test setup.

When pytest configures, before any test module imports TensorFlow, the
host CPU is split into 8 logical devices (only when no GPU is present) so
multi-replica strategies can be exercised on a CPU-only machine.
`tests/cluster_jobs` goes on `sys.path` for the tests that launch those
jobs.

The tasks those tests start (ps servers, workers, chiefs, the docs' blocks)
are forks of a zygote that imported TensorFlow once per test process
(`cluster_jobs/zygote.py`, started on first use, stopped at exit):
`KERAS_PSDIST_TEST_ZYGOTE_FORKS=0` starts each as a fresh interpreter.
"""

import os
import sys
from pathlib import Path

# The cluster jobs and their launching helpers (`import launching`).
sys.path.insert(0, str(Path(__file__).parent / "cluster_jobs"))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import waiting_lane  # noqa: E402  (tests/, on sys.path with this conftest)

NUM_LOGICAL_CPUS = 8


def pytest_configure(config):
    """Splits the host CPU (before any test module imports TensorFlow), in
    the processes that run tests: not in the `-n 3` controller, which runs
    none and would otherwise import TensorFlow (about 6 CPU-seconds) while
    its workers start."""
    if getattr(config.option, "numprocesses", None) and not hasattr(
        config, "workerinput"
    ):
        return
    import tensorflow as tf

    from keras_psdist.devices import split_host_cpu

    if not tf.config.list_physical_devices("GPU"):
        split_host_cpu(NUM_LOGICAL_CPUS)


@pytest.fixture(scope="session")
def cpu_devices() -> list[str]:
    """Names of the logical CPU devices, e.g. `"/device:CPU:0"`."""
    import tensorflow as tf

    return [d.name for d in tf.config.list_logical_devices("CPU")]


@pytest.fixture(scope="session")
def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`(x_train, y_train, x_test, y_test)` from scikit-learn's bundled digits.

    Features are float32 in [0, 1] with shape `(n, 64)`; labels are int32.
    80/20 stratified split with a fixed seed (0).
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=0, stratify=y
    )
    return x_train, y_train, x_test, y_test


def pytest_sessionstart(session):
    """Removes the network namespaces a killed earlier run left behind (those
    whose owning process is gone; `keras_psdist.testing.hosts`)."""
    from keras_psdist.testing import hosts

    try:
        hosts.check_available()
    except hosts.HostsUnavailable:
        return
    hosts.remove_stale()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The modules that start processes run first, then the tests marked
    `heavy`, each module's tests in their order; the tests that share a
    launch share an `xdist` worker.

    The workers take tests (or `xdist_group`s) as they free up, in this
    order, so a long cluster launch or a 15-second XLA test collected last
    could leave one worker idle while the other finishes it; longest first
    packs them.

    A module-scoped fixture is set up once per `xdist` worker that runs a
    test using it: a cluster launch shared by two tests that the two
    workers took ran twice (65 s). So a process-starting test that uses a
    module-scoped fixture of its own module joins that fixture's
    `xdist_group` (before xdist reads the marks: `tryfirst`), unless it
    names its group itself.

    A test marked `waits` gets one more group, its group's name (its
    module's, if it has none) after `waiting_lane.WAITS`: the lane that
    runs them finds them by it.
    """
    for item in items:
        group = item.get_closest_marker("xdist_group")
        if group is None and item.get_closest_marker("multiprocess") is not None:
            shared = _own_module_fixtures(item)
            if shared:
                item.add_marker(pytest.mark.xdist_group(shared[0]))
                group = item.get_closest_marker("xdist_group")
        if item.get_closest_marker("waits") is not None:
            name = group.args[0] if group is not None else item.module.__name__
            item.add_marker(pytest.mark.xdist_group(waiting_lane.WAITS + name))
    launching_modules = {
        item.module.__name__
        for item in items
        if item.get_closest_marker("multiprocess") is not None
    }
    items.sort(
        key=lambda item: (
            item.module.__name__ not in launching_modules,
            item.get_closest_marker("heavy") is None,
        )
    )


def pytest_collection_finish(session):
    """Moves what collection left (TensorFlow, Keras, the test modules:
    about 470,000 objects) to the garbage collector's permanent generation,
    as the zygote does before it forks (`zygote.preload`): a full collection
    no longer goes through them. Measured with `gc.callbacks` on
    `test_every_compressor_with_a_rule_of_each_kind[median]` and `[krum]`
    with `test_exactness.py` (`-n 0`): 2.7 -> 2.1 CPU-seconds of
    collections."""
    import gc

    gc.collect()
    gc.freeze()


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` (the suite's default) with the tests marked
    `waits` in a lane of their own when there are three workers or more
    (`waiting_lane`)."""
    if config.getvalue("dist") == "loadgroup":
        return waiting_lane.WaitingLaneScheduling(config, log)
    return None


@pytest.hookimpl(wrapper=True)
def pytest_unconfigure(config):
    """An `xdist` worker ends as soon as it has unconfigured: it runs the
    exit handlers (the zygote and the test hosts stop) and leaves without
    tearing its interpreter down.

    The worker has sent its last report (`workerfinished`, in
    `pytest_sessionfinish`) by then, and the controller waits for every
    worker to exit before it prints the summary. What is skipped is
    pytest's five closing full collections, which look for unraisable
    exceptions no report would carry any more, and freeing a heap of
    TensorFlow graphs object by object: a default run spent 11 s of both
    cores there after its last test; `tests/test_tutorial_patterns.py` with
    `tests/test_xla.py` under `-n 2`, 4.5 s -> 1.8 s from the last test to
    the summary. Not under coverage, whose data an exit handler may still
    have to write."""
    result = yield
    if hasattr(config, "workerinput") and "coverage" not in sys.modules:
        import atexit

        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(config.workeroutput.get("exitstatus", 0))
    return result


def _own_module_fixtures(item) -> list[str]:
    """The module-scoped fixtures defined in `item`'s own module that it
    uses, as `module:fixture`."""
    module = item.module.__name__
    own = []
    for name in item.fixturenames:
        definitions = item._fixtureinfo.name2fixturedefs.get(name)
        if not definitions:
            continue
        definition = definitions[-1]
        if definition.scope == "module" and definition.baseid.endswith(
            item.module.__file__.rsplit("/", 1)[-1]
        ):
            own.append(f"{module}:{name}")
    return own


@pytest.fixture
def across_tasks(monkeypatch):
    """Every read from another device counts as one from another task
    (`PSStrategy(read_dtype=...)` then narrows it): one host's logical CPUs
    take the path a cluster's tasks do."""
    import tensorflow as tf

    from keras_psdist.variables import narrow_reads

    monkeypatch.setattr(
        narrow_reads,
        "crosses_tasks",
        lambda variable_device, reading_device: (
            bool(reading_device)
            and tf.DeviceSpec.from_string(variable_device)
            != tf.DeviceSpec.from_string(reading_device)
        ),
    )


def _fit_failing_with(error, training):
    """Runs a `fit` (`training.session()` around a body) that raises `error`,
    in a thread; returns the error it raised, or None if it hangs (30 s)."""
    import threading

    raised = []

    def fit():
        try:
            with training.session():
                raise error
        except BaseException as e:  # noqa: BLE001 (kept for the assertions)
            raised.append(e)

    thread = threading.Thread(target=fit, daemon=True)
    thread.start()
    thread.join(timeout=30)
    return raised[0] if raised else None


@pytest.fixture
def fit_failing_with():
    """`_fit_failing_with`: how a fit that fails ends its session."""
    return _fit_failing_with
