"""Where this checkout is, and how a process is set up to run from it.

`REPO_ROOT` and `RESULTS` (``benchmarks/results``); `prepare_tensorflow`
(call it before TensorFlow is imported), `ensure_importable` and
`use_checkout` (import `keras_psdist` from this checkout, in this process or
in its children too).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS = REPO_ROOT / "benchmarks" / "results"


def prepare_tensorflow() -> None:
    """Quiets TensorFlow's C++ logs and selects Keras's TensorFlow backend,
    unless set already: call it before TensorFlow is imported."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")


def ensure_importable() -> None:
    """Lets this process import `keras_psdist` from this checkout when it is
    not installed (an installed one is used first)."""
    try:
        import keras_psdist  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(REPO_ROOT))


def use_checkout() -> None:
    """Lets this process and its children import `keras_psdist` from this
    checkout, installed or not."""
    sys.path.insert(0, str(REPO_ROOT))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p
    )
