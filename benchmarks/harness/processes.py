"""Benchmarks that start local clusters (`cluster.py`, `sync_replicas.py`,
`embeddings.py`, ...): a run is a `launch` of processes that report through
JSON files in a fresh folder (`run_dir`) and log to a file beside it;
`read_reports` reads them back, or raises `RunFailed` with the log's tail."""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path


class RunFailed(RuntimeError):
    """A run's processes failed; the message has their last lines."""


def run_dir(work: Path, prefix: str) -> tuple[Path, Path]:
    """A fresh folder under `work` for a run's reports, and its log file."""
    out_dir = Path(tempfile.mkdtemp(prefix=prefix, dir=work))
    return out_dir, out_dir.with_suffix(".log")


def run_process(
    command: list[str],
    log: Path,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
) -> int:
    """Runs `command` with its output in `log` (and `env` for environment,
    else this process's); its exit code, 124 on timeout."""
    with open(log, "w") as f:
        try:
            return subprocess.run(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
            ).returncode
        except subprocess.TimeoutExpired:
            return 124


def launch_logged(command: list[str], log: Path, **launch_kwargs) -> int:
    """`keras_psdist.cluster.launch(command, **launch_kwargs)` with every
    process's output in `log`; its exit code."""
    from keras_psdist.cluster import launch

    with open(log, "w") as f:
        return launch(command, out=f, **launch_kwargs)


def tail(path: Path, lines: int = 30) -> str:
    """The last `lines` lines of a log file."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def read_reports(
    out_dir: Path, expected: int, log: Path, code: int, pattern: str = "*.json"
) -> list[dict]:
    """The run's `expected` JSON reports (sorted by file name), or RunFailed."""
    found = sorted(out_dir.glob(pattern))
    if code != 0 or len(found) != expected:
        raise RunFailed(
            f"exit code {code}, {len(found)} of {expected} result files; last "
            f"lines of {log}:\n{tail(log)}"
        )
    return [json.loads(p.read_text()) for p in found]


def chief_of_worker_job(
    job: Path, work: Path, prefix: str, config: dict, workers: int, timeout_s: float
) -> dict:
    """One between-graph `launch` of `python JOB OUT_DIR CONFIG_JSON` on
    `workers` workers + 1 ps, each worker writing ``worker_<i>.json`` into
    a fresh folder under `work`: the chief's report (``is_chief``) with the
    run's ``wall_s``, or `RunFailed`."""
    import sys
    import time

    start = time.perf_counter()
    out_dir, log = run_dir(work, prefix)
    code = launch_logged(
        [sys.executable, str(job), str(out_dir), json.dumps(config)],
        log,
        num_ps=1,
        num_workers=workers,
        mode="between-graph",
        timeout_s=timeout_s,
    )
    reports = read_reports(out_dir, workers, log, code, "worker_*.json")
    (chief,) = [r for r in reports if r["is_chief"]]
    return {**chief, "wall_s": time.perf_counter() - start}
