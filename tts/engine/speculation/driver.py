"""What a discipline holds of speculation: its start rule over the one mechanism
(`Speculation`).

The rule proposes (`rule.py`); this starts what it proposes in the slots the discipline
gives it (`start`), skipping the beams whose speculation pruning stopped; preempts
running speculation, newest first, where memory is short or real work needs the slot
(`preempt`, `relieve`: the one memory rule, `memory.py`); takes a speculative request's
generator output (`take`); says whether new speculation may start (`allows`: memory, and
the cost guard where one is set, `guard.py`); and reports the run's speculative work, one
step-log entry whichever discipline runs it. The barrier's side of an iteration (run-on
mode, pruning, the tokens a beam holds after generation) is `iteration.py`'s.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from tts.backends.base import GenDelta, StepStats
from tts.engine.problem import Problem
from tts.engine.requests import Request, RequestKind
from tts.engine.speculation.guard import SpeculationGuard
from tts.engine.speculation.memory import MemoryGuard
from tts.engine.speculation.rule import NoSpeculation, StartRule
from tts.engine.speculation.steps import SpeculativeSteps
from tts.search.tree import Beam


class Speculation:
    """A discipline's speculation (module docstring): `rule` over its mechanism
    (`rule.steps`). `guard`, where set, says whether speculation pays."""

    def __init__(self, rule: StartRule) -> None:
        self.rule = rule
        self.guard: SpeculationGuard | None = None
        self._tables: dict[str, Problem] = {}  # the problems whose tables it filled, by id

    @property
    def steps(self) -> SpeculativeSteps:
        """The mechanism under the rule."""
        return self.rule.steps

    @property
    def memory(self) -> MemoryGuard:
        return self.steps.memory

    @property
    def on(self) -> bool:
        """Some rule proposes speculation (not `none`)."""
        return not isinstance(self.rule, NoSpeculation)

    def allows(self) -> bool:
        """New speculation may start: memory allows, and it pays (the guard, where set)."""
        return self.memory.allows() and (self.guard is None or self.guard.allows())

    def proposals(self, problems: Sequence[Problem]) -> Iterator[tuple[Problem, Beam, int]]:
        """The rule's candidates, less those of beams whose speculation pruning stopped, as
        far as they are read (`StartRule.candidates`)."""
        pruned = self.steps.pruned
        for c in self.rule.candidates(problems):
            if c[1].uid not in pruned:
                yield c

    def proposes(self, problems: Sequence[Problem]) -> bool:
        """Some speculative step waits to start (the first proposal is all it reads)."""
        return next(self.proposals(problems), None) is not None

    def running(self) -> list[Request]:
        """The speculative requests running in the backend, oldest first (`SpeculativeSteps.running`)."""
        return self.steps.running()

    def start(self, problems: Sequence[Problem], free: int) -> bool:
        """Free slots go to the proposals in order: child k's step starts on its beam's
        committed path (`SpeculativeSteps.start`), or resumes. Returns whether every
        proposal was looked at (the slots were not all taken first)."""
        for problem, beam, k in self.proposals(problems):
            if free <= 0:
                return False
            self._tables[problem.id] = problem
            free -= self.steps.start(problem, beam, k)
        return True

    def preempt(self, k: int | None = None) -> list[Request]:
        """Stop up to `k` running speculative requests (all: None), newest first; they wait
        (`SpeculativeSteps.preempt`: counted, reset where sampling is not resumable), and
        the rule hears of it (`StartRule.preempted`)."""
        running = self.running()
        requests = running if k is None else running[::-1][:k]
        if requests:
            self.steps.preempt(requests)
            self.rule.preempted(requests)
        return requests

    def take(self, request: Request, d: GenDelta) -> bool:
        """One generator delta of a speculative request; True: stop it (its step ended
        before its backend request did). A step stopped at its cap holds part of a step; a
        run-on's tokens are all speculative (a final EOS kept: the next step ends there)."""
        if request.kind is RequestKind.SPEC:
            ended = self.steps.cut.finish(request, d)
            if ended is None:
                return False
            self.steps.stopped(request)
            return ended.stop
        request.runon_tokens.extend(d.new_token_ids)
        return False

    def relieve(self, st: StepStats) -> bool:
        """After a generator step: where memory is short, every running speculative request
        is preempted and none starts for a while. True when it was."""
        return self.memory.relieve(st, len(self.running()), self.preempt)

    def selected(self, problem: Problem, parents: dict[int, Beam]) -> None:
        """After the problem's selection: the rule hands its speculation down, or forgets it."""
        self.rule.selected(problem, parents)

    def release(self) -> None:
        """Drop the steps still in the tables it filled (no kept child took them over)."""
        for problem in self._tables.values():
            self.steps.drop_table(problem)
        self._tables = {}

    def step_logs(self) -> dict[str, dict]:
        """The run's speculative work (`SpeculationLog`), with the cost guard's where set:
        the one step-log entry of speculation, whichever discipline runs it."""
        if not self.on:
            return {}
        out = self.rule.parts.collector.speculation.summary()
        if self.guard is not None:
            out.update(self.guard.summary())
        return {"speculation": out}
