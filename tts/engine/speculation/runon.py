"""Run-on (`optim.spec_rule=runon`, the default), the paper's speculative extension
(Algorithm 1), as a start rule of the barrier over the shared mechanism (`steps.py`).

A request whose step finished early runs on past its boundary in its own backend request,
in a batch slot real work leaves free; the extra tokens are its beam's speculative tokens
(`Beam.spec_tokens`), up to `spec_max_tokens`. Slots go to the highest priority bins first
(`policy.spec_priorities`); a step that finished while none was free waits for one and
then restarts from its path (served from the prefix cache, `SpeculativeSteps.run_on`).
After selection the tokens are handed down (`selected`): in full to the original child,
truncated to the duplicates (`policy.inherit_speculation`), and each kept child's request
starts from them (`SpeculativeSteps.take_over_all`). Memory pressure preempts every
running run-on by the one rule (`memory.py`), counted as every rule's preemptions are
(`SpeculativeSteps.preempt`); it waits for a slot again and resumes from its tokens, or,
where sampling is not resumable, restarts from its committed path.

The child 0 tree is the one without speculation (R = 0, preset `PMS_exact`) only where
sampling is resumable (vLLM with the position-keyed sampler, the default): with vLLM's own
sampler a request that runs past a boundary samples differently from a fresh request with
the same seed.
"""

from __future__ import annotations

from collections.abc import Sequence

from tts.backends.base import GenDelta
from tts.engine.frontier import ScheduleParts
from tts.engine.problem import Problem
from tts.engine.requests import Request, RequestState
from tts.engine.speculation.policy import inherit_speculation, spec_step_len
from tts.engine.speculation.rule import StartRule, Stops
from tts.engine.speculation.steps import SpeculativeSteps
from tts.metrics.events import SpeculationAdopted
from tts.search.tree import Beam

_WAITING, _FINISHED = RequestState.WAITING, RequestState.FINISHED


class RunOn(StartRule):
    """The iteration's run-on requests (module docstring)."""

    name = "runon"

    def __init__(self, steps: SpeculativeSteps, parts: ScheduleParts) -> None:
        super().__init__(steps, parts)
        self._running: dict[Request, int] = {}  # running run-on request -> priority
        self._waiting: dict[int, Request] = {}  # finished steps waiting for a slot, by beam uid
        self._finished_now: list[Request] = []  # steps that finished in this generator step, still running

    def begin(self, finished: Sequence[Request]) -> None:
        """A new iteration (run-on starts only from steps finished while generating)."""
        self._running, self._waiting, self._finished_now = {}, {}, []

    def extra_tokens(self, request: Request) -> int:
        """A request that may speculate asks for `spec_max_tokens` more than its step."""
        return self.steps.spec_max_tokens if request.spec_priority > 0 and not request.to_eos else 0

    def owns(self, request: Request) -> bool:
        return request in self._running

    def running(self) -> list[Request]:
        return list(self._running)

    def take(self, request: Request, d: GenDelta) -> bool:
        """A running run-on's delta: its tokens are speculative (a final EOS is kept: the
        next step ends there). Never stops it here."""
        request.spec.extend(d.new_token_ids)
        if d.finished:
            self._running.pop(request, None)
            request.state = _FINISHED
        return False

    def step_done(self, request: Request, speculate: bool, d: GenDelta, overflow: Sequence[int]) -> bool:
        """A real request's step just finished (`overflow`: its tokens past the step, already
        speculative). Returns whether it keeps running: it may run on."""
        request.spec.extend(overflow)
        if speculate and not d.finished:
            self._finished_now.append(request)
            return True
        return False

    def fill(self, problems: Sequence[Problem], free: int) -> Stops:
        """Speculative slots go to the highest priority bins first. A request that just
        finished its step runs on in place; one awaiting a slot restarts from its path.
        Returns the requests to stop (those that just finished and got no slot wait)."""
        cands = [(r.spec_priority, 1, r) for r in self._finished_now]
        cands += [(r.spec_priority, 0, r) for r in self._waiting.values()]
        cands.sort(key=lambda c: (-c[0], -c[1]))
        self._finished_now, stops = [], []
        for prio, running, request in cands:
            if free > 0:
                if running:
                    self._running[request] = prio
                    request.state = RequestState.SPECULATIVE
                    free -= 1
                else:
                    del self._waiting[request.beam.uid]
                    if self.steps.run_on(request):  # a request whose speculation is spent takes no slot
                        self._running[request] = prio
                        free -= 1
            elif running:
                stops.append((request, _WAITING))
                self._waiting[request.beam.uid] = request
        return stops

    def hold(self) -> Stops:
        """No speculation now (memory is short, or it pauses): the steps that just finished
        wait for a slot."""
        out, self._finished_now = self._finished_now, []
        self._waiting.update((r.beam.uid, r) for r in out)
        return [(r, _WAITING) for r in out]

    def preempt(self, k: int | None = None) -> list[Request]:
        """Running run-ons wait for a slot again (`StartRule.preempt`): they resume from
        their speculative tokens, or restart from their path where those were reset."""
        nodes = super().preempt(k)
        for r in nodes:
            del self._running[r]
            self._waiting[r.beam.uid] = r
        return nodes

    def stop_beams(self, beams: set[int]) -> tuple[list[Request], int]:
        """Speculation pruning: these beams' run-ons stop, their waiting steps lose their
        claim. Returns the requests to stop, and how many left the queue."""
        stops = [r for r in self._running if r.beam.uid in beams]
        for r in stops:
            del self._running[r]
        queued = [uid for uid in beams if uid in self._waiting]
        for uid in queued:
            del self._waiting[uid]
        return stops, len(queued)

    def speculating(self) -> bool:
        return bool(self._running or self._waiting)

    def end(self) -> None:
        """Every real request has its step: the running run-ons stop."""
        if self._running:
            self.parts.runner.stop(list(self._running), _FINISHED)
        self._running = {}

    def spec_tokens(self, request: Request) -> tuple[int, ...]:
        """The beam's speculative tokens after generation: what its request ran on."""
        return tuple(request.spec)

    def count_used(self, problem: Problem, requests: Sequence[Request]) -> None:
        """The speculative tokens the problem's requests started from (siblings share one
        parent's: counted once)."""
        used: dict[int | None, int] = {}
        for r in requests:
            used[r.beam.parent] = max(used.get(r.beam.parent, 0), r.adopted)
        self.parts.collector.emit(SpeculationAdopted(problem.id, sum(used.values())))

    def selected(self, problem: Problem, parents: dict[int, Beam]) -> None:
        """After selection: each child gets its parent's speculative tokens, all for child 0,
        for a duplicate a prefix of the next step they hold (`inherit_speculation`)."""
        search, opts, policy = problem.search, self.parts.opts, self.parts.policy
        step_lens = {uid: spec_step_len(self.parts.cut, policy, b, search)
                     for uid, b in parents.items() if b.spec_tokens}
        inherit_speculation(search.frontier, parents, opts.spec_truncate_ratio, opts.spec_truncate_std,
                            problem.rng, step_lens, opts.spec_own_min_tokens)
