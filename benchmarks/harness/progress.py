"""Progress lines on stderr, so that stdout keeps only the results."""

from __future__ import annotations

import sys


def log(msg: str) -> None:
    """Progress to stderr, so stdout keeps only the results."""
    print(msg, file=sys.stderr, flush=True)


def log_failure(name: str, round_: int, error: BaseException) -> None:
    """An `on_error` for `interleaved_rounds`: logs ``  failed: <error>``."""
    log(f"  failed: {error}")
