"""The problem record shared by all benchmark loaders."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One benchmark problem.

    ``answer`` is always a string (integers as "27", fractions as "3/4" or LaTeX);
    ``level`` is the MATH difficulty (1-5) or the embedded set's level, else None;
    ``source`` names the dataset the problem came from.
    """

    id: str
    problem: str
    answer: str
    level: int | None = None
    subject: str | None = None
    source: str = ""
