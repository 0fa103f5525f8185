"""The synchronous engine: generate a step for every beam, verify, select, repeat.

With every optimisation off this is the baseline loop of search-and-learn (all beams of
an iteration run to their step end, the slowest beam sets the pace, then all new steps
are verified). The FlashTTS switches change how the loop runs, never what the policy
decides: request order (P), speculative extension (S), lookahead verification, and the
memory split (M, through `on_iteration`).
"""

from __future__ import annotations

import random
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from tts.backends.base import Generator, Verifier
from tts.engine.generation import GenerationPhase
from tts.engine.ordering import Ordering, make_ordering
from tts.engine.scoring import ScoreCache, ScoreItem, ScoringPhase
from tts.engine.speculation import hand_down, spec_priorities
from tts.engine.steps import GenJob
from tts.metrics.collector import ProblemMetrics, StepLog, split_exactly
from tts.search.base import ProblemSearch, SearchPolicy
from tts.search.tree import Beam, BeamState, StepEnd


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
    ordering: str = "fifo"
    spec_max_tokens: int = 0
    spec_batch_cap: int = 0  # 0 = the generator's batch cap
    spec_truncate_ratio: float = 0.85
    spec_truncate_std: float = 0.1
    spec_branches: bool = False  # speculate child k's step with child k's seed (exact)
    temperature: float = 0.8
    top_p: float = 1.0


@dataclass
class _Live:
    input: ProblemInput
    search: ProblemSearch
    metrics: ProblemMetrics
    rng: random.Random  # the problem's own draws (truncation): the same whatever runs beside it


