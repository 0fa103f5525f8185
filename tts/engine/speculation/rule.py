"""A start rule: which speculative work starts, and when. What a rule author writes; the
rest of speculation exists once, under every rule: the mechanism (`steps.py`: the tables,
start, preemption, adoption, drop), what each discipline holds of it (`driver.py`: the
fill within the free slots, the memory rule, the cost guard, the count; the barrier's
side of an iteration, `iteration.py`).

A rule proposes candidates, and may react when a step ends. Four methods, one of them
required:

- `candidates(problems)`: (problem, beam, child k) of the speculative steps to start, best
  first; the discipline starts them in the slots real work leaves free, child k's step on
  its beam's committed path (or resumes it), and skips a beam whose speculation pruning
  stopped (`optim.spec_prune`, which works for every rule). It is read only as far as the
  free slots go: a list will do, and a generator computes no more than is started (at
  n=512 a step has a few free slots and a rule may have a thousand candidates);
- `step_done(request)`: a real request's step ended, and it may speculate (its bin claims
  speculation, and its step does not end its path);
- `preempted(requests)`: the mechanism stopped these running speculative requests
  (memory, or real work needs the slot); they wait to start again;
- `selected(problem, parents)`: after the problem's selection (`parents`: the frontier it
  selected from): its speculation is handed down, or forgotten.

A rule with `runs_on` is in the mechanism's run-on mode (the paper's, `runon.py`): a
candidate (problem, beam, 0) is that beam's finished real request, which runs on past its
step in its own backend request instead of starting child 0's step beside it. A new rule
subclasses `StartRule`, names itself, and is registered by name (`registry.py`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import ClassVar

from tts.engine.inflight import ScheduleParts
from tts.engine.problem import Problem
from tts.engine.requests import Request, RequestState
from tts.engine.speculation.steps import SpeculativeSteps
from tts.search.tree import Beam

# backend requests to stop, each to be left in its state
Stops = list[tuple[Request, RequestState]]


class StartRule(ABC):
    """Which speculative work starts, and when (module docstring), over the mechanism
    `steps`, with the schedule's `parts`. `disciplines` names the schedules that can drive
    it; `runs_on`, the mechanism's run-on mode."""

    name: ClassVar[str]
    disciplines: ClassVar[tuple[str, ...]] = ("barrier",)
    runs_on: ClassVar[bool] = False

    def __init__(self, steps: SpeculativeSteps, parts: ScheduleParts) -> None:
        self.steps = steps
        self.parts = parts

    @abstractmethod
    def candidates(self, problems: Sequence[Problem]) -> Iterable[tuple[Problem, Beam, int]]:
        """(problem, beam, child k) of the speculative steps to start, best first; read only
        as far as the free slots go (a generator may stop there)."""

    def step_done(self, request: Request) -> None:  # noqa: B027 - optional hook
        """A real request's step ended, and it may speculate (its children's steps may start)."""

    def preempted(self, requests: Sequence[Request]) -> None:  # noqa: B027 - optional hook
        """These running speculative requests were stopped before their end; they wait."""

    def selected(self, problem: Problem, parents: dict[int, Beam]) -> None:  # noqa: B027 - optional hook
        """After the problem's selection (`parents`: the frontier it selected from)."""


class NoSpeculation(StartRule):
    """Nothing speculates (the barrier without `speculative`)."""

    name = "none"
    disciplines = ("barrier", "decoupled")

    def candidates(self, problems: Sequence[Problem]) -> list[tuple[Problem, Beam, int]]:
        return []
