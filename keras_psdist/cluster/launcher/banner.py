"""TensorFlow's start-up banner, and leaving it out of what users read.

Every process that imports TensorFlow prints the same few lines, whatever it
runs: absl's and oneDNN's notices, "Could not find cuda drivers", the CPU
instruction note, cuInit failing for want of a GPU, and tf.data's note on
`from_generator` inputs. Most come from shared-library initialisers, before
`TF_CPP_MIN_LOG_LEVEL` applies, so only leaving the lines out of the output
hides them. `keras-psdist launch` leaves them out of its children's output
and `keras-psdist demo` out of its own stderr, unless `--verbose`.

Each pattern of `TF_BANNER` matches one whole line, exactly: a line they do
not match is shown, so no real error is hidden (a GPU whose driver fails
says so in other words, and is shown).

No TensorFlow import here: the command line uses this before TensorFlow loads.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator

_LOG_PREFIX = r"[IWE]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ "
TF_BANNER: tuple[re.Pattern[str], ...] = tuple(
    re.compile(pattern)
    for pattern in (
        # absl, once per TensorFlow shared library, at load time.
        r"WARNING: All log messages before absl::InitializeLog\(\) is called "
        r"are written to STDERR",
        _LOG_PREFIX + r"port\.cc:\d+\] oneDNN custom operations are on\. You may "
        r"see slightly different numerical results due to floating-point "
        r"round-off errors from different computation orders\. To turn them "
        r"off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`\.",
        _LOG_PREFIX + r"cudart_stub\.cc:\d+\] Could not find cuda drivers on your "
        r"machine, GPU will not be used\.",
        # No GPU on this machine (a GPU whose driver fails says otherwise).
        _LOG_PREFIX + r"cuda_platform\.cc:\d+\] failed call to cuInit: INTERNAL: "
        r"CUDA error: Failed call to cuInit: (UNKNOWN ERROR \(303\)|"
        r"CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected)",
        # Two lines: the second has no prefix.
        _LOG_PREFIX + r"cpu_feature_guard\.cc:\d+\] This TensorFlow binary is "
        r"optimized to use available CPU instructions in performance-critical "
        r"operations\.",
        r"To enable the following instructions: [A-Z0-9_ ]+, in other "
        r"operations, rebuild TensorFlow with the appropriate compiler flags\.",
        # tf.data, for every `from_generator` input (Keras adapters use it).
        _LOG_PREFIX + r"[\w.]+:\d+\] Input of GeneratorDatasetOp::Dataset will "
        r"not be optimized because the dataset does not implement the "
        r"AsGraphDefInternal\(\) method needed to apply optimizations\.",
    )
)


def is_tf_banner(line: str) -> bool:
    """Whether `line` (no line break) is a line of TensorFlow's start-up banner.

    Examples:

    >>> is_tf_banner("WARNING: All log messages before absl::InitializeLog() "
    ...              "is called are written to STDERR")
    True
    >>> is_tf_banner("E0000 00:00:1795559549.150059   27148 cuda_platform.cc:52] "
    ...              "failed call to cuInit: INTERNAL: CUDA error: Failed call to "
    ...              "cuInit: UNKNOWN ERROR (303)")
    True
    >>> is_tf_banner("E0000 00:00:1795559549.150059   27148 cuda_platform.cc:52] "
    ...              "failed call to cuInit: CUDA_ERROR_SYSTEM_DRIVER_MISMATCH")
    False
    """
    return any(pattern.fullmatch(line) for pattern in TF_BANNER)


@contextlib.contextmanager
def hidden_on_stderr() -> Iterator[None]:
    """Leaves TensorFlow's start-up banner out of this process's stderr.

    TensorFlow's shared libraries print the banner (the lines
    `TF_BANNER` matches) on file descriptor 2
    as they load, before TF_CPP_MIN_LOG_LEVEL applies, so only a filter on
    the descriptor hides it. While inside, fd 2 is a pipe to a forked copy of
    this process that copies every other line to the real stderr. Being a
    process of its own, it drains the pipe even if this one dies (a crash's
    trace is not lost). Without `os.fork`, nothing is hidden.
    """
    if not hasattr(os, "fork"):
        yield
        return
    sys.stderr.flush()
    stderr = os.dup(2)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(write_end)
            # It ends when the pipe does: at the end of the block, or when
            # this process dies. Not on Ctrl-C, which reaches the whole
            # process group: what this process prints as it stops must pass.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            _copy_lines(read_end, stderr, is_tf_banner)
        finally:
            os._exit(0)
    os.close(read_end)
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(stderr, 2)  # Closes the pipe's last write end...
        os.close(stderr)
        _reap(pid, timeout_s=5.0)  # ... so the filter drains it and exits.


def _copy_lines(source: int, target: int, hide: Callable[[str], bool]) -> None:
    """Copies `source` to `target` (file descriptors) until EOF, line by
    line, leaving out the lines `hide` picks."""
    pending = b""
    while chunk := os.read(source, 65536):
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            if not hide(line.decode("utf-8", errors="replace").rstrip("\r")):
                _write_all(target, line + b"\n")
    if pending and not hide(pending.decode("utf-8", errors="replace")):
        _write_all(target, pending)


def _write_all(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):  # A closed stderr: nothing to tell.
        while data:
            data = data[os.write(fd, data) :]


def _reap(pid: int, timeout_s: float) -> None:
    """Waits for child `pid` to exit, for at most `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    # A process started inside the block keeps the pipe open while it runs:
    # the filter then goes on, on its own, and is not waited for.
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(pid, os.WNOHANG)[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
