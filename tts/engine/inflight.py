"""The problems in flight, as every discipline shares them (`Inflight`: each discipline
holds one), and their beams (a problem's frontier, `ProblemSearch.frontier`).

`Inflight` admits problems (`admit`), commits a step to its beam and queues the beam's
score (`complete`), hands queued beams to a verifier call and requeues those still missing
a score (`take_queued`, `scores_made`), and selects every problem whose frontier is
generated and scored (`select_ready`; the discipline's `selected` hook then hands its
speculation down). It makes the requests of a problem's frontier (`requests_for`) and
orders them (P). A discipline is the gate over it: when a verifier call runs, on which
queued beams, with which items.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from tts import clock
from tts.engine.adaptive import AnswerSettling
from tts.engine.model_runner import ModelRunner
from tts.engine.options import EngineOptions
from tts.engine.ordering import Ordering
from tts.engine.problem import Problem, ProblemInput, hash_id, next_unscored
from tts.engine.rejection import early_rejection
from tts.engine.requests import Request, RequestKind
from tts.engine.scoring import ScoreCache
from tts.engine.step_cutter import StepCutter
from tts.metrics.collector import MetricsCollector
from tts.metrics.events import IterationDone, SearchSettled, SelectionTimed
from tts.search.base import ProblemSearch, SearchPolicy
from tts.search.tree import Beam, BeamState

Selected = Callable[[Problem, dict[int, Beam]], None]


@dataclass(eq=False)
class ScheduleParts:
    """What a schedule works with, passed in by whoever assembles the engine. `replan(beams)`
    is the memory policy (M): it sees the beams about to generate and may re-plan the
    models' batch caps (None: no memory policy)."""

    policy: SearchPolicy
    runner: ModelRunner
    cut: StepCutter
    opts: EngineOptions
    collector: MetricsCollector
    cache: ScoreCache | None
    ordering: Ordering
    system_prompt: str
    replan: Callable[[list[Beam]], None] | None = None


