"""The scheduling discipline's interface to the engine's step loop.

A `Schedule` decides what the engine's next step runs (`next`: one generator step, one
verifier call, or nothing left) and takes its results (`generated`, `scored`). It gets
what it works with as `ScheduleParts` (the model runner, the step rule, the score cache,
the request order, the metrics, the memory policy's re-plan hook, its typed options) and
holds no reference to the engine. The problems in flight every discipline shares are
`inflight.py`'s (each discipline holds one, built from its parts); a problem in flight
is `problem.py`'s.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

from tts.backends.base import GenDelta, StepStats
from tts.engine.inflight import Inflight
from tts.engine.messages import Generate, Score
from tts.engine.problem import Problem, ProblemInput
from tts.engine.requests import Request
from tts.engine.scoring import ScoringStats


class Schedule(ABC):
    """A scheduling discipline over the engine's step loop (the module docstring): what
    `Engine.run` and `Engine.step` call, and nothing else. Its problems are its
    `inflight` ones."""

    inflight: Inflight

    def add(self, problems: Iterable[ProblemInput]) -> None:
        """Queue problems to run."""
        self.inflight.add(problems)

    def busy(self) -> bool:
        """Problems wait or run."""
        return self.inflight.busy()

    @abstractmethod
    def next(self) -> Generate | Score | None:
        """The next piece of work; None when every problem is done."""

    @abstractmethod
    def generated(self, outputs: list[tuple[Request, GenDelta]], stats: StepStats) -> None:
        """Take one generator step's output."""

    @abstractmethod
    def scored(self, work: Score, stats: ScoringStats) -> None:
        """Take the result of the verifier call `work` asked for (the beams' scores are set)."""

    def take_finished(self) -> list[Problem]:
        """The problems finished since the last call (they have left those in flight)."""
        return self.inflight.take_finished()

    @abstractmethod
    def release(self) -> None:
        """Stop whatever still runs in the backend (the search ended, or the caller stopped)."""

    @abstractmethod
    def step_logs(self) -> dict[str, dict]:
        """The schedule's own statistics, beside the models' step logs."""