class SyncEngine:
    """Runs problems through a search policy, `concurrency` problems at a time."""

    def __init__(self, generator: Generator, verifier: Verifier | None,
                 make_policy: Callable[[], SearchPolicy], system_prompt: str,
                 options: EngineOptions = EngineOptions()) -> None:
        self.gen = generator
        self.opts = options
        self.make_policy = make_policy
        self.policy = make_policy()
        self.system_prompt = system_prompt
        self.cache = ScoreCache() if options.score_cache else None
        self.scoring = ScoringPhase(verifier, self.cache)
        self.ordering: Ordering = make_ordering(options.ordering, options.seed)
        spec_max = options.spec_max_tokens or self.policy.step_max_tokens
        self.phase = GenerationPhase(generator, options.temperature, options.top_p,
                                     options.speculative, spec_max,
                                     spec_batch_cap=options.spec_batch_cap,
                                     spec_branches=options.spec_branches,
                                     step_max_tokens=self.policy.step_max_tokens)
        self.cut = self.phase.cut  # the step rule, shared with the phase
        self.gen_log, self.ver_log = StepLog(), StepLog()
        self.on_iteration: Callable[[list[Beam]], None] | None = None  # memory policy hook

    def run(self, problems: Iterable[ProblemInput]) -> Iterator[ProblemOutcome]:
        """Yield each problem's outcome as soon as it finishes."""
        queue, live = deque(problems), []
        try:
            while queue or live:
                while queue and len(live) < self.opts.concurrency:
                    live.append(self._start(queue.popleft()))
                self._iterate(live)
                finished = [x for x in live if x.search.done]
                for item in finished:
                    live.remove(item)
                if not queue and not live:
                    self.phase.release()  # before the last yield: a caller may stop there
                for item in finished:
                    yield self._finish(item)
        finally:  # an error, or a caller that stopped early: no branch request stays running
            self.phase.release()

    def _start(self, p: ProblemInput) -> _Live:
        prompt = tuple(self.gen.encode_prompt(p.problem, self.system_prompt))
        seed = (self.opts.seed * 1_000_003 + hash_id(p.id)) % (2**31 - 1)
        search = ProblemSearch(p.id, p.problem, prompt, seed)
        self.policy.start(search)
        return _Live(p, search, ProblemMetrics(p.id), random.Random(seed))

    def _iterate(self, live: list[_Live]) -> None:
        jobs = [job for item in live for job in self._jobs(item)]
        if self.on_iteration:
            self.on_iteration([j.beam for j in jobs])
        jobs = self.ordering.order(jobs, lambda j: j.beam)
        self.gen_log.start_phase()
        stats = self.phase.run(jobs, on_step=self.gen_log.observe)
        self._apply_generation(live, jobs, stats)
        items = [self._score_item(item, beam) for item in live for beam in item.search.frontier]
        items = [i for i in items if i.indices or i.lookahead_step]
        scored = self.scoring.run(items, order=lambda xs: self.ordering.order(xs, lambda i: i.beam))
        for batch in scored.batches:
            for s in batch.step_stats:
                self.ver_log.observe(s)
        for item in live:
            self._account_scoring(item, scored)
            self._select(item)

    def _jobs(self, item: _Live) -> list[GenJob]:
        search, policy = item.search, self.policy
        last = policy.is_last_iteration(search) and self.opts.eos_at_depth_limit
        prev = [policy.path_score(b) if b.depth else None for b in search.frontier]
        prios = spec_priorities(prev, max(1, policy.cfg.beam_width)) if self.opts.speculative else [0] * len(prev)
        if self._next_runs_to_eos(search) and self.phase.spec_branches and not self.gen.resumable_sampling:
            prios = [0] * len(prev)  # no child could take a branch: its request runs past the step
        jobs = []
        for beam, prio in zip(search.frontier, prios):
            limit = policy.max_total_tokens - beam.num_tokens if last else policy.step_limit(beam, search)
            jobs.append(GenJob(beam, limit, to_eos=last or not policy.stops_at_boundary,
                               split=not policy.stops_at_boundary, spec_priority=prio))
        return jobs

    def _next_runs_to_eos(self, search: ProblemSearch) -> bool:
        """The next iteration is the last and samples to EOS."""
        return self.opts.eos_at_depth_limit and self.policy.is_last_iteration(search, ahead=1)

    def _apply_generation(self, live: list[_Live], jobs: list[GenJob], stats) -> None:
        for job in jobs:
            total_left = self.policy.max_total_tokens - job.beam.num_tokens
            for step in self.cut.steps(job, total_left):
                job.beam.append(step)
            if self.phase.spec_branches:  # child 0's branch doubles as the lookahead step
                job.beam.spec_branches = self.phase.branch_steps(job)
                job.beam.spec_tokens = job.beam.spec_branches.get(job.beam.seed, ())
            else:
                job.beam.spec_tokens = tuple(job.spec)
        for item in live:
            mine = [j for j in jobs if j.beam.problem_id == item.input.id]
            m = item.metrics
            m.generator_s += stats.wall_s
            m.iterations += 1
            lengths = [len(j.tokens) - j.adopted for j in mine]
            if lengths:
                m.step_tokens_mean.append(sum(lengths) / len(lengths))
                m.step_tokens_max.append(max(lengths))
            used: dict[tuple[int | None, int], int] = {}
            for j in mine:  # run-on: siblings share one parent's speculative tokens: count them once
                key = (j.beam.parent, j.beam.seed if self.phase.spec_branches else 0)
                used[key] = max(used.get(key, 0), j.adopted)
            m.spec_used += sum(used.values())
            counts = stats.by_problem.get(item.input.id, Counter())  # this problem's requests' counters
            m.gen_tokens += counts["tokens"]
            m.spec_generated += counts["spec_tokens"]
            m.gen_prompt_tokens += counts["prompt_tokens"]
            m.gen_cached_tokens += counts["cached_tokens"]
            m.gen_requests += counts["requests"]

    def _score_item(self, item: _Live, beam: Beam) -> ScoreItem:
        indices = self.policy.indices_to_score(beam, item.search)
        look = None
        if self.opts.lookahead and beam.spec_tokens and indices:
            probe = self._spec_step(beam, item.search)
            if probe.end is not None and probe.tokens:  # a whole next step
                look = self.gen.decode(probe.tokens)
        return ScoreItem(beam, item.input.problem, indices, look)

    def _spec_step(self, beam: Beam, search: ProblemSearch) -> GenJob:
        """The next step held in the beam's speculative tokens, cut by the rule its real
        step follows (boundary, EOS, the step's token limit); `end` is None when the
        tokens stop inside it."""
        probe = GenJob(beam.fork(beam.seed), limit=self.policy.step_limit(beam, search))
        self.cut.consume(probe, beam.spec_tokens)
        return probe

    def _spec_step_len(self, beam: Beam, search: ProblemSearch) -> int:
        """How many of the beam's speculative tokens its next step takes (EOS included)."""
        probe = self._spec_step(beam, search)
        if probe.end is None:
            return len(beam.spec_tokens)
        return len(probe.tokens) + (probe.end is StepEnd.EOS)

    def _account_scoring(self, item: _Live, scored) -> None:
        """The call's wall time goes to every problem in it; its counters to the problem
        whose beams asked, and its verifier tokens and requests in proportion to the
        scores each problem made it compute."""
        m = item.metrics
        m.verifier_s += scored.wall_s
        mine = scored.by_problem.get(item.input.id, Counter())
        m.scores_requested += mine["requested"]
        m.scores_computed += mine["computed"]
        m.lookahead_scored += mine["lookahead"]
        weights = {pid: c["computed"] for pid, c in scored.by_problem.items()}
        for batch in scored.batches:
            m.ver_prompt_tokens += split_exactly(batch.prompt_tokens, weights).get(item.input.id, 0)
            m.ver_cached_tokens += split_exactly(batch.cached_tokens, weights).get(item.input.id, 0)
            m.ver_requests += split_exactly(batch.num_requests, weights).get(item.input.id, 0)

    def _select(self, item: _Live) -> None:
        search = item.search
        parents = {b.uid: b for b in search.frontier}
        self.policy.select(search, item.metrics.elapsed())
        search.iteration += 1
        if self.opts.speculative:
            step_lens = {uid: self._spec_step_len(p, search) for uid, p in parents.items()
                         if p.spec_tokens and not p.spec_branches}
            hand_down(search.frontier, parents, self.opts.spec_truncate_ratio,
                      self.opts.spec_truncate_std, item.rng, step_lens)
        for beam in parents.values():
            beam.spec_branches = {}  # handed down; the tokens live on in the children
            if beam.state is not BeamState.ACTIVE:
                beam.spec_tokens = ()
        if not search.frontier:
            search.done = True

    def _finish(self, item: _Live) -> ProblemOutcome:
        m = item.metrics
        m.latency_s = m.elapsed()
        candidates = self.policy.finalize(item.search)
        m.beam_tokens = [b.num_tokens for b in candidates]
        m.beam_completion_s = [b.completed_at or m.latency_s for b in candidates]
        if self.cache is not None:
            m.score_cache_hits = self.cache.hits_by_problem.pop(item.input.id, 0)
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

