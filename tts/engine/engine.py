"""The engine: one step loop over two models, with the scheduling discipline as a policy.

Like nano-vllm's `LLMEngine.step`, `Engine.step` does three things: the schedule picks the
next piece of work, the model runner runs it on its model (one generator step, or one
verifier call), and the schedule takes the results. Everything that differs between
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
the metrics, which are events (`tts.metrics.events`) that one collector attributes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from tts.backends.base import Generator, Verifier
from tts.config.schema import LookaheadScope
from tts.engine.adaptive import AdaptiveOptions
from tts.engine.barrier import BarrierSchedule
from tts.engine.decoupled import DecoupledSchedule
from tts.engine.model_runner import ModelRunner
from tts.engine.ordering import Ordering, make_ordering
from tts.engine.schedule import Problem, ProblemInput, Schedule, Score
from tts.engine.scoring import ScoreCache, ScoreItem, ScoringPhase
from tts.engine.steps import StepCutter
from tts.metrics.collector import ProblemMetrics, StepLog
from tts.metrics.events import MetricsCollector, ProblemFinished
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


@dataclass(frozen=True)
class EngineOptions:
    concurrency: int = 1
    seed: int = 0
    score_cache: bool = True
    eos_at_depth_limit: bool = True
    speculative: bool = False
    lookahead: bool = False
    lookahead_scope: LookaheadScope | str = LookaheadScope.auto
    ordering: str = "fifo"
    spec_max_tokens: int = 0
    spec_batch_cap: int = 0  # 0 = the generator's batch cap
    spec_truncate_ratio: float = 0.85
    spec_truncate_std: float = 0.1
    spec_own_min_tokens: int = 4  # a duplicate samples at least this many of its own step
    spec_branches: bool = False  # speculate child k's step with child k's seed (exact)
    spec_prune: bool = False  # stop the speculation of beams selection cannot keep (barrier.py)
    temperature: float = 0.8
    top_p: float = 1.0
    # a problem that starts with none in flight starts on empty prefix caches: its result
    # then does not depend on what ran before it (bf16 logits change with what the cache
    # served), so a resumed run or a problem re-run alone repeats it
    fresh_cache_per_problem: bool = False
    adaptive: AdaptiveOptions = AdaptiveOptions()  # early exit and early rejection (all off)


class Engine:
    """Runs problems through a search policy under a schedule (the module docstring).

    `schedule` names the discipline (`barrier`, `decoupled`); `schedule_args` go to it.
    `on_iteration(beams)` is the memory policy (M): it sees the beams about to generate,
    and may re-plan the models' batch caps.
    """

    def __init__(self, generator: Generator, verifier: Verifier | None,
                 make_policy: Callable[[], SearchPolicy], system_prompt: str,
                 options: EngineOptions = EngineOptions(), schedule: str = "barrier",
                 **schedule_args) -> None:
        self.opts = options
        self.policy = make_policy()
        self.system_prompt = system_prompt
        self.cut = StepCutter(generator)  # the step rule
        self.cache = ScoreCache() if options.score_cache else None
        self.collector = MetricsCollector()
        self.runner = ModelRunner(generator, ScoringPhase(verifier, self.cache), self.collector,
                                  options.temperature, options.top_p)
        self.ordering: Ordering = make_ordering(options.ordering, options.seed)
        self.on_iteration: Callable[[list[Beam]], None] | None = None
        # more step-log entries, by name, from instrumentation outside the engine (the
        # runner's block-pool counters): each called when the logs are read
        self.log_sources: dict[str, Callable[[], dict]] = {}
        self.schedule: Schedule = make_schedule(schedule, self, **schedule_args)

    @property
    def gen(self) -> Generator:
        return self.runner.gen

    @property
    def verifier(self) -> Verifier | None:
        return self.runner.verifier

    @property
    def gen_log(self) -> StepLog:
        return self.collector.logs["generator"]

    @property
    def ver_log(self) -> StepLog:
        return self.collector.logs["verifier"]

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
                    self.schedule.release()  # before the last yield: a caller may stop there
                for problem in done:
                    yield self._finish(problem)
        finally:  # an error, or a caller that stopped early: no request stays running
            self.schedule.release()

    def step(self) -> bool:
        """Schedule, run one model, hand the results back. False: nothing left to run."""
        work = self.schedule.next()
        if work is None:
            return False
        if isinstance(work, Score):
            self.schedule.scored(self.runner.score(work.items, self._order_items, work.charge))
        else:
            self.schedule.generated(*self.runner.step())
        return True

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


SCHEDULES: dict[str, type[Schedule]] = {"barrier": BarrierSchedule, "decoupled": DecoupledSchedule}


def make_schedule(name: str, engine: Engine, **args) -> Schedule:
    """The schedule named `name` for `engine`."""
    if name not in SCHEDULES:
        raise ValueError(f"engine schedule: unknown {name!r}; valid choices: {', '.join(SCHEDULES)}")
    return SCHEDULES[name](engine, **args)


__all__ = ["Engine", "EngineOptions", "ProblemInput", "ProblemOutcome", "SCHEDULES", "make_schedule"]
