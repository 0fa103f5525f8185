"""What the decoupled schedule tracks of a problem in flight, and of an LLM round."""

from __future__ import annotations

from dataclasses import dataclass, field

from tts.engine.requests import Request
from tts.engine.schedule import Problem
from tts.engine.scoring import ScoreItem
from tts.search.tree import Beam


@dataclass(eq=False)
class DecoupledProblem(Problem):
    """A problem in flight, with what the decoupled schedule tracks of it."""

    order: int = 0
    waiting: set[int] = field(default_factory=set)  # frontier beams without their step
    to_score: int = 0  # frontier beams with a score still missing
    spec: dict[tuple[int, int], Request] = field(default_factory=dict)  # by (parent uid, child seed)
    lengths: list[int] = field(default_factory=list)  # new tokens per step, this iteration


@dataclass
class LLMRound:
    """An LLM round in progress."""

    start: float
    steps: int = 0
    progressed: bool = False
    touched: dict[str, DecoupledProblem] = field(default_factory=dict)


@dataclass
class PRMCall:
    """A PRM call in progress: its (problem, beam) pairs, their items, and each beam's
    last scored step before it."""

    batch: list[tuple[DecoupledProblem, Beam]]
    items: list[ScoreItem]
    before: list[int]
