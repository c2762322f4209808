"""Running a job of this directory on a local cluster: for the tests (and
benchmarks) that start one with `keras_psdist.cluster.launch`.

`tests/conftest.py` puts this directory on `sys.path`, so test modules
`import launching` (and the jobs, e.g. `import ps_loss_job`).
"""

import io
import re
import sys
from pathlib import Path

# The launcher's line for each process it starts: `[launch] ps:0 pid 4242: ...`.
PID_LINE = re.compile(r"^\[launch\] (\S+) pid (\d+):")


def launch_job(job, args, out=None, **launch_kwargs):
    """Runs `python job *args` on a local cluster (`cluster.launch` with
    `launch_kwargs`). Returns `(exit code, the whole log)`."""
    from keras_psdist import cluster

    out = io.StringIO() if out is None else out
    # A caller's `out` may hold earlier text; the log is this launch's part.
    start = len(out.getvalue()) if hasattr(out, "getvalue") else 0
    code = cluster.launch(
        [sys.executable, str(Path(job).resolve()), *map(str, args)],
        out=out,
        **launch_kwargs,
    )
    return code, out.getvalue()[start:] if hasattr(out, "getvalue") else ""


def without_progress(log):
    """`log` without Keras's progress lines, to print on failure."""
    return "\n".join(
        line
        for line in log.splitlines()
        if "/step" not in line and "Epoch " not in line
    )