class Inflight:
    """The problems of a schedule, queued, in flight and finished, and their beams (the
    module docstring). `selected(problem, parents)` is the discipline's hook after a
    selection (its new frontier waits for its steps, or its search ended)."""

    def __init__(self, parts: ScheduleParts, selected: Selected) -> None:
        self.parts = parts
        self.selected = selected
        self.queue: deque[ProblemInput] = deque()  # problems not started yet
        self.live: list[Problem] = []  # problems in flight, oldest first
        self.finished: list[Problem] = []
        self.prm_queue: deque[tuple[Problem, Beam]] = deque()  # committed beams missing a score
        adaptive = parts.opts.adaptive
        self.settling = AnswerSettling(adaptive, parts.policy) if adaptive.early_exit else None
        self.rejection = early_rejection(parts.opts, parts.policy, parts.runner)

    def add(self, problems: Iterable[ProblemInput]) -> None:
        """Queue problems to run."""
        self.queue.extend(problems)

    def busy(self) -> bool:
        """Problems wait or run."""
        return bool(self.queue or self.live)

    def take_finished(self) -> list[Problem]:
        out, self.finished = self.finished, []
        return out

    def replan(self, beams: list[Beam]) -> None:
        """The memory policy (M), where there is one, sees the beams about to generate."""
        if self.parts.replan is not None:
            self.parts.replan(beams)

    def charge(self) -> tuple[str, ...]:
        """The problems in flight, by id (those a model call of all of them is charged to)."""
        return tuple(p.id for p in self.live)

    def admissible(self) -> bool:
        """A queued problem may start: fewer than `concurrency` are in flight."""
        return bool(self.queue) and len(self.live) < self.parts.opts.concurrency

    def admit(self, cold: bool) -> Problem:
        """Start the next queued problem; `cold`: nothing is in flight, so it starts on empty
        prefix caches where the option asks (`fresh_caches`)."""
        if cold:
            self.fresh_caches()
        problem = self.start_problem(self.queue.popleft())
        problem.waiting = {b.uid for b in problem.search.frontier}
        self.live.append(problem)
        return problem

    def complete(self, request: Request) -> None:
        """A real request has its step: it joins the beam's path (several steps where the
        request was cut into steps; the path's last step where its token budget is spent),
        the beam stops waiting, the step's new tokens count for the iteration, and the beam
        joins the verifier's queue where the policy needs a step of it scored."""
        beam, problem, policy = request.beam, request.problem, self.parts.policy
        for step in self.parts.cut.steps(request, policy.max_total_tokens - beam.num_tokens):
            beam.append(step)
        problem.waiting.discard(beam.uid)
        problem.lengths.append(len(request.tokens) - request.adopted)
        if next_unscored(policy, problem.search, beam) is not None:
            problem.to_score += 1
            self.prm_queue.append((problem, beam))

    def take_queued(self, cap: int = 0) -> list[tuple[Problem, Beam]]:
        """The `cap` oldest beams of the verifier's queue (0: all), out of it."""
        n = min(len(self.prm_queue), cap or len(self.prm_queue))
        return [self.prm_queue.popleft() for _ in range(n)]

    def scores_made(self, batch: list[tuple[Problem, Beam]]) -> None:
        """A verifier call on `batch` returned: a beam still missing a score the policy
        needs goes back to the queue's front, in order; the others leave it."""
        requeue = []
        for problem, beam in batch:
            if next_unscored(self.parts.policy, problem.search, beam) is not None:
                requeue.append((problem, beam))
            else:
                problem.to_score -= 1
        self.prm_queue.extendleft(reversed(requeue))

    def select_ready(self) -> None:
        """Select every problem whose frontier is generated and scored, oldest first (a
        selection may make another ready: until none is), then the discipline's `selected`."""
        again = True
        while again:
            again = False
            for problem in list(self.live):
                if not problem.waiting and not problem.to_score and not problem.search.done:
                    start = clock.now()
                    parents = self.select(problem)
                    self.parts.collector.emit(SelectionTimed(problem.id, clock.now() - start))
                    self.selected(problem, parents)
                    again = True

    def reject_steps(self, partial: dict[int, float], decoding: Callable[[Problem], list[Request]],
                     stop: Callable[[list[Request]], None]) -> bool:
        """Early rejection's cut (`rejection.py`) in every problem in flight, on the partial
        scores just made, against the beams whose step is committed and scored (their path
        scores; a step that completes its path does not compete): `decoding(problem)` are
        its requests still decoding, `stop` stops those rejected. True when one was."""
        gone, policy = False, self.parts.policy
        for p in self.live:
            settled = {b.uid: policy.path_score(b) for b in p.search.frontier
                       if b.uid not in p.waiting and not b.is_finished_path
                       and next_unscored(policy, p.search, b) is None}
            gone = bool(self.rejection.cut(p, decoding(p), partial, settled, stop)) or gone
        return gone

    def select(self, problem: Problem) -> dict[int, Beam]:
        """The policy's selection on the problem's frontier, which ends its iteration (its
        steps' generated tokens, `problem.lengths`, are reported, and its early rejections
        counted) and starts the next, unless early exit stops the search here: its new
        frontier waits for its steps; a search left without a frontier is done (the problem
        leaves those in flight). Returns the frontier it selected from, by beam uid."""
        search, emit = problem.search, self.parts.collector.emit
        emit(IterationDone(problem.id, tuple(problem.lengths)))
        parents = {b.uid: b for b in search.frontier}
        self.parts.policy.select(search, problem.metrics.elapsed())
        search.iteration += 1
        if self.rejection is not None:
            kept = [parents[uid] for uid in {b.parent for b in search.frontier} if uid in parents]
            if (rejected := self.rejection.settle(problem.id, problem.lengths, kept)) is not None:
                emit(rejected)
        problem.lengths = []
        self.exit_if_settled(problem)
        problem.waiting = {b.uid for b in search.frontier}
        if not search.frontier:
            search.done = True
            self.live.remove(problem)
            self.finished.append(problem)
        return parents

    def start_problem(self, p: ProblemInput) -> Problem:
        parts = self.parts
        prompt = tuple(parts.runner.gen.encode_prompt(p.problem, parts.system_prompt))
        seed = (parts.opts.seed * 1_000_003 + hash_id(p.id)) % (2**31 - 1)
        search = ProblemSearch(p.id, p.problem, prompt, seed)
        parts.policy.start(search)
        return Problem(p, search, parts.collector.start(p.id), random.Random(seed))

    def fresh_caches(self) -> None:
        """Empty both models' prefix caches before a problem that starts alone (option
        `fresh_cache_per_problem`); the caller has released every request first."""
        if self.parts.opts.fresh_cache_per_problem:
            self.parts.runner.reset_prefix_caches()

    def requests_for(self, search: ProblemSearch, priorities: Sequence[int] | None = None,
                     beams: Sequence[Beam] | None = None, iteration: int | None = None,
                     kind: RequestKind = RequestKind.FRESH, problem: Problem | None = None) -> list[Request]:
        """One request per beam (default: the frontier): its next step, within the step's
        (or, on the last iteration, the whole path's) token limit; `iteration` asks for
        the requests that iteration would make for `beams`."""
        if beams is not None or iteration is not None:
            search = replace(search, frontier=list(search.frontier if beams is None else beams),
                             iteration=search.iteration if iteration is None else iteration)
        policy = self.parts.policy
        last = policy.is_last_iteration(search) and self.parts.opts.eos_at_depth_limit
        prios = priorities or [0] * len(search.frontier)
        out = []
        for beam, prio in zip(search.frontier, prios):
            limit = policy.max_total_tokens - beam.num_tokens if last else policy.step_limit(beam, search)
            out.append(Request(beam, limit, to_eos=last or not policy.stops_at_boundary,
                               cut_into_steps=not policy.stops_at_boundary, spec_priority=prio, kind=kind,
                               problem=problem))
        return out

    def requests_ahead(self, problem: Problem, beams: list[Beam], iteration: int) -> list[Request]:
        """The requests `iteration` would make for `beams` (a speculative step's)."""
        return self.requests_for(problem.search, beams=beams, iteration=iteration, problem=problem)

    def exit_if_settled(self, problem: Problem) -> None:
        """Early exit, after a selection: a search whose answer has settled stops here
        (its frontier is pruned; its completed paths are the candidates)."""
        search = problem.search
        if self.settling is None or not search.frontier:
            return
        if self.settling.settled(search):
            for beam in search.frontier:
                beam.state = BeamState.PRUNED
            search.frontier = []
            self.settling.forget(problem.id)
            self.parts.collector.emit(SearchSettled(problem.id, search.iteration))

    def order(self, requests: list[Request]) -> list[Request]:
        """Request order (P)."""
        return self.parts.ordering.order(requests, lambda r: r.beam)

    def committed_beams(self) -> list[Beam]:
        """The frontier beams of every problem in flight."""
        return [b for p in self.live for b in p.search.frontier]
