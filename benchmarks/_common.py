"""Small helpers every benchmark script shares (no TensorFlow import)."""

from __future__ import annotations

import argparse
import os
import sys


def log(msg: str) -> None:
    """Progress to stderr, so stdout keeps only the results."""
    print(msg, file=sys.stderr, flush=True)


def loadavg() -> list[float] | None:
    """1/5/15-minute load averages: other processes skew a 2-core machine."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def positive(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value
