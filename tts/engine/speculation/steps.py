"""Speculative steps, the one mechanism under every start rule: child k's step generated
before selection has chosen child k, and how the kept child adopts it.

A speculative step is a request on its parent's path with child k's seed (`child_seed`),
kept by (parent uid, child seed) in its problem's table until selection runs: the
barrier's branches (`branches.py`) and the decoupled schedule's speculative steps
(`scoped.py`) are such steps, each start rule deciding only which start, and when.
When selection keeps the parent and gives it child k, child k's request adopts the step
(`adopt`):

- whole: the step ended within its tokens: it becomes the child's step, with no
  generation request;
- promoted: it still runs and can produce the child's whole step (the same kind of step,
  within the same token limit, no speculative cap below it): the child's request takes
  over its backend request, some tokens in;
- partial: it stopped short (preempted, or cut at a speculative cap): where the
  generator's sampling is resumable (vLLM with the position-keyed sampler, the fake
  backend's `context` mode) its tokens start the child's request (`Beam.spec_tokens`);
- discarded: otherwise, since a request resumed from part of a step samples another step
  than the child's own request would, which would change the search.

A step no kept child adopts is dropped: its backend request, if it still runs, stops.
Each of these ends is counted here, once for every rule (a `SpeculativeStep` event for
the run's `SpeculationLog`).

`SpeculativeSteps` holds what every rule shares of speculation while it runs: the start
of a step (child k's request for the next iteration) and of a run-on (a real request past
its step, `run_on`: the mechanism's run-on mode, with the finished steps that may run on,
`ready` and `waiting`), both within the speculative token cap `spec_max_tokens` (a step
stopped at the cap is partial, `Request.stalled`); the speculative requests running (the
model runner's, `running`); their preemption, counted, and reset where sampling is not
resumable (`preempt`); the adoption after selection (`take_over_all`); and the one memory
rule (`memory.py`). Which steps start, and when, is a start rule's (`rule.py`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence

from tts.engine.model_runner import ModelRunner
from tts.engine.options import KV_SPEC_LIMIT
from tts.engine.problem import Problem, Table
from tts.engine.requests import Request, RequestKind, RequestState
from tts.engine.speculation.memory import MemoryGuard
from tts.engine.step_cutter import StepCutter
from tts.metrics.events import SpeculationAdopted, SpeculativeStep
from tts.search.tree import Beam, StepEnd


class Adoption(str, enum.Enum):
    WHOLE = "whole"
    PROMOTED = "promoted"
    PARTIAL = "partial"
    DISCARDED = "discarded"


def same_step(spec_step: Request, request: Request) -> bool:
    """The speculative step `spec_step` is `request`'s step: the same kind of step (to EOS or
    not, cut into steps or not), a token limit at least the request's, and no speculative
    tokens of the request's own before it."""
    return ((spec_step.to_eos, spec_step.cut_into_steps) == (request.to_eos, request.cut_into_steps)
            and spec_step.limit >= request.limit and not request.beam.spec_tokens)


def step_tokens(runner: ModelRunner, spec_step: Request) -> tuple[int, ...]:
    """The step's tokens as the child adopts them: a final EOS kept, so its step ends there."""
    return tuple(spec_step.tokens) + ((runner.gen.eos_token_id,) if spec_step.end is StepEnd.EOS else ())


def take_over(runner: ModelRunner, cut: StepCutter, table: Table, request: Request) -> Adoption | None:
    """A kept child's `request` takes over its parent's speculative step for its seed, where
    `table` holds one (it leaves the table): `adopt`, with the tokens it used counted; returns
    how. None: there is none, and the request runs as it is."""
    beam = request.beam
    key = (beam.parent, beam.seed)
    spec_step = table.pop(key, None) if beam.parent is not None else None
    if spec_step is None:
        return None
    how, used = adopt(runner, cut, spec_step, request)
    runner.collector.emit(SpeculationAdopted(request.problem_id, used))
    return how


def adopt(runner: ModelRunner, cut: StepCutter, spec_step: Request, request: Request) -> tuple[Adoption, int]:
    """`request`, a kept child's, adopts its speculative step `spec_step` (module docstring).
    Returns how, and how many of the tokens generated for `spec_step` it used. A promoted
    request runs in the backend on `spec_step`'s request; a whole or partial one holds the
    adopted tokens (`adopted`), and is finished when they hold its step."""
    how, used = _adopt(runner, cut, spec_step, request)
    runner.collector.emit(SpeculativeStep(request.problem_id, how.value, spec_step.generated - used))
    return how, used


