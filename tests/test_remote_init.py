"""A variable keras_psdist makes on a remote task holds its initial value
before a function can write it: TensorFlow sends a remote variable's initial
write without waiting for it, and a function's write sent next can land
first, to be overwritten (`keras_psdist.devices.device_variable` tells the
measure). `tests/scripts/remote_init_race.py` makes variables on a ps task
while other threads keep the task busy, writes them at once, and counts the
reads that missed the write."""

import os
import subprocess
from pathlib import Path

import pytest
import zygote  # tests/cluster_jobs, see conftest.py

SCRIPT = Path(__file__).parent / "scripts" / "remote_init_race.py"
RUNS = 100

pytestmark = pytest.mark.multiprocess


@pytest.mark.timeout(300)
def test_a_remote_variable_holds_its_value_before_the_first_write():
    makers = ("device_variable", "shared_variables")
    # A fork of the test zygote: TensorFlow imported, its runtime not begun.
    env, python = zygote.python_in(dict(os.environ))
    done = subprocess.run(
        [*python, str(SCRIPT), "--runs", str(RUNS), "--make", *makers],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    for make in makers:
        assert f"{make}: 0 of {RUNS} reads missed the write" in done.stdout, (
            f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-4000:]}"
        )
    assert done.returncode == 0
