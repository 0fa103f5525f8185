"""Quiet runs: vLLM's, torch's, transformers' and W&B's output goes to the run's log file.

A run prints dozens of INFO and WARNING lines from the libraries under it (vLLM's engine
start-up and periodic stats, torch's C++ NUMA warnings, progress bars of weight loading,
W&B banners) that bury what the user ran it for. `QuietOutput` points this process's file
descriptors 1 and 2 at `<run folder>/tts.log` once the run folder exists, so everything
written there, by Python or by C++, lands in the log; the terminal keeps what tts itself
shows (the progress display, the host line, the tables, the paths), written to duplicates
of the original descriptors. Errors are printed in full once the descriptors are back.
`tts bench -v` leaves everything on the terminal.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TextIO

LOG_FILE = "tts.log"


class QuietOutput:
    """Redirects fds 1 and 2 to a log file between `start` and `stop` (module doc)."""

    def __init__(self) -> None:
        self.log_path: Path | None = None
        self._saved: tuple[int, int] | None = None
        # the terminal's stderr, whatever fd 2 points at later: for the progress display
        self.term_err: TextIO = os.fdopen(os.dup(2), "w", buffering=1)

    def start(self, folder: Path) -> None:
        if self._saved is not None:
            return
        self.log_path = Path(folder) / LOG_FILE
        sys.stdout.flush()
        sys.stderr.flush()
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._saved = (os.dup(1), os.dup(2))
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)

    def stop(self) -> None:
        if self._saved is None:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        out, err = self._saved
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)
        self._saved = None

    def close(self) -> None:
        self.stop()
        try:
            self.term_err.close()
        except OSError:
            pass


def wandb_line(folder: Path) -> str | None:
    """One line for the W&B run a bench wrote under `folder` (offline: where, and the sync
    command), instead of W&B's banners; None without one."""
    runs = sorted((folder / "wandb").glob("offline-run-*")) if (folder / "wandb").is_dir() else []
    if runs:
        return f"W&B: offline run {runs[-1]} (upload with `wandb sync {runs[-1]}`)"
    online = sorted((folder / "wandb").glob("run-*")) if (folder / "wandb").is_dir() else []
    return f"W&B: synced run files in {online[-1]}" if online else None
