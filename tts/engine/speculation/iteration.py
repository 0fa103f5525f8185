"""The barrier's side of speculation: what an iteration of the barrier schedule asks of it,
over every rule (`IterationSpeculation`).

An iteration begins (`begin`: the requests that adopted a whole step may speculate at
once); a real request's step ends (`step_done`: in run-on mode it may keep running); free
slots are filled (`fill`), or none may be (`hold`); a request that may run on asks for more
tokens than its step (`extra_tokens`); speculation pruning stops the speculation of beams
selection will prune (`stop_beams`, for every rule: their running requests stop, the
waiting ones lose their claim); generation ends (`end`: running run-ons stop, steps wait
for selection); then each beam holds its speculative tokens (`spec_tokens`: what its
request ran on, or child 0's step, which lookahead scores) and the ones its children
started from are counted (`count_used`).

Run-on mode (`StartRule.runs_on`, the paper's) is the mechanism's other way to speculate:
a real request whose step ended runs on in place in its own backend request where a slot
is free, or waits for one (`SpeculativeSteps.ready` and `waiting`) and then restarts from
its path and its tokens past the step (`SpeculativeSteps.run_on`); the rule orders them.
"""

from __future__ import annotations

from collections.abc import Sequence

from tts.backends.base import GenDelta
from tts.engine.problem import Problem
from tts.engine.requests import Request, RequestState
from tts.engine.speculation.driver import Speculation
from tts.engine.speculation.rule import Stops
from tts.metrics.events import SpeculationAdopted

_WAITING, _FINISHED = RequestState.WAITING, RequestState.FINISHED


class IterationSpeculation(Speculation):
    """The barrier's speculation, an iteration at a time (module docstring)."""

    def begin(self, finished: Sequence[Request]) -> None:
        """A new iteration; `finished`: its requests that adopted a whole step and may
        speculate (their children's steps may start at once; a run-on starts only from a
        step that ends while generating)."""
        steps = self.steps
        steps.pruned, steps.ready, steps.waiting = set(), {}, {}
        if not self.rule.runs_on:
            for request in finished:
                self.rule.step_done(request)

    def step_done(self, request: Request, speculate: bool, d: GenDelta, overflow: Sequence[int]) -> bool:
        """A real request's step just ended (`speculate`: it may speculate; `overflow`: its
        tokens past the step). True: it keeps running (run-on mode: it may run on, its
        tokens past the step already speculative)."""
        if speculate:
            self.rule.step_done(request)
        if not self.rule.runs_on:
            return False
        request.runon_tokens.extend(overflow)
        if speculate and not d.finished:
            self.steps.ready[request.beam.uid] = request
            return True
        return False

    def fill(self, problems: Sequence[Problem], free: int) -> Stops:
        """Start speculation in at most `free` batch slots; returns the requests to stop. In
        run-on mode a request that just finished its step runs on in place, one awaiting a
        slot restarts from its path, and those that just finished and got no slot wait."""
        if not self.rule.runs_on:
            self.start(problems, free)
            return []
        steps, runner, stops = self.steps, self.steps.runner, []
        if free <= 0 and not steps.ready:
            return stops
        for _, beam, _ in self.proposals(problems):
            if free <= 0 and not steps.ready:
                break  # the rest wait, and keep waiting
            uid = beam.uid
            request = steps.ready.pop(uid, None)
            if request is not None:  # its step just ended: it runs on in place, or waits
                if free > 0:
                    runner.run_on(request)
                    free -= 1
                else:
                    stops.append((request, _WAITING))
                    steps.waiting[uid] = request
            elif free > 0:
                # a request whose speculation is spent takes no slot
                free -= steps.run_on(steps.waiting.pop(uid))
        return stops

    def hold(self) -> Stops:
        """No speculation may start now (memory is short, or it pauses): in run-on mode the
        steps that just finished wait for a slot. Returns the requests to stop."""
        ready, self.steps.ready = self.steps.ready, {}
        self.steps.waiting.update(ready)
        return [(r, _WAITING) for r in ready.values()]

    def extra_tokens(self, request: Request) -> int:
        """Tokens a real request asks for beyond its step: in run-on mode, one that may
        speculate asks for `spec_max_tokens` more."""
        if self.rule.runs_on and request.spec_priority > 0 and not request.to_eos:
            return self.steps.spec_max_tokens
        return 0

    def speculating(self, problems: Sequence[Problem]) -> bool:
        """Some speculation runs or waits for a slot."""
        return bool(self.running()) or self.proposes(problems)

    def stop_beams(self, beams: set[int], problems: Sequence[Problem]) -> tuple[list[Request], int]:
        """Speculation pruning: these beams' speculation stops, for every rule. Returns the
        running requests to stop, and how many waiting ones lost their claim."""
        steps = self.steps
        if self.rule.runs_on:
            stops = [r for r in self.running() if r.beam.uid in beams]
            queued = [uid for uid in beams if uid in steps.waiting]
            for uid in queued:
                del steps.waiting[uid]
        else:
            stops = [r for r in self.running() if r.beam.parent in beams]
            queued = [c for c in self.proposals(problems) if c[1].uid in beams]
        steps.pruned |= beams
        return stops, len(queued)

    def end(self) -> None:
        """Every real request of the iteration has its step: running run-ons stop; steps
        wait for selection (a running one holds its KV)."""
        if self.rule.runs_on and (running := self.running()):
            self.steps.runner.stop(running, _FINISHED)

    def spec_tokens(self, request: Request) -> tuple[int, ...]:
        """The beam's speculative tokens after generation (lookahead scores their step):
        what its request ran on, or its child 0's step (`SpeculativeSteps.steps_of`)."""
        if self.rule.runs_on:
            return tuple(request.runon_tokens)
        return self.steps.steps_of(request).get(request.beam.seed, ())

    def count_used(self, problem: Problem, requests: Sequence[Request]) -> None:
        """In run-on mode, the speculative tokens the problem's requests started from
        (siblings share one parent's: counted once); a step a child adopts is counted as
        it does (`SpeculativeSteps.take_over_all`)."""
        if not self.rule.runs_on:
            return
        used: dict[int | None, int] = {}
        for r in requests:
            used[r.beam.parent] = max(used.get(r.beam.parent, 0), r.adopted)
        self.rule.parts.collector.emit(SpeculationAdopted(problem.id, sum(used.values())))
