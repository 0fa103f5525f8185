"""What the decoupled schedule tracks of an LLM round and of a PRM call."""

from __future__ import annotations

from dataclasses import dataclass, field

from tts.engine.schedule import Problem
from tts.engine.scoring import ScoreItem
from tts.search.tree import Beam


@dataclass
class LLMRound:
    """An LLM round in progress."""

    start: float
    steps: int = 0
    progressed: bool = False
    touched: dict[str, Problem] = field(default_factory=dict)


@dataclass
class PRMCall:
    """A PRM call in progress: its (problem, beam) pairs, their items, and each beam's
    last scored step before it."""

    batch: list[tuple[Problem, Beam]]
    items: list[ScoreItem]
    before: list[int]
