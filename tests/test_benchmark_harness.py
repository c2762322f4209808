"""The benchmark scripts parse their arguments, and the shared harness's
examples hold (no benchmark is run here: speed is measured by the scripts)."""

import doctest
import importlib.util
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


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_answers_help(script):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--json" in result.stdout or "usage" in result.stdout
