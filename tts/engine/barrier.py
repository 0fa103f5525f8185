"""The barrier schedule: generate a step for every beam, verify, select, repeat.

With every optimisation off this is the baseline loop of search-and-learn (all beams of
an iteration run to their step end, the slowest beam sets the pace, then all new steps
are verified). The FlashTTS switches change how the loop runs, never what the policy
decides: request order (P), speculative extension (S, `barrier_generation.py` with
a start rule of `tts.engine.speculation`: run-on, branches, or one registered by name),
lookahead verification (`lookahead.py`), and the memory split (M, `ScheduleParts.replan`).

It is a gate over the problems in flight (`inflight.py`): a committed step's beam joins the
verifier's queue where the policy needs a step of it scored, and once the iteration's
generation ends the whole queue goes into one call, so every problem in flight is ready
for its selection at once.

Lookahead's scopes are in `lookahead.py`; speculation pruning, a scoring call added in the
middle of generation, in `spec_prune.py`.
"""

from __future__ import annotations

import enum

from tts import clock
from tts.backends.base import GenDelta, StepStats
from tts.engine.barrier_generation import IterationGeneration
from tts.engine.inflight import Inflight, ScheduleParts
from tts.engine.requests import Request
from tts.engine.messages import Generate, Purpose, Score
from tts.engine.problem import Problem
from tts.engine.schedule import Schedule
from tts.engine.lookahead import Lookahead
from tts.engine.scoring import ScoreItem, ScoringStats
from tts.engine.spec_prune import SpeculationPruning
from tts.engine.speculation.iteration import IterationSpeculation
from tts.engine.speculation.policy import spec_priorities
from tts.engine.speculation.registry import make_rule
from tts.metrics.events import ModelTime
from tts.search.base import ProblemSearch
from tts.search.tree import Beam, BeamState


class _Stage(enum.Enum):
    SELECTED = "selected"  # between iterations
    GENERATING = "generating"
    SCORING = "scoring"


