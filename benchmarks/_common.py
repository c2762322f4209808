"""Small helpers every benchmark script shares (no TensorFlow import)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def log(msg: str) -> None:
    """Progress to stderr, so stdout keeps only the results."""
    print(msg, file=sys.stderr, flush=True)


def loadavg() -> list[float] | None:
    """1/5/15-minute load averages: other processes skew a 2-core machine."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# ------------------------------------------------------------ argparse types


def positive(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a number > 0."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def non_negative_float(text: str) -> float:
    """argparse type: a number >= 0."""
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


# ---------------------------------------------------------------- output


def save_json(path: str | Path, payload: dict, indent: int = 2, end: str = "\n"):
    """Writes `payload` as JSON to `path`, creating its folder; returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=indent) + end)
    return out


def machine() -> dict:
    """The machine and the TensorFlow / Keras versions a run measured on."""
    import keras
    import tensorflow as tf

    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "gpus": len(tf.config.list_physical_devices("GPU")),
    }


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


# ------------------------------------- benchmarks that start local clusters
# (`cluster.py`, `sync_replicas.py`): a run is a `launch` of processes that
# report through JSON files in a temporary folder and log to a file beside it.


def use_checkout() -> None:
    """Lets this process and its children import `keras_psdist` from this
    checkout, installed or not."""
    sys.path.insert(0, str(REPO_ROOT))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p
    )


class RunFailed(RuntimeError):
    """A run's processes failed; the message has their last lines."""


def run_dir(work: Path, prefix: str) -> tuple[Path, Path]:
    """A fresh folder under `work` for a run's reports, and its log file."""
    out_dir = Path(tempfile.mkdtemp(prefix=prefix, dir=work))
    return out_dir, out_dir.with_suffix(".log")


def run_process(command: list[str], log: Path, timeout_s: float) -> int:
    """Runs `command` with its output in `log`; its exit code, 124 on timeout."""
    with open(log, "w") as f:
        try:
            return subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
            ).returncode
        except subprocess.TimeoutExpired:
            return 124


def tail(path: Path, lines: int = 30) -> str:
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


def ok(entry: dict, key: str) -> bool:
    """Whether a round's `entry` has a result for `key` that did not fail."""
    return key in entry and "error" not in entry[key]


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "failed" if value is None else f"{value:{spec}}{suffix}"


def value_range(values: list[float], spec: str) -> str:
    return f"{min(values):{spec}}..{max(values):{spec}}" if values else ""


def finish(
    args: argparse.Namespace,
    settings: tuple[str, ...],
    load_start: list[float] | None,
    wall_s: float,
    summary: dict,
    rounds: dict[str, list[dict]],
) -> int:
    """The end of a run, after its tables: prints the wall time and load,
    writes `args.json` (the `settings` of `args`, the machine, `summary` and
    `rounds`), and returns the exit code: 1 if any run failed."""
    load_end = loadavg()
    print(
        f"wall time {wall_s:.0f} s; load average (1/5/15 min) at start "
        f"{load_start}, at end {load_end} on {os.cpu_count()} CPUs"
    )
    out = save_json(
        args.json,
        {
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "settings": {k: getattr(args, k) for k in settings},
            "machine": machine(),
            "loadavg_start": load_start,
            "loadavg_end": load_end,
            "wall_s": wall_s,
            "summary": summary,
            **rounds,
        },
        indent=1,
        end="",
    )
    print(f"wrote {out}")
    failed = any(
        "error" in v
        for entries in rounds.values()
        for e in entries
        for v in e.values()
        if isinstance(v, dict)
    )
    return 1 if failed else 0