def _adopt(runner: ModelRunner, cut: StepCutter, spec_step: Request, request: Request) -> tuple[Adoption, int]:
    running = spec_step.state.in_backend
    if same_step(spec_step, request) and (spec_step.finished or (running and not spec_step.capped)):
        cut.consume(request, step_tokens(runner, spec_step) if spec_step.finished else spec_step.tokens)
        request.adopted = len(request.tokens)
        used = spec_step.generated
        if request.finished or not running:
            if running:
                runner.stop([spec_step], RequestState.FINISHED)
            return Adoption.WHOLE, used
        runner.promote(spec_step, request)  # the child runs on the step's request
        return Adoption.PROMOTED, used
    if running:
        runner.stop([spec_step])
    if not runner.gen.resumable_sampling:
        return Adoption.DISCARDED, 0
    eos = spec_step.end is StepEnd.EOS
    request.beam.spec_tokens = step_tokens(runner, spec_step)
    cut.adopt(request)
    return Adoption.PARTIAL, min(spec_step.generated, request.adopted + (1 if eos and request.end is StepEnd.EOS else 0))


def preempted(runner: ModelRunner, request: Request) -> bool:
    """A running speculative request is stopped before its end (memory, or real work needs
    its slot), counted once for every rule. Returns whether its speculative tokens (a
    step's all, a run-on's past its step) are lost: where the generator's sampling is not
    resumable (vLLM's own sampler) a request resumed from them would sample another step
    than the child's own request, so it restarts from its path."""
    runner.collector.emit(SpeculativeStep(request.problem_id, "preempted"))
    if runner.gen.resumable_sampling:
        return False
    lost = request.generated if request.kind is RequestKind.SPEC else len(request.runon_tokens)
    runner.collector.emit(SpeculativeStep(request.problem_id, "reset", lost))
    return True


def drop(runner: ModelRunner, spec_steps: list[Request]) -> None:
    """Steps no kept child adopted: those still running stop; all their tokens are wasted."""
    running = [n for n in spec_steps if n.state.in_backend]
    if running:
        runner.stop(running)
    for spec_step in spec_steps:
        runner.collector.emit(SpeculativeStep(spec_step.problem_id, "dropped", spec_step.generated))


