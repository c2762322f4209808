"""The side-car evaluator of a launch (`launch(evaluator=True)`).

The training command run once more as task `evaluator:0`, on idle CPU
time; it never stops training, and is told through a stop file when
training has ended, then waited for within `--timeout`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from keras_psdist.cluster.config import (
    EVALUATOR,
    EVALUATOR_STOP_FILE_ENV,
    ClusterConfig,
)
from keras_psdist.cluster.launcher.deadline import EXIT_TIMEOUT, Deadline
from keras_psdist.cluster.launcher.processes import Child, Stop, describe, exit_code


class EvaluatorProcess:
    """The side-car evaluator of a launch: started with the training
    processes, never stopping them, told when training has ended."""

    # How long the evaluator may take, once training has ended, to evaluate
    # the last checkpoints (without a --timeout).
    FINISH_S = 600.0

    def __init__(
        self,
        config: ClusterConfig,
        directory: str,
        *,
        spawn: Callable[[ClusterConfig, dict[str, str] | None, bool], Child],
        deadline: Deadline,
        check_signals: Callable[[], None],
        log: Callable[[str], None],
    ):
        """Starts the evaluator.

        Args:
            config: The training cluster.
            directory: Where its stop file goes (removed by the launch).
            spawn: Runs the training command as a task: `spawn(config, env,
                idle)` adds `env` to its environment and returns its `Child`.
            deadline: The launch's `--timeout`.
            check_signals: Raises if the launcher got SIGINT or SIGTERM.
            log: Writes one of the launcher's lines.
        """
        self.deadline = deadline
        self.check_signals = check_signals
        self.log = log
        self.directory = directory
        self.stop_file = os.path.join(directory, "training-ended")
        self.child = spawn(
            config.with_task(EVALUATOR, 0),
            {EVALUATOR_STOP_FILE_ENV: self.stop_file},
            True,
        )
        self.failed: int | None = None

    def check(self) -> None:
        """Says once if the evaluator failed; training goes on."""
        code = self.child.proc.poll()
        if code not in (None, 0) and self.failed is None:
            self.failed = code
            self.log(
                f"evaluator:0 exited with {describe(code)}; training goes on "
                "without it (see its output above)."
            )

    def finish(self) -> int:
        """Training ended well: the evaluator evaluates what is left and
        exits. Returns its exit code."""
        self.check()
        if self.failed is None:
            with open(self.stop_file, "w") as f:
                f.write("training ended\n")
            self.log(
                "told evaluator:0 that training has ended; waiting for it to "
                "evaluate the last checkpoints."
            )
            end = time.monotonic() + min(self.FINISH_S, self.deadline.remaining())
            while self.child.proc.poll() is None:
                self.check_signals()
                if time.monotonic() >= end:
                    raise Stop(
                        EXIT_TIMEOUT,
                        "evaluator:0 did not finish after training ended; stopping it.",
                    )
                time.sleep(0.1)
            self.check()
        if self.failed is not None:
            return exit_code(self.failed)
        self.log("evaluator:0 finished (exit code 0).")
        return 0
