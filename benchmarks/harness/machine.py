"""What a run measured on: the machine, its load, the versions and the
git commit (`environment`)."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess

from .checkout import REPO_ROOT


def loadavg() -> list[float] | None:
    """1/5/15-minute load averages: other processes skew a 2-core machine."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def cpu_model() -> str | None:
    """The CPU's model name, from /proc/cpuinfo (else `platform.processor`)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def git_commit() -> str | None:
    """The checkout's HEAD commit, or None outside a git checkout."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def environment() -> dict:
    """What a run measured on: date (UTC), machine, load average, the
    versions of Python, TensorFlow, Keras, NumPy and keras_psdist, the git
    commit and TensorFlow's thread settings. Imports TensorFlow."""
    import keras
    import numpy as np
    import tensorflow as tf

    try:
        import keras_psdist

        psdist_version = keras_psdist.__version__
    except Exception:  # noqa: BLE001 - recorded as unknown
        psdist_version = None
    threading = tf.config.threading
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "sched_affinity": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else None,
        "loadavg": loadavg(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "numpy": np.__version__,
        "keras_psdist": psdist_version,
        "git_commit": git_commit(),
        "gpus": len(tf.config.list_physical_devices("GPU")),
        "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
        "inter_op_threads": threading.get_inter_op_parallelism_threads(),
        "intra_op_threads": threading.get_intra_op_parallelism_threads(),
    }
