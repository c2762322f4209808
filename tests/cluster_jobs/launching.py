"""Running a job of this directory on a local cluster: for the tests (and
benchmarks) that start one with `keras_psdist.cluster.launch`.

`tests/conftest.py` puts this directory on `sys.path`, so test modules
`import launching` (and the jobs, e.g. `import ps_loss_job`).
"""

import io
import re
import shutil
import sys
import warnings
from pathlib import Path

# The launcher's line for each process it starts: `[launch] ps:0 pid 4242: ...`.
PID_LINE = re.compile(r"^\[launch\] (\S+) pid (\d+):")


# The launcher's line when a server task's process crashed inside TensorFlow.
SERVER_CRASH = re.compile(r"^\[launch\] \S+ \(server\) exited with SIGSEGV", re.M)


def launch_job(job, args, out=None, **launch_kwargs):
    """Runs `python job *args` on a local cluster (`cluster.launch` with
    `launch_kwargs`). Returns `(exit code, the whole log)`.

    A launch whose *server* task (`keras-psdist serve`: a bare
    `tf.distribute.Server`, none of our code runs in it) died of SIGSEGV runs
    once more, with a warning: TensorFlow's gRPC server crashed so twice in
    some 300 between-graph launches, on a loaded 2-core machine (see
    docs/reliability.md). What the crashed attempt wrote into the directories
    among `args` moves to `<dir>.server-crash` first, so the second attempt
    starts as the first did. Any other failure, or a second crash, is
    returned.
    """
    dirs = [Path(a) for a in args if _is_dir(a)]
    before = {d: set(d.iterdir()) for d in dirs}
    code, log = _launch_once(job, args, out, launch_kwargs)
    crash = SERVER_CRASH.search(log)
    if crash:
        warnings.warn(
            f"{Path(job).name}: {crash.group(0)} (a TensorFlow server crash); "
            "launching once more.",
            stacklevel=2,
        )
        for d in dirs:
            kept = Path(f"{d}.server-crash")
            shutil.rmtree(kept, ignore_errors=True)
            kept.mkdir()
            (kept / "launch.log").write_text(log)
            for made in set(d.iterdir()) - before[d]:
                shutil.move(str(made), kept / made.name)
        code, log = _launch_once(job, args, out, launch_kwargs)
    return code, log


def _launch_once(job, args, out, launch_kwargs):
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


def _is_dir(arg) -> bool:
    """Whether a job argument names a directory (a long JSON config is no
    file name at all: `is_dir` would raise)."""
    if not isinstance(arg, (str, Path)):
        return False
    try:
        return Path(arg).is_dir()
    except OSError:
        return False