class SpeculativeSteps:
    """The speculative requests of the problems in flight, as they run (module docstring).
    `requests_for(problem, beams, iteration)` makes the requests an iteration would make."""

    def __init__(self, runner: ModelRunner, cut: StepCutter,
                 requests_for: Callable[[Problem, list[Beam], int], list[Request]], spec_max_tokens: int,
                 kv_spec_limit: float = KV_SPEC_LIMIT) -> None:
        self.runner, self.cut = runner, cut
        self._requests_for = requests_for
        self.spec_max_tokens = spec_max_tokens
        self.memory = MemoryGuard(kv_spec_limit)
        # run-on mode: finished real steps that may run on, by beam uid: those whose step
        # ended in this generator step, still running, and those waiting for a slot
        self.ready: dict[int, Request] = {}
        self.waiting: dict[int, Request] = {}
        self.pruned: set[int] = set()  # beams whose speculation pruning stopped (`optim.spec_prune`)

    def running(self) -> list[Request]:
        """The speculative requests running in the backend, oldest first: speculative steps
        (not those whose step just ended, which stop) and run-ons."""
        spec = RequestKind.SPEC
        return [r for r in self.runner.speculative.values() if r.kind is not spec or not r.finished]

    def of(self, request: Request) -> list[Request]:
        """The speculative steps held for the children of a request's beam, child 0 first."""
        return request.problem.spec_table.of_beam(request.beam.uid)

    def speculable(self, problem: Problem, beam: Beam, k: int) -> bool:
        """The beam has its step, and its child k's speculative step is not started, or
        was stopped short and can resume from its tokens."""
        if beam.uid in problem.waiting:
            return False
        spec_step = problem.spec_table.get((beam.uid, beam.seed_of_child(k)))
        if spec_step is None:
            return not beam.is_finished_path
        return not spec_step.state.in_backend and not spec_step.finished and not spec_step.stalled

    def start(self, problem: Problem, beam: Beam, k: int) -> bool:
        """Start child k's speculative step of `beam` (or resume it); False when it has no
        token budget left."""
        spec_step = problem.spec_table.get((beam.uid, beam.seed_of_child(k)))
        if spec_step is None:
            shadow = beam.fork(beam.seed_of_child(k))  # child k: the same path, its seed
            spec_step = self._requests_for(problem, [shadow], problem.search.iteration + 1)[0]
            spec_step.kind, spec_step.stalled = RequestKind.SPEC, spec_step.limit <= 0
            problem.spec_table[(beam.uid, shadow.seed)] = spec_step
        return not spec_step.stalled and self.submit(spec_step)

    def submit(self, spec_step: Request) -> bool:
        """Send a speculative step within the cap; False when it has no budget left (it stalls)."""
        budget = spec_step.limit - len(spec_step.tokens)
        max_tokens = min(budget, self.spec_max_tokens - len(spec_step.tokens)) if self.spec_max_tokens else budget
        if max_tokens < 1:
            spec_step.stalled = True
            return False
        spec_step.capped = max_tokens < budget
        self.runner.submit(spec_step, max_tokens, spec_step.tokens, speculative=True)
        return True

    def run_on(self, request: Request) -> bool:
        """Send a real request whose step is committed on from its tokens past the step
        (`Request.runon_tokens`), within the cap; False when its speculation is spent."""
        budget = self.spec_max_tokens - len(request.runon_tokens)
        if budget <= 0:
            return False
        self.runner.submit(request, budget, request.runon_tokens, speculative=True)
        return True

    def stopped(self, spec_step: Request) -> None:
        """A speculative request ended: its step is done, or it reached its cap (stalled)."""
        spec_step.stalled = not spec_step.finished

    def preempt(self, requests: Sequence[Request]) -> None:
        """Stop these running speculative requests; they wait (a run-on for a slot again,
        `waiting`). Their tokens are kept to resume from where the generator's sampling is
        resumable; otherwise (vLLM's own sampler) they are wasted (`preempted`): a step
        leaves its table, a run-on drops its tokens past its step, and either starts again
        from its path."""
        for request in requests:
            is_step = request.kind is RequestKind.SPEC
            if not is_step:
                self.waiting[request.beam.uid] = request
            if not preempted(self.runner, request):
                continue
            if is_step:
                del request.problem.spec_table[(request.beam.parent, request.beam.seed)]
            else:
                request.runon_tokens.clear()
        self.runner.stop(requests, RequestState.WAITING)

    def take_over_all(self, requests: Sequence[Request], complete: Callable[[Request], None],
                      ) -> tuple[list[Request], list[Request]]:
        """After a selection: each kept child's request, in order, takes over its parent's
        speculative step for its seed where its problem's table holds one (`take_over`), and
        starts from its beam's speculative tokens (run-on's, `StepCutter.adopt`); one whose
        step is then whole is committed (`complete`). Every other step of those tables is
        dropped. Returns the requests running on a step's backend request (promoted), and
        those still to send."""
        running, to_send = [], []
        for request in requests:
            if take_over(self.runner, self.cut, request.problem.spec_table, request) is Adoption.PROMOTED:
                running.append(request)
                continue
            self.cut.adopt(request)
            if request.finished:
                complete(request)
            else:
                to_send.append(request)
        for problem in dict.fromkeys(r.problem for r in requests):
            self.drop_table(problem)
        return running, to_send

    def drop_table(self, problem: Problem) -> None:
        """Drop the problem's speculative steps (no kept child took them over): all their
        tokens are wasted."""
        drop(self.runner, list(problem.spec_table.values()))
        problem.spec_table = Table()

    def steps_of(self, request: Request) -> dict[int, tuple[int, ...]]:
        """The speculative steps of a request's beam's children by child seed, as a child
        would start from them (a final EOS kept): the finished ones; where sampling is
        resumable, also those stopped short (preempted, at their cap). Not the running
        ones, which a kept child takes over."""
        mine, runner = self.of(request), self.runner
        steps = {b.beam.seed: step_tokens(runner, b) for b in mine if b.finished}
        if runner.gen.resumable_sampling:
            steps.update((b.beam.seed, tuple(b.tokens)) for b in mine
                         if not b.finished and b.tokens and not b.state.in_backend)
        return steps
