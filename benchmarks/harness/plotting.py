"""Plots: a matplotlib figure saved as PNG (`figure`), matplotlib imported
on first use only (on the Agg backend)."""

from __future__ import annotations

import contextlib
from pathlib import Path


def check_available(path) -> None:
    """Exits at once, saying how to install it, when a plot is asked for
    (`path` not None) and matplotlib is missing: not after an hour of runs."""
    if path is None:
        return
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit(
            f"--plot {path} needs matplotlib, which is not installed. Install the "
            "benchmark extra (pip install -e '.[bench]') or leave out --plot."
        ) from None


def pyplot():
    """matplotlib's pyplot on the Agg backend (imported on first use)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@contextlib.contextmanager
def figure(path: str | Path, *subplots, tight_layout: dict | None = None, **kwargs):
    """A matplotlib figure saved to `path` (PNG, 120 dpi, its folder made)
    when the block ends; yields ``(fig, axes)`` of
    ``plt.subplots(*subplots, **kwargs)``; `tight_layout` are that call's
    arguments (e.g. ``{"rect": (0, 0.06, 1, 1)}``)."""
    plt = pyplot()
    fig, axes = plt.subplots(*subplots, **kwargs)
    try:
        yield fig, axes
        fig.tight_layout(**(tight_layout or {}))
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=120)
    finally:
        plt.close(fig)
