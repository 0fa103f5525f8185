"""What the decoupled schedule tracks of an LLM round and of a PRM call."""

from __future__ import annotations

from dataclasses import dataclass, field

from tts.engine.problem import Problem
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
    """A PRM call in progress: its (problem, beam) pairs (its items are the `Score`
    message's)."""

    batch: list[tuple[Problem, Beam]]
