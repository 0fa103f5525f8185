"""The plot helpers every PNG of tts is drawn with (a run's, a report's, a memory
profile's): matplotlib's pyplot on the Agg backend, imported on first use, and the one way
a figure is saved."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """matplotlib's pyplot on the Agg backend, imported on first use (every plot of tts)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: Path, rect: tuple[float, float, float, float] | None = None) -> Path:
    """Lay the figure out (within `rect`), write it as a PNG and close it."""
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path