class BarrierSchedule(Schedule):
    """Runs `concurrency` problems at a time, an iteration of all of them at a time."""

    def __init__(self, parts: ScheduleParts) -> None:
        self.parts = parts
        self.inflight = Inflight(parts, self.selected)
        opts, policy, runner = parts.opts, parts.policy, parts.runner
        # speculation's start rule, and the barrier's side of it
        self.speculation = IterationSpeculation(make_rule(parts, self.inflight.requests_ahead, "barrier"))
        self.generation = IterationGeneration(runner, parts.cut, self.inflight.complete, self.speculation,
                                              opts.spec_batch_cap)
        self.lookahead = Lookahead(opts, policy, runner, parts.cut)
        self._stage = _Stage.SELECTED
        self._requests: list[Request] = []
        self._generation_started = 0.0
        self._verifier_wall = 0.0  # early rejection's calls within the generation phase
        self._ahead: list[ScoreItem] | None = None  # the second call's items, when due
        self._batch: list[tuple[Problem, Beam]] = []  # the iteration's beams in its verifier call
        # speculation pruning: a scoring call in the middle of generation (`spec_prune.py`)
        self.pruning = (SpeculationPruning(policy, runner, parts.cache, self.generation,
                                           self._requests_of, parts.collector.emit)
                        if opts.spec_prune and opts.speculative and runner.verifier is not None else None)

    def release(self) -> None:
        self.generation.release()

    def step_logs(self) -> dict[str, dict]:
        """With speculation, the run's speculative work, counted as the decoupled schedule's is."""
        return self.speculation.step_logs()

    def next(self) -> Generate | Score | None:
        inflight = self.inflight
        if self._stage is _Stage.SELECTED:
            if not inflight.busy():
                return None
            self._admit()
            self._begin_iteration()
        if self._stage is _Stage.GENERATING:
            if self.generation.active:
                rejection = inflight.rejection
                if rejection is not None and rejection.due(self.generation.running()):
                    call = rejection.call(inflight.live, self._requests_of, inflight.charge())
                    if call is not None:  # early rejection: score the steps as they stand
                        return call
                if self.pruning is not None and self.pruning.due():
                    items = self.pruning.items(inflight.live)
                    if items:  # speculation pruning: score the finished steps now
                        return Score(items, inflight.charge(), Purpose.PRUNE)
                    self.pruning.prune(inflight.live)  # their scores are known already
                return Generate(self.parts.runner.take_plan())
            self._end_generation()
            return Score([self.lookahead.item(p, beam) for p, beam in self._batch], inflight.charge())
        assert self._ahead is not None
        items, self._ahead = self._ahead, None
        return Score(items, inflight.charge(), Purpose.LOOKAHEAD)

    def generated(self, outputs: list[tuple[Request, GenDelta, bool]], stats: StepStats) -> None:
        self.generation.advance(outputs, stats)
        if self.inflight.rejection is not None:
            self.inflight.rejection.stepped()

    def scored(self, work: Score, stats: ScoringStats) -> None:
        inflight = self.inflight
        if work.purpose in (Purpose.REJECT, Purpose.PRUNE):  # a call in the middle of generation
            self._verifier_wall += stats.wall_s  # not the generator's time
            # the scores either call made serve both: rejection reads the finished steps'
            # scores, pruning the partial estimates' cut
            if inflight.rejection is not None:
                self._reject(stats.partial)
            if self.pruning is not None:
                self.pruning.prune(inflight.live)
            return
        if work.purpose is Purpose.SELECT:
            inflight.scores_made(self._batch)
            if self.lookahead.kept and (ahead := self.lookahead.ahead(inflight.live)):
                self._ahead = ahead  # the second call: the next step scores them
                return
        inflight.select_ready()  # the gate: every live beam of every problem is scored
        if any(p.to_score or not p.waiting for p in inflight.live):  # (a selected one waits for its steps)
            raise RuntimeError("barrier schedule: a problem in flight missed its selection")
        self._stage = _Stage.SELECTED

    # ------------------------------------------------------------ early rejection

    def _reject(self, partial: dict[int, float]) -> None:
        """Stop the steps that cannot make the cut on the scores just made, against the
        iteration's steps committed and scored whole (by this call or an earlier one: where
        a step's score is in the score cache, its beam takes it from there)."""
        cache = self.parts.cache
        if cache is not None:
            for r in self._requests:
                if r.finished:
                    cache.fill_last(r.beam)
        self.inflight.reject_steps(partial, lambda p: [r for r in self._requests_of(p) if not (r.finished or r.rejected)],
                          self.generation.reject)

    # ------------------------------------------------------------ the iteration

    def _admit(self) -> None:
        inflight = self.inflight
        while inflight.admissible():
            cold = not inflight.live  # nothing in flight: start it cold
            if cold and self.parts.opts.fresh_cache_per_problem:
                self.generation.release()
            inflight.admit(cold)

    def _begin_iteration(self) -> None:
        inflight = self.inflight
        requests = [r for p in inflight.live
                    for r in inflight.requests_for(p.search, self._spec_priorities(p.search), problem=p)]
        inflight.replan([r.beam for r in requests])
        self._requests = inflight.order(requests)
        if inflight.rejection is not None:
            inflight.rejection.begin()
        if self.pruning is not None:
            self.pruning.begin(inflight.live)
        self.parts.collector.logs["generator"].start_phase()
        self._generation_started, self._verifier_wall = clock.now(), 0.0
        self.generation.begin(self._requests, inflight.live)
        self._stage = _Stage.GENERATING

    def _end_generation(self) -> None:
        self.generation.end()
        wall = clock.now() - self._generation_started - self._verifier_wall
        self.parts.collector.emit(ModelTime("generator", self.inflight.charge(), wall))
        self._apply_generation()
        # the iteration's one verifier call: every committed beam, in frontier order
        at = {b.uid: i for i, b in enumerate(self.inflight.committed_beams())}
        self._batch = sorted(self.inflight.take_queued(), key=lambda pb: at[pb[1].uid])
        self._stage = _Stage.SCORING

    def _requests_of(self, p: Problem) -> list[Request]:
        """The iteration's requests of one problem, in the iteration's order."""
        return [r for r in self._requests if r.problem_id == p.id]

    def _spec_priorities(self, search: ProblemSearch) -> list[int] | None:
        """Speculative extension (S): each beam's branch count from its previous score's bin."""
        if not self.speculation.on:
            return None
        policy = self.parts.policy
        prev = [policy.path_score(b) if b.depth else None for b in search.frontier]
        return spec_priorities(prev, max(1, policy.cfg.beam_width))

    def _apply_generation(self) -> None:
        """Each beam's speculative tokens by the rule (what its request ran on, or child 0's
        branch, which doubles as the lookahead step), and the speculative tokens used."""
        for request in self._requests:
            if not request.rejected:  # (a rejected beam has no step: it leaves the inflight)
                request.beam.spec_tokens = self.speculation.spec_tokens(request)
        for p in self.inflight.live:
            self.speculation.count_used(p, self._requests_of(p))

    # ------------------------------------------------------------ selection

    def selected(self, p: Problem, parents: dict[int, Beam]) -> None:
        """The rule hands its speculation down to the children selection kept (run-on's
        tokens; a branch is taken over as its child starts); the parents no longer in the
        inflight let theirs go."""
        self.speculation.selected(p, parents)
        for beam in parents.values():
            if beam.state is not BeamState.ACTIVE:
                beam.spec_tokens = ()  # handed down; the tokens live on in the children
