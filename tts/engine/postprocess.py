"""One generator step's outputs, the one path both schedules take (nano-vllm's
`Scheduler.postprocess`).

Each output is a delta of one request. A speculative request's tokens are speculation's
(`Speculation.take`: a speculative step's are cut into its step, a run-on's are its beam's
speculative tokens). A real request's are cut into its step (`StepCutter.finish`), and
where the step ended the schedule hears of it (`step_ended`: it commits the step, and says
whether the request stops or runs on). Most deltas end nothing: for those it makes no
object, and touches nothing but the request.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tts.backends.base import GenDelta
from tts.engine.requests import Request, RequestState
from tts.engine.speculation.driver import Speculation
from tts.engine.speculation.rule import Stops
from tts.engine.step_cutter import StepCutter

_FINISHED = RequestState.FINISHED


def postprocess(outputs: list[tuple[Request, GenDelta, bool]], cut: StepCutter, speculation: Speculation,
                step_ended: Callable[[Request, GenDelta, Sequence[int]], bool]) -> Stops:
    """Take one generator step's outputs (the module docstring). `step_ended(request, delta,
    overflow)` is called for each real request whose step ended, in the order of the
    outputs, with its tokens past the step; it returns whether the request stops where its
    backend request still runs. Returns the requests to stop, in that order: their step
    ended before their backend request did."""
    stops: Stops = []
    take, finish = speculation.take, cut.finish
    for request, d, speculative in outputs:
        if speculative:
            if take(request, d):
                stops.append((request, _FINISHED))
            continue
        ended = finish(request, d)
        if ended is not None and step_ended(request, d, ended.overflow) and ended.stop:
            stops.append((request, _FINISHED))
    return stops
