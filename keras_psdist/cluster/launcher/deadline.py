"""`launch(timeout_s=...)`: when training has run too long."""

from __future__ import annotations

import math
import time

from keras_psdist.cluster.launcher.processes import Stop

# The exit code on timeout, as `timeout(1)` reports it.
EXIT_TIMEOUT = 124


class Deadline:
    """The end of `--timeout`, counted from when this is made (when the
    training processes start).

    Args:
        timeout_s: Seconds from now, or `None` for no limit.
    """

    def __init__(self, timeout_s: float | None):
        self.timeout_s = timeout_s
        # On `time.monotonic()`'s clock; `None`: no limit.
        self.at = None if timeout_s is None else time.monotonic() + timeout_s

    def remaining(self) -> float:
        """Seconds left (`math.inf` without a limit; negative once past)."""
        if self.at is None:
            return math.inf
        return self.at - time.monotonic()

    def check(self) -> None:
        """Raises `Stop(EXIT_TIMEOUT)` once the deadline has passed."""
        if self.at is not None and time.monotonic() >= self.at:
            raise Stop(
                EXIT_TIMEOUT,
                f"timed out after {self.timeout_s:g} s (--timeout); stopping "
                "every task.",
            )
