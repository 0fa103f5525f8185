"""The barrier schedule's generation: one step for every request of an iteration, with
FlashTTS's speculative extension filling the slots of requests that finished early.

The backend never stops at a step boundary; the step rule (`StepCutter`) ends each
request's step at "\\n\\n", EOS or its token limit, and commits it to its beam at once
(`Inflight.complete`). Then the request is stopped or, with speculation on, speculates by
the run's start rule (`tts.engine.speculation`), for example:

- run-on (the paper's Algorithm 1, `speculation/runon.py`): the request runs on past the
  boundary; selection hands its tokens down to the children;
- branches (`speculation/branches.py`): the request stops, and its children's own steps
  start on its committed path; each kept child takes its own over.

Real work always has priority (two-phase scheduling): speculation takes only the slots
real requests leave free, up to `spec_batch_cap` requests in all. Memory pressure stops it
by the rule the decoupled schedule follows too (`speculation/memory.py`). Generation ends
when every real request has its step. What an iteration asks of speculation, over every
rule, is its barrier side's (`speculation/iteration.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tts.backends.base import GenDelta, StepStats
from tts.engine.model_runner import ModelRunner
from tts.engine.postprocess import postprocess
from tts.engine.problem import Problem
from tts.engine.requests import Request, RequestState
from tts.engine.speculation.iteration import IterationSpeculation
from tts.engine.speculation.rule import Stops
from tts.engine.step_cutter import StepCutter, completes_path

_FINISHED = RequestState.FINISHED


class IterationGeneration:
    """Runs an iteration's requests on the generator until every one has its step:
    `begin`, then `advance` with each generator step's output while `active`, then `end`.
    `complete(request)` commits a request's step to its beam as soon as the step is whole
    (`Inflight.complete`); `speculation` is the barrier's side of speculation, over the
    run's start rule."""

    def __init__(self, runner: ModelRunner, cut: StepCutter, complete: Callable[[Request], None],
                 speculation: IterationSpeculation, spec_batch_cap: int = 0) -> None:
        self.runner = runner
        self.cut = cut
        self.complete = complete
        self.speculation = speculation
        # Speculation may keep at most this many requests running (real + speculative);
        # 0 = the generator's batch cap. Beyond the decode roofline's ridge batch every
        # extra sequence slows the stragglers, so the engine passes that batch here.
        self.spec_batch_cap = spec_batch_cap
        self._pending: set[Request] = set()  # real requests without their step
        self._problems: Sequence[Problem] = ()  # the iteration's problems

    @property
    def active(self) -> bool:
        """Some request still lacks its step."""
        return bool(self._pending)

    def begin(self, requests: Sequence[Request], problems: Sequence[Problem] = ()) -> None:
        """Send each request of `problems`; a request that adopted a whole step speculates
        at once (the slots real work leaves free are idle from the start)."""
        self._pending, self._problems = set(), problems
        self._start(requests)
        self.speculation.begin([r for r in requests if r.finished and self._may_speculate(r)])
        if self._pending:
            self._stop(self.speculation.fill(problems, self._speculative_slots()))

    def advance(self, outputs: list[tuple[Request, GenDelta, bool]], step: StepStats) -> None:
        """Take one generator step's output (`postprocess`): cut steps, start and stop
        speculation."""
        stops = postprocess(outputs, self.cut, self.speculation, self._step_ended)
        spec = self.speculation
        spec.relieve(step)
        if self._pending and spec.allows():
            stops += spec.fill(self._problems, self._speculative_slots())
        else:  # real work only: memory is short, or speculation pauses after it was
            stops += spec.hold()
        self._stop(stops)

    def _step_ended(self, request: Request, d: GenDelta, overflow: Sequence[int]) -> bool:
        """A real request's step ended: it is committed, and may speculate. Returns whether
        it stops (run-on may keep it running)."""
        if request not in self._pending:
            return False
        self._pending.discard(request)
        self.complete(request)
        return not self.speculation.step_done(request, self._may_speculate(request), d, overflow)

    def running(self) -> list[Request]:
        """The real requests still decoding their step."""
        return list(self._pending)

    def speculating(self) -> bool:
        """Some speculation runs or waits for a slot."""
        return self.speculation.speculating(self._problems)

    def stop_speculating(self, beams: set[int]) -> int:
        """Speculation pruning: these beams' finished steps cannot make selection's cut, so
        their speculation stops (running requests stop, waiting ones lose their claim: their
        steps are finished, so nothing claims a slot for them again this iteration); the slots
        go to the others from the next step. Returns how many speculative requests stopped or
        left the queue."""
        stops, queued = self.speculation.stop_beams(beams, self._problems)
        self._stop([(r, _FINISHED) for r in stops])
        return len(stops) + queued

    def reject(self, requests: Sequence[Request]) -> None:
        """Early rejection: stop these requests; their beams get no step this iteration."""
        self._pending.difference_update(requests)
        self.runner.stop(requests)

    def end(self) -> None:
        """Every request has its step: speculation waits for selection, or stops
        (`IterationSpeculation.end`)."""
        self.speculation.end()

    def release(self) -> None:
        """Stop the speculative requests no child adopted (the search ended)."""
        self.speculation.release()

    def _stop(self, stops: Stops) -> None:
        """Stop backend requests in one call, each left in its state."""
        if stops:
            self.runner.stop_each(stops)

    def _start(self, requests: Sequence[Request]) -> None:
        """Send each request: a kept child takes over its speculative step, or starts from
        its beam's speculative tokens (`SpeculativeSteps.take_over_all`); one that may run
        on asks for more than its step (`IterationSpeculation.extra_tokens`)."""
        running, to_send = self.speculation.steps.take_over_all(requests, self.complete)
        self._pending.update(running)
        self.speculation.release()  # speculation of problems that ended
        for request in to_send:
            extra = self.speculation.extra_tokens(request)
            self.runner.submit(request, request.limit - len(request.tokens) + extra, request.tokens)
            self._pending.add(request)

    def _may_speculate(self, request: Request) -> bool:
        """Speculation on a finished step: a bin that claims some, not past EOS, nor past a
        step with a boxed answer, which completes the path (no child would use what it
        generated)."""
        return (request.spec_priority > 0 and not request.to_eos
                and not completes_path(request))

    def _speculative_slots(self) -> int:
        """Slots for speculation: `spec_batch_cap` (0 = the batch cap), never above the
        generator's batch cap (M may lower it below the ridge batch: a request beyond it
        would wait in the backend, which preempts speculation, `memory`), less the
        requests running."""
        batch_cap = self.runner.gen.batch_cap
        cap = min(self.spec_batch_cap or batch_cap, batch_cap)
        return cap - len(self._pending) - len(self.speculation.running())
