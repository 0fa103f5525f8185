"""The synchronous engine: generate a step for every beam, verify, select, repeat.

With every optimisation off this is the baseline loop of search-and-learn (all beams of
an iteration run to their step end, the slowest beam sets the pace, then all new steps
are verified). The FlashTTS switches change how the loop runs, never what the policy
decides: request order (P), speculative extension (S), lookahead verification, and the
memory split (M, through `on_iteration`).

Lookahead comes in two scopes. `all` is the paper's: every beam whose speculative tokens
hold a whole next step has it scored in the same verifier call as its current step, which
is nearly free where a PRM reads every step of a path in one pass. Where the verifier asks
once per score (an LLM judge), each lookahead score is a request of its own and most of
them belong to beams that selection is about to prune (beam search keeps 1 in M); `kept`
then scores the current steps first and looks ahead only for the beams the policy keeps
on those scores (`likely_kept`, exact for beam search but for duplicate filtering), in a
second, smaller call. `auto` picks `kept` for such a verifier and `all` otherwise.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator

from tts.backends.base import Generator, Verifier
from tts.config.schema import LookaheadScope
from tts.engine.base import EngineBase, EngineOptions, ProblemInput, ProblemOutcome, _Live
from tts.engine.generation import GenerationPhase
from tts.engine.scoring import ScoreItem
from tts.engine.speculation import hand_down, spec_priorities
from tts.engine.steps import GenJob
from tts.metrics.collector import split_exactly
from tts.search.base import ProblemSearch, SearchPolicy
from tts.search.tree import Beam, BeamState, StepEnd


def _lookahead_scope(value: LookaheadScope | str) -> LookaheadScope:
    try:
        return LookaheadScope(value)
    except ValueError:
        choices = ", ".join(s.value for s in LookaheadScope)
        raise ValueError(f"lookahead_scope: {value!r}; valid choices: {choices}") from None


class SyncEngine(EngineBase):
    """Runs problems through a search policy, `concurrency` problems at a time."""

    def __init__(self, generator: Generator, verifier: Verifier | None,
                 make_policy: Callable[[], SearchPolicy], system_prompt: str,
                 options: EngineOptions = EngineOptions()) -> None:
        super().__init__(generator, verifier, make_policy, system_prompt, options)
        spec_max = options.spec_max_tokens or self.policy.step_max_tokens
        self.phase = GenerationPhase(generator, options.temperature, options.top_p,
                                     options.speculative, spec_max,
                                     spec_batch_cap=options.spec_batch_cap,
                                     spec_branches=options.spec_branches,
                                     step_max_tokens=self.policy.step_max_tokens, cut=self.cut)
        self.on_iteration: Callable[[list[Beam]], None] | None = None  # memory policy hook
        scope = _lookahead_scope(options.lookahead_scope)
        # score ahead only for kept beams, in a second call after the current steps' scores
        self.lookahead_kept = options.lookahead and (scope is LookaheadScope.kept or (
            scope is LookaheadScope.auto and verifier is not None and verifier.request_per_score))

    def run(self, problems: Iterable[ProblemInput]) -> Iterator[ProblemOutcome]:
        """Yield each problem's outcome as soon as it finishes."""
        queue, live = deque(problems), []
        try:
            while queue or live:
                while queue and len(live) < self.opts.concurrency:
                    if not live and self.opts.fresh_cache_per_problem:  # nothing in flight: start it cold
                        self.phase.release()
                        self._fresh_caches()
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
        scored = self.scoring.run(items, order=self._order_items)
        if self.lookahead_kept:
            ahead = [ScoreItem(beam, item.input.problem, (), look) for item in live
                     for beam in self._kept_beams(item.search)
                     if (look := self._lookahead_step(beam, item.search)) is not None]
            if ahead:
                scored.merge(self.scoring.run(ahead, order=self._order_items))
        for batch in scored.batches:
            for s in batch.step_stats:
                self.ver_log.observe(s)
        for item in live:
            self._account_scoring(item, scored)
            self._select(item)

    def _order_items(self, items: list[ScoreItem]) -> list[ScoreItem]:
        return self.ordering.order(items, lambda i: i.beam)

    def _spec_priorities(self, search: ProblemSearch) -> list[int]:
        """Speculative extension (S): each beam's branch count from its previous score's bin."""
        if not self.opts.speculative:
            return super()._spec_priorities(search)
        if self._next_runs_to_eos(search) and self.phase.spec_branches and not self.gen.resumable_sampling:
            return [0] * len(search.frontier)  # no child could take a branch: its request runs past the step
        prev = [self.policy.path_score(b) if b.depth else None for b in search.frontier]
        return spec_priorities(prev, max(1, self.policy.cfg.beam_width))

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
            self._count_iteration(m)
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
        if self.opts.lookahead and not self.lookahead_kept and indices:
            look = self._lookahead_step(beam, item.search)
        return ScoreItem(beam, item.input.problem, indices, look)

    def _lookahead_step(self, beam: Beam, search: ProblemSearch) -> str | None:
        """The text of the whole next step in the beam's speculative tokens, if they hold one."""
        if not beam.spec_tokens:
            return None
        probe = self._spec_step(beam, search)
        if probe.end is None or not probe.tokens:
            return None
        return self.gen.decode(probe.tokens)

    def _kept_beams(self, search: ProblemSearch) -> list[Beam]:
        """The frontier beams selection keeps on the scores just made (all of them where
        the policy cannot tell)."""
        kept = self.policy.likely_kept(search)
        return list(search.frontier) if kept is None else [beam for beam, _ in kept]

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


__all__ = ["EngineOptions", "ProblemInput", "ProblemOutcome", "SyncEngine"]
