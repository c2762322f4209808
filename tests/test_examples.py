"""Runs every script of `examples/` the way the top of its docstring says.

The command is read from each example's module docstring (its first line
that starts with `python ` or `keras-psdist `), so the documented command is
the tested one. `keras-psdist` becomes `sys.executable -m keras_psdist` and
`python` becomes `sys.executable`; `--epochs 1` is appended to keep each run
short. An example passes when it exits with status 0: each checks its own
result (e.g. accuracy above chance) and exits non-zero otherwise.
"""

from __future__ import annotations

import ast
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import zygote  # tests/cluster_jobs, see conftest.py

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.py"))

# Appended to every example's command.
SHORT_FLAGS = ("--epochs", "1")
# Launches of several TensorFlow processes cost ~8 s of CPU each to start
# (the import alone), so the default run keeps one launched example: the
# documented `keras-psdist launch ... -- python examples/...` path. The
# examples marked slow repeat launches the default run already makes with the
# same mode and strategy: in_graph_cluster and sharded_embedding (with its
# partitioner) those of tests/test_cluster_training.py's in-graph fixture,
# sync_replicas_backup that of tests/test_sync_replicas.py's straggler
# fixture (`replicas_to_aggregate=2` of 3 workers, the last one sleeping
# after every step).
SLOW = {"in_graph_cluster", "sharded_embedding", "sync_replicas_backup"}
# Seconds a run may take (under `-n 2`, with other tests beside it).
TIMEOUT_S = {"one_host": 240, "byzantine": 300}
LAUNCH_TIMEOUT_S = 420


def documented_command(path: Path) -> str:
    """The command on the first `python ...` / `keras-psdist ...` line of the
    module docstring of `path`."""
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    for line in docstring.splitlines():
        line = line.strip()
        if line.startswith(("python ", "keras-psdist ")):
            return line
    raise ValueError(
        f"{path.name} has no command in its docstring: expected a line starting "
        "with `python ` or `keras-psdist ` near the top, e.g. "
        f"`python examples/{path.name}`."
    )


def runnable(command: str, python: list[str] | None = None) -> list[str]:
    """`command` with `python` (default this interpreter) in place of
    `python` and `keras-psdist`."""
    python = [sys.executable] if python is None else python
    argv = []
    for word in shlex.split(command):
        if word == "keras-psdist":
            argv += [*python, "-m", "keras_psdist"]
        elif word == "python":
            argv += python
        else:
            argv.append(word)
    return argv


def _cases():
    for path in EXAMPLES:
        marks = []
        launched = documented_command(path).startswith("keras-psdist launch")
        if launched:
            marks.append(pytest.mark.multiprocess)
        if path.stem in SLOW:
            marks.append(pytest.mark.slow)
        timeout = LAUNCH_TIMEOUT_S if launched else TIMEOUT_S.get(path.stem, 240)
        # pytest-timeout's limit leaves the run's own time to stop everything.
        marks.append(pytest.mark.timeout(timeout + 60))
        yield pytest.param(path, timeout, marks=marks, id=path.stem)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # The examples must find the checkout even without `pip install -e`.
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p
    )
    # A cluster, if any, is the one `keras-psdist launch` sets up.
    env.pop("TF_CONFIG", None)
    return env


def _run(argv: list[str], timeout: float, env: dict) -> tuple[int | None, str]:
    """Runs `argv` in the checkout; returns (exit code, output), with `None`
    as the exit code if it ran out of time (it is then stopped: `launch`
    gets SIGTERM, which stops every process it started)."""
    process = subprocess.Popen(
        argv,
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
        return process.returncode, output
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)
        try:
            output, _ = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
        return None, output


def test_every_example_has_its_command():
    assert EXAMPLES, "no examples found"
    for path in EXAMPLES:
        command = documented_command(path)
        assert f"python examples/{path.name}" in command, (path.name, command)


@pytest.mark.parametrize(("path", "timeout"), list(_cases()))
def test_example_runs_as_documented(path, timeout):
    command = documented_command(path)
    # Each `python` a fork of the test zygote (`cluster_jobs/zygote.py`).
    env, python = zygote.python_in(_env())
    argv = [*runnable(command, python), *SHORT_FLAGS]
    code, output = _run(argv, timeout, env)
    if code != 0:
        what = f"ran out of {timeout} s" if code is None else f"exited with {code}"
        pytest.fail(f"`{command} {shlex.join(SHORT_FLAGS)}` {what}:\n{output}")
    assert "accuracy" in output, output
