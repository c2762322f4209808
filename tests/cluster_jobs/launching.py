"""Running a job of this directory on a local cluster: for the tests (and
benchmarks) that start one with `keras_psdist.cluster.launch`.

`tests/conftest.py` puts this directory on `sys.path`, so test modules
`import launching` (and the jobs, e.g. `import ps_loss_job`).
"""

import contextlib
import io
import os
import re
import sys
from pathlib import Path

import zygote

# The launcher's line for each process it starts: `[launch] ps:0 pid 4242: ...`.
PID_LINE = re.compile(r"^\[launch\] (\S+) pid (\d+):")


def launch_job(job, args, out=None, **launch_kwargs):
    """Runs `python job *args` on a local cluster (`cluster.launch` with
    `launch_kwargs`). Returns `(exit code, the whole log)`.

    Every task (the job's processes and the ps servers) is a fork of the
    test zygote, which imported TensorFlow once (`zygote.py`), unless
    `KERAS_PSDIST_TEST_ZYGOTE_FORKS=0`."""
    from keras_psdist import cluster

    out = io.StringIO() if out is None else out
    # A caller's `out` may hold earlier text; the log is this launch's part.
    start = len(out.getvalue()) if hasattr(out, "getvalue") else 0
    args = [str(Path(job).resolve()), *map(str, args)]
    with servers_from_zygote():
        # After the zygote started: `zygote.command` forks only then.
        command = zygote.command(args) if zygote.enabled() else [sys.executable, *args]
        code = cluster.launch(command, out=out, **launch_kwargs)
    return code, out.getvalue()[start:] if hasattr(out, "getvalue") else ""


@contextlib.contextmanager
def servers_from_zygote():
    """While inside, the servers `cluster.launch` starts with a Python
    command (`keras_psdist serve`, or a test's own) are forks of the test
    zygote, started here, so that `zygote.command` forks too; a plain
    interpreter each with `KERAS_PSDIST_TEST_ZYGOTE_FORKS=0`."""
    from keras_psdist.cluster.launcher import run

    server_command = run.SERVER_COMMAND
    if not zygote.enabled():
        yield
        return
    zygote.ensure_running()
    if server_command[0] == sys.executable:
        run.SERVER_COMMAND = tuple(zygote.command(list(server_command[1:])))
    try:
        yield
    finally:
        run.SERVER_COMMAND = server_command


def without_progress(log):
    """`log` without Keras's progress lines, to print on failure."""
    return "\n".join(
        line
        for line in log.splitlines()
        if "/step" not in line and "Epoch " not in line
    )


# Set to "loopback" to run the cross-host fixtures' jobs on this machine's
# loopback instead (for a machine without root or iproute2; CI has both).
HOSTS_ENV = "KERAS_PSDIST_TEST_HOSTS"


@contextlib.contextmanager
def cluster_hosts(num_ps, num_workers, chief=False):
    """A cluster with every task on a host of its own (a network namespace,
    `keras_psdist.testing.hosts`): yields `(hosts, task_hosts)`, the
    `NamespaceHosts` (to limit, cut and count a host's link; host names
    `ps0`, `worker1`, `chief`) and what `launch(hosts=...)` takes.

    Where namespaces cannot be made this raises, saying why: the cross-host
    tests fail, they are not skipped. With `KERAS_PSDIST_TEST_HOSTS=loopback`
    it yields `(None, None)` instead, and the job runs on loopback.
    """
    from keras_psdist.testing import hosts as namespace_hosts

    if os.environ.get(HOSTS_ENV) == "loopback":
        yield None, None
        return
    try:
        namespace_hosts.check_available()
    except namespace_hosts.HostsUnavailable as e:
        raise namespace_hosts.HostsUnavailable(
            f"{e} (The cross-host tests need network namespaces; to run them "
            f"on loopback instead, set {HOSTS_ENV}=loopback.)"
        ) from None
    placement = namespace_hosts.one_host_per_task(num_ps, num_workers, chief)
    with namespace_hosts.NamespaceHosts(list(placement.values())) as hosts:
        yield hosts, hosts.task_hosts(placement)


def host_addresses(log):
    """`[(task, address), ...]` from a launch's `[launch] cluster` line, for
    a launch with a host per task (`cluster_hosts`: port 2222 each); skips
    the calling test when `KERAS_PSDIST_TEST_HOSTS=loopback` put the launch
    on loopback."""
    import pytest

    if os.environ.get(HOSTS_ENV) == "loopback":
        pytest.skip(f"{HOSTS_ENV}=loopback")
    layout = next(x for x in log.splitlines() if x.startswith("[launch] cluster"))
    return re.findall(r"(\S+)=([\d.]+):2222", layout)
