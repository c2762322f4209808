"""Shared test setup.

At import time, before any test module imports TensorFlow, the host CPU is
split into 8 logical devices (only when no GPU is present) so multi-replica
strategies can be exercised on a CPU-only machine. `tests/cluster_jobs` goes
on `sys.path` for the tests that launch those jobs.

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
import tensorflow as tf  # noqa: E402

from keras_psdist.devices import split_host_cpu  # noqa: E402

NUM_LOGICAL_CPUS = 8

if not tf.config.list_physical_devices("GPU"):
    split_host_cpu(NUM_LOGICAL_CPUS)


@pytest.fixture(scope="session")
def cpu_devices() -> list[str]:
    """Names of the logical CPU devices, e.g. `"/device:CPU:0"`."""
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
    """The tests that start processes are spread over the first three
    quarters of the run, between modules of tests that run in this
    process; the tests that share a launch share an `xdist` worker.

    A launch's processes wait at times (for servers, for a cut link, for a
    heartbeat to go missing): two launches at once left up to a quarter of
    the two cores idle. Between modules of in-process tests, a launch mostly
    runs beside tests that keep a core busy. The launches come largest
    first (the most tests sharing one), and none comes in the last quarter,
    where a long one could leave a worker idle while the other finishes it.
    (`--no-loadscope-reorder` in pyproject.toml: xdist keeps this order.)

    A module-scoped fixture is set up once per `xdist` worker that runs a
    test using it: a cluster launch shared by two tests that the two
    workers took ran twice (65 s). So a process-starting test that uses a
    module-scoped fixture of its own module joins that fixture's
    `xdist_group` (before xdist reads the marks: `tryfirst`), unless it
    names its group itself.
    """
    for item in items:
        if item.get_closest_marker("multiprocess") is None:
            continue
        if item.get_closest_marker("xdist_group") is not None:
            continue
        shared = _own_module_fixtures(item)
        if shared:
            item.add_marker(pytest.mark.xdist_group(shared[0]))
    items[:] = _launches_spread(items)


def _unit(item) -> str:
    """What xdist hands a worker at once: the test's `xdist_group`, or the
    test alone."""
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return item.nodeid
    return mark.args[0] if mark.args else mark.kwargs.get("name", "default")


def _launches_spread(items, until: float = 0.75) -> list:
    """`items` with the units that start processes spread evenly among the
    others' first `until`, largest first, never between two tests of a
    module that share a module-scoped fixture of their own; the others keep
    their order, the groups of them first (the longest in-process units:
    late, one would leave the other worker idle)."""
    units = {}
    for item in items:
        units.setdefault(_unit(item), []).append(item)
    launches, groups, others = [], [], []
    for key, unit in units.items():
        if any(i.get_closest_marker("multiprocess") is not None for i in unit):
            launches.append(unit)
        elif key != unit[0].nodeid:
            groups.append(unit)
        else:
            others.append(unit)
    others = groups + others
    if not launches or not others:
        return [item for unit in units.values() for item in unit]
    launches.sort(key=len, reverse=True)
    spacing = until * sum(map(len, others)) / len(launches)
    ordered, placed, seen, previous = [], 0, 0, None
    for unit in others:
        if previous is None or not _share_module_fixtures(previous[-1], unit[0]):
            while placed < len(launches) and placed * spacing <= seen:
                ordered += launches[placed]
                placed += 1
        ordered += unit
        seen += len(unit)
        previous = unit
    ordered += [item for unit in launches[placed:] for item in unit]
    return ordered


def _share_module_fixtures(item, other) -> bool:
    """Whether `item` and `other` are of one module whose own module-scoped
    fixtures one of them uses (a launch between them would tear those down
    and set them up again)."""
    if item.module is not other.module:
        return False
    return bool(_own_module_fixtures(item) or _own_module_fixtures(other))


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
