"""The benchmark scripts parse their arguments, and the shared harness's
examples hold (no benchmark is run here: speed is measured by the scripts)."""

import doctest
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(
    p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith(("_", "harness"))
)


def test_the_harness_examples_hold():
    spec = importlib.util.spec_from_file_location("harness", BENCHMARKS / "harness.py")
    harness = importlib.util.module_from_spec(spec)
    sys.modules["harness"] = harness
    try:
        spec.loader.exec_module(harness)
        failed, attempted = doctest.testmod(harness, optionflags=doctest.ELLIPSIS)
    finally:
        sys.modules.pop("harness", None)
    assert attempted > 0 and failed == 0


# Runs `python SCRIPT --help` for every script in one process, so TensorFlow
# (which each script imports first, ~7 s of CPU) is imported once, not once
# per script: each script runs as `__main__` with its own argv, as from the
# command line, and its exit code and output are kept apart.
_HELP_DRIVER = """
import contextlib, io, json, runpy, sys, traceback
results = {}
for path in sys.argv[1:]:
    out, err, code = io.StringIO(), io.StringIO(), 0
    sys.argv = [path, "--help"]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        code, err = 1, io.StringIO(err.getvalue() + traceback.format_exc())
    results[path] = {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def help_of():
    """`{script name: {"code", "stdout", "stderr"}}` of `SCRIPT --help`."""
    env = {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "3",
        # As when run as `python benchmarks/SCRIPT`: `import harness` works.
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(BENCHMARKS), os.environ.get("PYTHONPATH")) if p
        ),
    }
    result = subprocess.run(
        [sys.executable, "-c", _HELP_DRIVER, *(str(BENCHMARKS / s) for s in SCRIPTS)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    last = result.stdout.strip().splitlines()[-1]
    return {Path(path).name: run for path, run in json.loads(last).items()}


@pytest.mark.xdist_group("benchmark_help")
@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_answers_help(help_of, script):
    result = help_of[script]
    assert result["code"] == 0, result["stderr"][-2000:]
    assert "--json" in result["stdout"] or "usage" in result["stdout"]
