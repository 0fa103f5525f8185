"""What both engines share: a problem's start, the jobs of its frontier, its finish.

`EngineBase` holds the parts of a run the synchronous engine (`sync.py`) and the decoupled
engine (`decoupled.py`) have in common: the generator and its step rule, the search policy,
the verifier's scoring phase and score cache, the request ordering (P), and the step logs.
Each engine adds its own loop: the synchronous one generates a whole frontier, then scores
it, then selects; the decoupled one runs the LLM and the PRM from separate work queues.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from tts.backends.base import Generator, Verifier
from tts.config.schema import LookaheadScope
from tts.engine.ordering import Ordering, make_ordering
from tts.engine.scoring import ScoreCache, ScoringPhase
from tts.engine.steps import GenJob, StepCutter
from tts.metrics.collector import ProblemMetrics, StepLog
from tts.search.base import ProblemSearch, SearchPolicy
from tts.search.tree import Beam


@dataclass(frozen=True)
class ProblemInput:
    id: str
    problem: str


@dataclass
class ProblemOutcome:
    """A finished problem: its final candidates and what it cost."""

    problem: ProblemInput
    candidates: list[Beam]
    metrics: ProblemMetrics
    policy: SearchPolicy


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
    spec_branches: bool = False  # speculate child k's step with child k's seed (exact)
    temperature: float = 0.8
    top_p: float = 1.0
    # a problem that starts with none in flight starts on empty prefix caches: its result
    # then does not depend on what ran before it (bf16 logits change with what the cache
    # served), so a resumed run or a problem re-run alone repeats it
    fresh_cache_per_problem: bool = False


@dataclass
class _Live:
    input: ProblemInput
    search: ProblemSearch
    metrics: ProblemMetrics
    rng: random.Random  # the problem's own draws (truncation): the same whatever runs beside it


class EngineBase:
    """The state and the per-problem steps both engines share (module docstring)."""

    def __init__(self, generator: Generator, verifier: Verifier | None,
                 make_policy: Callable[[], SearchPolicy], system_prompt: str,
                 options: EngineOptions = EngineOptions()) -> None:
        self.gen = generator
        self.opts = options
        self.policy = make_policy()
        self.system_prompt = system_prompt
        self.cut = StepCutter(generator)  # the step rule
        self.cache = ScoreCache() if options.score_cache else None
        self.scoring = ScoringPhase(verifier, self.cache)
        self.ordering: Ordering = make_ordering(options.ordering, options.seed)
        self.gen_log, self.ver_log = StepLog(), StepLog()
        # progress display: (problem id, iterations done) after each of a problem's iterations
        self.on_problem_iteration: Callable[[str, int], None] | None = None

    def _count_iteration(self, metrics: ProblemMetrics) -> None:
        metrics.iterations += 1
        if self.on_problem_iteration:
            self.on_problem_iteration(metrics.problem_id, metrics.iterations)

    def _fresh_caches(self) -> None:
        """Empty both models' prefix caches before a problem that starts alone (option
        `fresh_cache_per_problem`); the caller has released every request first."""
        if self.opts.fresh_cache_per_problem:
            self.gen.reset_prefix_cache()
            if self.scoring.verifier is not None:
                self.scoring.verifier.reset_prefix_cache()

    def _start(self, p: ProblemInput) -> _Live:
        prompt = tuple(self.gen.encode_prompt(p.problem, self.system_prompt))
        seed = (self.opts.seed * 1_000_003 + hash_id(p.id)) % (2**31 - 1)
        search = ProblemSearch(p.id, p.problem, prompt, seed)
        self.policy.start(search)
        return _Live(p, search, ProblemMetrics(p.id), random.Random(seed))

    def _jobs(self, item: _Live) -> list[GenJob]:
        """One job per frontier beam: its next step, within the step's (or, on the last
        iteration, the whole path's) token limit."""
        search, policy = item.search, self.policy
        last = policy.is_last_iteration(search) and self.opts.eos_at_depth_limit
        prios = self._spec_priorities(search)
        jobs = []
        for beam, prio in zip(search.frontier, prios):
            limit = policy.max_total_tokens - beam.num_tokens if last else policy.step_limit(beam, search)
            jobs.append(GenJob(beam, limit, to_eos=last or not policy.stops_at_boundary,
                               split=not policy.stops_at_boundary, spec_priority=prio))
        return jobs

    def _spec_priorities(self, search: ProblemSearch) -> list[int]:
        """How many speculative branches each frontier beam may spawn (none here; the
        synchronous engine's speculative extension overrides it)."""
        return [0] * len(search.frontier)

    def _finish(self, item: _Live) -> ProblemOutcome:
        m = item.metrics
        m.latency_s = m.elapsed()
        candidates = self.policy.finalize(item.search)
        m.beam_tokens = [b.num_tokens for b in candidates]
        m.beam_completion_s = [b.completed_at or m.latency_s for b in candidates]
        if self.cache is not None:
            m.score_cache_hits = self.cache.hits_by_problem.pop(item.input.id, 0)
            m.lookahead_used = self.cache.lookahead_hits_by_problem.pop(item.input.id, 0)
            self.cache.drop_problem(item.input.id)
        return ProblemOutcome(item.input, candidates, m, self.policy)

    def step_logs(self) -> dict[str, dict]:
        return {"generator": self.gen_log.summary(), "verifier": self.ver_log.summary()}


def hash_id(problem_id: str) -> int:
    """A stable (process-independent) integer for a problem id."""
    h = 0
    for ch in problem_id:
        h = (h * 131 + ord(ch)) % (2**31 - 1)
    return h
