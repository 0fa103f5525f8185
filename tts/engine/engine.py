"""The engine: one step loop over two models, with the scheduling discipline as a policy.

Like nano-vllm's `LLMEngine.step`, `Engine.step` does three things: the schedule plans the
next piece of work (one generator step, with the requests it sends and stops as a value,
`StepPlan`; or one verifier call), the model runner runs it on its model, and the
schedule takes the results (`generated`: one postprocess path for both schedules,
`postprocess.py`). Everything that differs between
the baseline, the FlashTTS switches and the thesis's decoupled exploration is the
schedule (`make_schedule`):

- `barrier` (`barrier.py`): search-and-learn's loop, an iteration at a time: every beam's
  step, then their scores, then selection; the FlashTTS switches change how it runs
  (request order P, speculative extension S, lookahead, memory split M), never what the
  search decides;
- `decoupled` (`decoupled.py`): the LLM and the PRM each work from their own queue, and
  free generator slots go to new problems or speculative steps as the fill policy says.

Both share the pieces below: a problem's start and finish, the requests of a frontier,
the step rule (`StepCutter`), the score cache, the request order, the memory policy, and
the metrics, which are events (`tts.metrics.events`) that one collector
(`tts.metrics.collector`) attributes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from tts.backends.base import Generator, Verifier
from tts.engine.disciplines import make_schedule
from tts.engine.model_runner import ModelRunner
from tts.engine.options import EngineOptions
from tts.engine.ordering import make_ordering
from tts.engine.messages import Score
from tts.engine.problem import Problem, ProblemInput
from tts.engine.inflight import ScheduleParts
from tts.engine.schedule import Schedule
from tts.engine.scoring import ScoreCache, ScoreItem, ScoringPhase
from tts.engine.step_cutter import StepCutter
from tts.metrics.collector import MetricsCollector
from tts.metrics.events import ProblemFinished
from tts.metrics.measures import ProblemMetrics
from tts.search.base import SearchPolicy
from tts.search.tree import Beam


@dataclass
class ProblemOutcome:
    """A finished problem: its final candidates and what it cost."""

    problem: ProblemInput
    candidates: list[Beam]
    metrics: ProblemMetrics
    policy: SearchPolicy
    selections: list = field(default_factory=list)  # ProblemSearch.selections


class Engine:
    """Runs problems through a search policy under a schedule (the module docstring).

    `schedule` names the discipline (`tts.engine.disciplines`); `replan(beams)` is the
    memory policy (M): it sees the beams about to generate, and may re-plan the models'
    batch caps.
    """

    def __init__(self, generator: Generator, verifier: Verifier | None,
                 make_policy: Callable[[], SearchPolicy], system_prompt: str,
                 options: EngineOptions = EngineOptions(), schedule: str = "barrier",
                 replan: Callable[[list[Beam]], None] | None = None) -> None:
        self.opts = options
        self.policy = make_policy()
        self.cut = StepCutter(generator)  # the step rule
        self.cache = ScoreCache() if options.score_cache else None
        self.collector = MetricsCollector()
        self.runner = ModelRunner(generator, ScoringPhase(verifier, self.cache), self.collector,
                                  options.temperature, options.top_p)
        self.ordering = make_ordering(options.ordering, options.seed)
        # more step-log entries, by name, from instrumentation outside the engine (the
        # runner's block-pool counters): each called when the logs are read
        self.log_sources: dict[str, Callable[[], dict]] = {}
        self.schedule: Schedule = make_schedule(schedule, ScheduleParts(
            self.policy, self.runner, self.cut, options, self.collector, self.cache, self.ordering,
            system_prompt, replan))

    @property
    def gen(self) -> Generator:
        return self.runner.gen

    @property
    def verifier(self) -> Verifier | None:
        return self.runner.verifier

    @property
    def on_problem_iteration(self) -> Callable[[str, int], None] | None:
        """Progress display: called with (problem id, iterations done)."""
        return self.collector.on_iteration

    @on_problem_iteration.setter
    def on_problem_iteration(self, fn: Callable[[str, int], None] | None) -> None:
        self.collector.on_iteration = fn

    def run(self, problems: Iterable[ProblemInput]) -> Iterator[ProblemOutcome]:
        """Yield each problem's outcome as soon as it finishes."""
        self.schedule.add(problems)
        try:
            while self.step():
                done = self.schedule.take_finished()
                if done and not self.schedule.busy():
                    self._release()  # before the last yield: a caller may stop there
                for problem in done:
                    yield self._finish(problem)
        finally:  # an error, or a caller that stopped early: no request stays running
            self._release()

    def step(self) -> bool:
        """Schedule, run one model, hand the results back. False: nothing left to run."""
        work = self.schedule.next()
        if work is None:
            return False
        if isinstance(work, Score):
            scored = self.runner.score(work.items, self._order_items, work.charge, work.purpose.value)
            self.schedule.scored(work, scored)
        else:
            self.schedule.generated(*self.runner.step(work.plan))
        return True

    def _release(self) -> None:
        """Stop whatever still runs in the backend, now."""
        self.schedule.release()
        self.runner.flush()

    def _order_items(self, items: list[ScoreItem]) -> list[ScoreItem]:
        return self.ordering.order(items, lambda i: i.beam)

    def _finish(self, problem: Problem) -> ProblemOutcome:
        latency = problem.metrics.elapsed()
        candidates = self.policy.finalize(problem.search)
        hits = looked = 0
        if self.cache is not None:
            hits = self.cache.hits_by_problem.pop(problem.id, 0)
            looked = self.cache.lookahead_hits_by_problem.pop(problem.id, 0)
            self.cache.drop_problem(problem.id)
        metrics = self.collector.finish(ProblemFinished(
            problem.id, latency, tuple(b.num_tokens for b in candidates),
            tuple(b.completed_at or latency for b in candidates), hits, looked))
        return ProblemOutcome(problem.input, candidates, metrics, self.policy, problem.search.selections)

    def step_logs(self) -> dict[str, dict]:
        out = {name: log.summary() for name, log in self.collector.logs.items()}
        out.update(self.schedule.step_logs())
        out.update((name, source()) for name, source in self.log_sources.items())
        return out


__all__ = ["Engine", "EngineOptions", "ProblemInput", "ProblemOutcome"]
