"""A start rule: which speculative work starts, and when. The one interface a discipline
drives speculation through; the mechanism under it (`steps.py`: the tables, start,
preemption, adoption, drop, the memory guard) exists once.

A discipline drives its rule by five calls:

- fill: `fill(problems, free)` starts speculation in at most `free` batch slots (`hold`
  when memory or the cost guard says none may start: `allows`);
- preempt: `preempt(k)` stops up to k running speculative requests, newest first;
- take a generator output: `take` for a request the rule `owns`, and `step_done` when a
  real request's step ends (a rule may let it run on);
- react to memory: `relieve` after every generator step (`MemoryGuard.relieve`);
- after selection: `selected(problem, parents)` hands speculation down.

The barrier's iteration adds a few hooks with defaults (`begin`, `extra_tokens`, `end`,
`spec_tokens`, `count_used`, `speculates`, `stop_beams`), and the decoupled schedule's
fill asks `pending` and signals `changed`. A new rule subclasses `StartRule` (or
`TableRule`, whose steps are children's steps held in their problems' tables and adopted
after selection), names itself, and is registered by name (`registry.py`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from tts.backends.base import GenDelta, StepStats
from tts.engine.frontier import ScheduleParts
from tts.engine.problem import Problem
from tts.engine.requests import Request, RequestKind, RequestState
from tts.engine.speculation.guard import SpeculationGuard
from tts.engine.speculation.memory import MemoryGuard
from tts.engine.speculation.steps import SpeculativeSteps
from tts.search.base import ProblemSearch
from tts.search.tree import Beam

# backend requests to stop, each to be left in its state
Stops = list[tuple[Request, RequestState]]


class StartRule(ABC):
    """Which speculative work starts, and when (module docstring), over the mechanism
    `steps`, with the schedule's `parts`. `disciplines` names the schedules that can drive
    it. `guard`, where set, says whether speculation pays (`guard.py`)."""

    name: ClassVar[str]
    disciplines: ClassVar[tuple[str, ...]] = ("barrier",)

    def __init__(self, steps: SpeculativeSteps, parts: ScheduleParts) -> None:
        self.steps = steps
        self.parts = parts
        self.guard: SpeculationGuard | None = None

    @property
    def memory(self) -> MemoryGuard:
        return self.steps.memory

    # ------------------------------------------------------------------ fill

    @abstractmethod
    def fill(self, problems: Sequence[Problem], free: int) -> Stops:
        """Start speculation for `problems` in at most `free` batch slots. Returns the
        backend requests to stop."""

    def hold(self) -> Stops:
        """No speculation may start now (`allows`); returns the requests to stop."""
        return []

    def allows(self) -> bool:
        """New speculation may start: memory allows, and it pays (the guard, where set)."""
        return self.memory.allows() and (self.guard is None or self.guard.allows())

    def pending(self, problems: Sequence[Problem]) -> bool:
        """Speculation is waiting to start (the decoupled fill policy's choice)."""
        return False

    def changed(self) -> None:  # noqa: B027 - optional hook
        """A step committed, scores came, a selection ran or a request stopped."""

    # --------------------------------------------------------------- preempt

    def running(self) -> list[Request]:
        """The speculative requests running in the backend, oldest first (not those whose
        step just ended)."""
        return [r for r in self.steps.running() if not r.finished]

    def preempt(self, k: int | None = None) -> list[Request]:
        """Stop up to `k` running speculative requests (all: None), newest first; they wait
        (`SpeculativeSteps.preempt`: counted, reset where sampling is not resumable)."""
        running = self.running()
        nodes = running if k is None else running[::-1][:k]
        if nodes:
            self.steps.preempt(nodes)
            self.changed()
        return nodes

    # ----------------------------------------------- take a generator output

    def owns(self, request: Request) -> bool:
        """The request is the rule's to take (a speculative step)."""
        return request.kind is RequestKind.SPEC

    def take(self, request: Request, d: GenDelta) -> bool:
        """One generator delta of a request the rule owns; True: stop it (its step ended
        before its backend request did). A step stopped at its cap holds part of a step."""
        out = self.steps.cut.finish(request, d)
        if out.ended:
            self.steps.stopped(request)
        return out.stop

    def step_done(self, request: Request, speculate: bool, d: GenDelta, overflow: Sequence[int]) -> bool:
        """A real request's step just ended (`speculate`: it may speculate; `overflow`: its
        tokens past the step). True: it keeps running."""
        return False

    # --------------------------------------------------------- react to memory

    def relieve(self, st: StepStats) -> bool:
        """After a generator step: where memory is short, every running speculative request
        is preempted and none starts for a while. True when it was."""
        return self.memory.relieve(st, len(self.running()), self.preempt)

    # ------------------------------------------------------- after selection

    def selected(self, problem: Problem, parents: dict[int, Beam]) -> None:  # noqa: B027 - optional hook
        """After the problem's selection (`parents`: the frontier it selected from)."""

    # ------------------------------------------------ the barrier's iteration

    def begin(self, finished: Sequence[Request]) -> None:  # noqa: B027 - optional hook
        """A new iteration; `finished`: its requests that adopted a whole step and may
        speculate."""

    def speculates(self, search: ProblemSearch) -> bool:
        """The search's beams may claim speculative slots this iteration (by their bins)."""
        return True

    def extra_tokens(self, request: Request) -> int:
        """Tokens a real request asks for beyond its step."""
        return 0

    def speculating(self) -> bool:
        """Some speculation runs or waits for a slot."""
        return bool(self.running())

    def stop_beams(self, beams: set[int]) -> tuple[list[Request], int]:
        """Speculation pruning: these beams' speculation stops. Returns the requests to
        stop, and how many waiting ones lost their claim."""
        return [], 0

    def end(self) -> None:  # noqa: B027 - optional hook
        """Every real request of the iteration has its step."""

    def release(self) -> None:  # noqa: B027 - optional hook
        """The search ended (or the caller stopped): let go what no child will take."""

    def spec_tokens(self, request: Request) -> tuple[int, ...]:
        """The beam's speculative tokens after generation (lookahead scores their step)."""
        return ()

    def count_used(self, problem: Problem, requests: Sequence[Request]) -> None:  # noqa: B027 - optional hook
        """Count the speculative tokens the iteration's requests started from (where the
        rule does not count them as a child adopts its step)."""

    def step_logs(self) -> dict[str, dict]:
        """The run's speculative work (`SpeculationLog`), with the cost guard's where set:
        the one step-log entry of speculation, whichever discipline runs it."""
        out = self.parts.collector.speculation.summary()
        if self.guard is not None:
            out.update(self.guard.summary())
        return {"speculation": out}


class TableRule(StartRule):
    """A rule whose speculative work is children's steps, held in their problems' tables
    until selection adopts or drops them (`steps.py`): it only orders the candidates."""

    def __init__(self, steps: SpeculativeSteps, parts: ScheduleParts) -> None:
        super().__init__(steps, parts)
        self._tables: dict[str, Problem] = {}  # the problems whose tables it filled, by id

    @abstractmethod
    def candidates(self, problems: Sequence[Problem]) -> list[tuple[Problem, Beam, int]]:
        """(problem, beam, child k) of the steps to start, best first."""

    def fill(self, problems: Sequence[Problem], free: int) -> Stops:
        """Free slots go to the candidates in order; child k's step starts on its beam's
        committed path (`SpeculativeSteps.start`), or resumes."""
        for problem, beam, k in self.candidates(problems):
            if free <= 0:
                break
            self._tables[problem.id] = problem
            free -= self.steps.start(problem, beam, k)
        return []

    def pending(self, problems: Sequence[Problem]) -> bool:
        return bool(self.candidates(problems))

    def release(self) -> None:
        """Drop the steps still in the tables it filled (no kept child took them over)."""
        for problem in self._tables.values():
            self.steps.drop_table(problem)
        self._tables = {}


class NoSpeculation(StartRule):
    """Nothing speculates (the barrier without `speculative`)."""

    name = "none"
    disciplines = ("barrier", "decoupled")

    def fill(self, problems: Sequence[Problem], free: int) -> Stops:
        return []

    def speculates(self, search: ProblemSearch) -> bool:
        return False

    def step_logs(self) -> dict[str, dict]:
        return {}
