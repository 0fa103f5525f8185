"""The decoupled schedule: the LLM and the PRM each work from their own queue.

Each problem's search stays iteration-synchronous in its decisions: the policy's
`select` runs once every beam of the problem's frontier has its step and the scores
`indices_to_score` asks for, so the final candidates are the barrier schedule's. What
changes is that neither model waits for the other. The engine's steps alternate

- one LLM round: generator steps, with freed batch slots refilled between steps, until
  the PRM has something worth a call (a problem waits only for scores, the PRM queue
  reaches `verifier_batch_size`, only speculation is left running, or the policy's
  step token limit of steps passed);
- one PRM call: at most `verifier_batch_size` beams (0 = all queued), and for each only
  its shallowest unscored step (`last_scored + 1`). Speculative steps are never queued:
  they live outside the beams until a selection adopts them.

The LLM fills its batch (the generator's `batch_cap`) in this order:
1. real work: the next step of every beam of a frontier (after a selection, or the
   first steps of a problem in flight); it preempts running speculation;
2. and 3., in the order the fill policy chooses (`decoupled_policy.py`):
   eager work (start the next problem from the request queue, up to
   `options.concurrency` problems in flight) and speculative work (for a beam that is
   generated but not yet through selection, the step one of its children would
   generate: a request on the same path with that child's seed and the next iteration's
   limits; by default only for the beams selection would keep on the scores known so
   far, `optim.decoupled_spec_scope`).

Speculative steps, their adoption by the children that selection keeps, their dropping
(counted as wasted) and preemption are its start rule's (`speculation/scoped.py`); early rejection's call
(`rejection.py`) ends an LLM round, after the PRM's queue; the run's counters and the step-log
summary in `tts/metrics/work.py`. The memory policy (M,
`ScheduleParts.replan`) sees the committed beams of every problem in flight after each
admission and selection.

Not used here: `options.speculative` and `options.lookahead` (FlashTTS's run-on
speculation and lookahead scoring): the PRM never sees a speculative step.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence

from tts import clock
from tts.backends.base import GenDelta, StepStats
from tts.engine.decoupled_policy import EAGER_FIRST, Filler, FillPolicy, FillState, make_fill_policy
from tts.engine.requests import Request, RequestKind
from tts.engine.decoupled_turns import LLMRound, PRMCall
from tts.engine.inflight import Inflight, ScheduleParts
from tts.engine.messages import Generate, Purpose, Score
from tts.engine.postprocess import postprocess
from tts.engine.problem import Problem, next_unscored
from tts.engine.schedule import Schedule
from tts.engine.speculation.driver import Speculation
from tts.engine.speculation.guard import SpeculationGuard
from tts.engine.speculation.registry import make_rule
from tts.engine.scoring import ScoreItem, ScoringStats
from tts.metrics.events import ModelTime
from tts.metrics.work import DecoupledLog
from tts.search.tree import Beam


class _Turn(enum.Enum):
    LLM = "llm"
    PRM = "prm"


class DecoupledSchedule(Schedule):
    """Runs problems with separate LLM and PRM work queues (see the module docstring), by
    its options (`EngineOptions.decoupled`): the fill policy, the PRM's batch, the scope
    and guard of speculation, the LLM round's bound (default: the policy's step token
    limit); running speculation is preempted at `EngineOptions.kv_spec_limit` KV usage.
    """

    def __init__(self, parts: ScheduleParts) -> None:
        self.parts = parts
        self.inflight = Inflight(parts, self.selected)
        own, policy = parts.opts.decoupled, parts.policy
        self.fill_policy: FillPolicy = make_fill_policy(own.fill_policy)
        self.prm_cap = max(0, own.verifier_batch_size)
        self.round_steps = max(1, policy.step_max_tokens)  # an LLM round's bound
        self.stats = DecoupledLog()  # (its generation and PRM calls: `collector.work`)
        # speculation's start rule (`optim.spec_rule`; its own: `scoped`)
        self.speculation = Speculation(make_rule(parts, self.inflight.requests_ahead, "decoupled"))
        if own.spec_guard:
            self.speculation.guard = SpeculationGuard(parts.collector.speculation)
        # the last scan found no speculation left to start: not repeated until something
        # changed (a step committed, scores came, a selection ran, a request was preempted)
        self._spec_exhausted = False
        self._real: deque[Request] = deque()  # real requests waiting for a batch slot
        self._util = 0.0  # moving average of the generator's batch utilisation
        self._turn = _Turn.LLM
        self._round: LLMRound | None = None
        self._progressed = True  # the last round (or PRM call) changed something
        self._call: PRMCall | None = None  # the PRM call in progress

    def release(self) -> None:
        self.parts.runner.stop_all()  # nothing should be left; never leave requests behind

    def backlog(self) -> bool:
        """Work that could fill a free batch slot: real requests, a problem to admit, or
        a speculative step to start."""
        return bool(self._real) or self.inflight.admissible() or self._spec_pending()

    # ------------------------------------------------------------------ the turns

    def next(self) -> Generate | Score | None:
        inflight, running = self.inflight, self.parts.runner.requests
        while True:
            if self._turn is _Turn.LLM:
                if self._round is None:
                    self._round = LLMRound(clock.now())
                self._round.progressed = self._fill() or self._round.progressed
                if running:
                    self._round.touched.update((r.problem.id, r.problem) for r in running.values())
                    return Generate(self.parts.runner.take_plan())
                self._close_round()
            self._turn = _Turn.LLM
            rejecting = self._rejection_due()
            if inflight.prm_queue:
                if rejecting:
                    self._turn = _Turn.PRM  # the partial call follows the queue's
                return Score(*self._prm_batch())
            if rejecting and (call := inflight.rejection.call(inflight.live, self._decoding)) is not None:
                return call
            if not inflight.busy():
                return None
            if not self._progressed:
                raise RuntimeError("decoupled engine: no progress with problems in flight "
                                   f"({len(inflight.live)} live, {len(self._real)} queued requests)")

    def _close_round(self) -> None:
        """The LLM round ends: its wall time goes to every problem it ran requests of."""
        r, self._round = self._round, None
        self._turn = _Turn.PRM
        if r is None:
            return
        self._progressed = r.progressed or r.steps > 0
        if r.steps:
            self.stats.llm_rounds += 1
            wall = clock.now() - r.start
            self.parts.collector.emit(ModelTime("generator", tuple(p.id for p in r.touched.values() if not p.search.done),
                                                wall))

    def _round_over(self, steps: int) -> bool:
        """Whether the PRM should run now."""
        if self._rejection_due():
            return True  # early rejection's partial call, after the queue's
        inflight = self.inflight
        if not inflight.prm_queue:
            return False  # nothing to score: keep the LLM busy
        if self.prm_cap and len(inflight.prm_queue) >= self.prm_cap:
            return True
        if any(not p.waiting and p.to_score for p in inflight.live):
            return True  # a selection waits only for the PRM
        if all(r.kind is RequestKind.SPEC for r in self.parts.runner.requests.values()):
            return True  # only speculation runs: real work depends on the PRM
        return steps >= self.round_steps

    # ------------------------------------------------------------ batch filling

    def _speculating(self) -> bool:
        return bool(self.speculation.running())

    def _spec_pending(self) -> bool:
        """Speculation waits to start (the fill policy's choice)."""
        return not self._spec_exhausted and self.speculation.proposes(self.inflight.live)

    def _spec_changed(self) -> None:
        self._spec_exhausted = False

    def _speculate(self) -> bool:
        """Free batch slots go to speculation, where it may start; True when some did. A
        scan that finds none left to start is not repeated until something changed."""
        runner, spec = self.parts.runner, self.speculation
        free = runner.free_slots()
        if free <= 0 or not spec.allows():
            return False
        if not self._spec_exhausted and spec.start(self.inflight.live, free):
            self._spec_exhausted = True
        return runner.free_slots() < free

    def _fill(self) -> bool:
        """Fill free batch slots: real work, then eager and speculative in policy order."""
        progressed = False
        while True:
            progressed = self._submit_real() or progressed
            if not self.inflight.admissible():
                return self._speculate() or progressed
            if not (self.parts.runner.free_slots() > 0 or self._speculating()):
                return progressed
            has_spec = self._spec_pending()
            order = self.fill_policy.order(self._fill_state()) if has_spec else EAGER_FIRST
            if order[0] is Filler.SPECULATIVE:
                progressed = self._speculate() or progressed
                if self.parts.runner.free_slots() <= 0:
                    return progressed
            self._admit()  # eager first: its requests preempt running speculation
            progressed = True

    def _fill_state(self) -> FillState:
        runner = self.parts.runner
        return FillState(runner.gen.batch_cap, len(runner.requests), self._util,
                         self.speculation.memory.kv_usage, len(self.inflight.live), self.parts.opts.concurrency)

    def _submit_real(self) -> bool:
        progressed = False
        while self._real:
            if self.parts.runner.free_slots() <= 0:
                if not self.speculation.preempt(1):
                    break
                self._spec_changed()
            self._submit(self._real.popleft())
            progressed = True
        return progressed

    def _admit(self) -> None:
        inflight = self.inflight
        problem = inflight.admit(cold=not inflight.live and not self.parts.runner.requests)  # nothing in flight
        self._real.extend(inflight.order(inflight.requests_for(problem.search, kind=RequestKind.EAGER, problem=problem)))
        self.stats.problems_started += 1
        self.stats.max_live = max(self.stats.max_live, len(inflight.live))
        self._replan()

    def _submit(self, request: Request) -> None:
        """Send a real request (at least one token: its step may be all adopted but its end)."""
        self.parts.runner.submit(request, max(1, request.limit - len(request.tokens)), request.tokens)

    def _replan(self) -> None:
        """The memory policy (M) sees the committed beams of every problem in flight."""
        self.inflight.replan(self.inflight.committed_beams())

    # ---------------------------------------------------------------- generation

    def generated(self, outputs: list[tuple[Request, GenDelta, bool]], st: StepStats) -> None:
        self.fill_policy.observe(st)
        self._util = 0.8 * self._util + 0.2 * min(1.0, st.num_running / max(1, st.batch_cap))
        if self.inflight.rejection is not None:
            self.inflight.rejection.stepped()
        if self.speculation.guard is not None:
            self.speculation.guard.observe(st, max(0, st.num_running - len(self.speculation.running())))
        spec = self.speculation
        self.parts.runner.stop_each(postprocess(outputs, self.parts.cut, spec, self._step_ended))
        if spec.relieve(st):
            self._spec_changed()
        self.inflight.select_ready()
        if self._round is not None:
            self._round.steps += 1
            if self._round_over(self._round.steps):
                self._close_round()

    def _step_ended(self, request: Request, d: GenDelta, overflow: Sequence[int]) -> bool:
        """A real request's step ended: it is committed; it stops."""
        self._complete(request)
        return True

    def _complete(self, request: Request) -> None:
        """A real request has its step: commit it to the beam and queue its score."""
        problem, beam = request.problem, request.beam
        self.inflight.complete(request)
        self._spec_changed()

    # ------------------------------------------------------------------ scoring

    def _prm_batch(self) -> tuple[list[ScoreItem], tuple[str, ...]]:
        """At most `verifier_batch_size` queued beams, each for its shallowest unscored step."""
        batch, policy = self.inflight.take_queued(self.prm_cap), self.parts.policy
        items = [ScoreItem(beam, p.input.problem, (next_unscored(policy, p.search, beam),)) for p, beam in batch]
        self._call = PRMCall(batch)
        return items, tuple(dict.fromkeys(p.id for p, _ in batch))

    def scored(self, work: Score, stats: ScoringStats) -> None:
        if work.purpose is Purpose.REJECT:
            if self.inflight.reject_steps(stats.partial, self._decoding, self.parts.runner.stop):
                self._spec_changed()
                self.inflight.select_ready()
            self._progressed = True
            return
        call = self._call
        assert call is not None
        self.inflight.scores_made(call.batch)
        self._spec_changed()  # new scores change which beams look like survivors
        self._progressed = True
        self.inflight.select_ready()

    # ---------------------------------------------------------- early rejection

    def _decoding(self, problem: Problem | None = None) -> list[Request]:
        """The real requests still decoding their step (of `problem`, or all)."""
        return [r for r in self.parts.runner.requests.values()
                if r.kind is not RequestKind.SPEC and not r.finished and (problem is None or r.problem is problem)]

    def _rejection_due(self) -> bool:
        rejection = self.inflight.rejection
        return rejection is not None and rejection.due(self._decoding())

    # ---------------------------------------------------------------- selection

    def selected(self, problem: Problem, parents: dict[int, Beam]) -> None:
        """The children that selection kept take their speculative steps over (the rest
        queue as real requests); the problem's other speculative steps are dropped."""
        search = problem.search
        self._spec_changed()
        if search.done:
            if self._round is not None and problem.id in self._round.touched:  # its share of the round so far
                del self._round.touched[problem.id]
                self.parts.collector.emit(ModelTime("generator", (problem.id,), clock.now() - self._round.start))
        else:
            requests = self.inflight.order(self.inflight.requests_for(search, problem=problem))
            self._real.extend(self.speculation.steps.take_over_all(requests, self._complete)[1])
        self.speculation.steps.drop_table(problem)  # (the search ended: nobody takes them over)
        self.speculation.selected(problem, parents)
        self._replan()

    # ------------------------------------------------------------------ reports

    def step_logs(self) -> dict[str, dict]:
        fill = (self.fill_policy.name, self.fill_policy.decisions)
        collector = self.parts.collector
        out = self.stats.summary(collector.work, collector.logs["generator"],
                                 [k.value for k in RequestKind], fill, self.prm_cap, Purpose.SELECT.value)
        return {"decoupled": out, **self.speculation.step_logs()}
