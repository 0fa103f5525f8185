"""Speculation in the decoupled schedule: speculative steps, their adoption, and what is wasted.

For a beam that is generated but not yet through selection, speculation generates the step
one of its children would generate: a request on the same path with that child's seed
(`child_seed(parent seed, k)`) and the next iteration's limits. Which steps, by
`optim.decoupled_spec_scope`:

- `survivors` (default): the children of the beams the policy's selection would keep on
  the scores known so far (`SearchPolicy.likely_kept`), best beam first, child 0 of every
  likely survivor before child 1. A beam whose new step is scored ranks by that score,
  one still unscored by its path so far; the guess sharpens as the PRM's scores come in.
  Beam search N=8 M=4 keeps 2 of 8 beams with 4 children each: this speculates up to the
  8 steps of the next iteration instead of 8 child-0 steps of which at most 2 survive.
- `all`: child 0 of every generated beam, best path score first (the thesis's rule);
  also the fallback for a policy that cannot guess (`likely_kept` returns None).

Speculative steps live outside the beams (the PRM never sees one) until a selection
adopts them. When a selection keeps the beam and gives it that child, the child adopts
the step: a finished one becomes the child's step with no generation request, a running
one becomes the child's request. A partial one (preempted, or stopped at
`spec_max_tokens`, 0 = one step's limit) seeds the child's request through
`Beam.spec_tokens` only where the generator's sampling is resumable (vLLM with the
position-keyed sampler, the fake backend's `context` mode); with vLLM's own sampler a
request resumed from part of a step samples another step than the child's own request
would, which would change the search, so there it is discarded, and a preempted
speculative request restarts from its path. When no kept child matches
(the beam is pruned, completes, or gets fewer children), the speculative step is dropped
and counted as wasted.

Real work (and eager work, when the fill policy ranks it first) preempts running
speculation; so does memory pressure, by the rule the barrier's speculation follows too
(`memory_guard.py`: KV usage at `kv_spec_limit`, or requests queued inside the backend two
steps running; then a pause of `PAUSE_STEPS` generator steps). With `optim.decoupled_spec_guard` (the default) no new
speculation starts while the run's own cost model says it does not pay (`spec_guard.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tts.engine.memory_guard import MemoryGuard
from tts.engine.model_runner import ModelRunner
from tts.engine.requests import Request, RequestKind, RequestState
from tts.engine.schedule import Problem
from tts.engine.spec_guard import SpeculationGuard
from tts.engine.spec_steps import Adoption, Table, drop, preempted, take_over
from tts.engine.steps import StepCutter
from tts.search.base import SearchPolicy
from tts.search.tree import Beam, child_seed

class SpeculativeSteps:
    """The decoupled schedule's speculative steps (module docstring).

    `requests_for(problem, beams, iteration)` makes the requests an iteration would make;
    `submit(request)` sends one (False: it has no budget left); `event(*fields)` records a
    trace event.
    """

    def __init__(self, runner: ModelRunner, cut: StepCutter, policy: SearchPolicy,
                 requests_for: Callable[[Problem, list[Beam], int], list[Request]],
                 submit: Callable[[Request], bool], event: Callable[..., None],
                 survivors: bool, kv_spec_limit: float) -> None:
        self.runner, self.cut, self.policy = runner, cut, policy
        self._requests_for, self._submit, self._event = requests_for, submit, event
        self.survivors = survivors
        self.memory = MemoryGuard(kv_spec_limit)
        self.exhausted = False  # the last scan found no speculation left to start
        self.guard: SpeculationGuard | None = None  # whether speculation pays (`spec_guard.py`)

    # ------------------------------------------------------------ memory

    def allowed(self) -> bool:
        """Speculation may start: memory allows (`memory`), and it pays (`guard`, when set)."""
        return self.memory.allows() and (self.guard is None or self.guard.allows())

    def relieve_memory(self) -> None:
        """After a generator step: when memory is short, stop speculation for a while."""
        if self.memory.short() and self.preempt():
            self.memory.preempted()

    # ------------------------------------------------------------ starting it

    def free_slots(self) -> int:
        return self.runner.gen.batch_cap - len(self.runner.requests)

    def start(self, problems: Sequence[Problem]) -> bool:
        """Fill free batch slots with speculative steps; True when one started."""
        if self.free_slots() <= 0 or self.exhausted or not self.allowed():
            return False
        started = False
        for problem, beam, k in self.candidates(problems):
            if self.free_slots() <= 0:
                return started
            node = problem.spec.get((beam.uid, child_seed(beam.seed, k))) or self._new(problem, beam, k)
            if not node.stalled and self._submit(node):
                started = True
        self.exhausted = True  # until a step commits, scores arrive, a selection runs or a request stops
        return started

    def candidates(self, problems: Sequence[Problem]) -> list[tuple[Problem, Beam, int]]:
        """(problem, generated beam, child index) to speculate, oldest problem first; within
        a problem in the scope's order (see the module docstring)."""
        out = []
        for problem in problems:
            search = problem.search
            if not self.policy.stops_at_boundary or self.policy.is_last_iteration(search):
                continue
            plan = self.policy.likely_kept(search) if self.survivors else None
            if plan is None:
                beams = sorted(search.frontier, key=lambda b: -self.policy.path_score(b))
                plan = [(b, 1) for b in beams]
            for k in range(max((c for _, c in plan), default=0)):
                out += [(problem, beam, k) for beam, c in plan if k < c and self._speculable(problem, beam, k)]
        return out

    def _speculable(self, problem: Problem, beam: Beam, k: int) -> bool:
        """The beam has its step, and its child k's speculative step is not started, or
        was preempted and can resume from its tokens."""
        if beam.uid in problem.waiting:
            return False
        node = problem.spec.get((beam.uid, child_seed(beam.seed, k)))
        if node is None:
            return not beam.is_finished_path
        return not node.state.in_backend and not node.finished and not node.stalled

    def _new(self, problem: Problem, beam: Beam, k: int) -> Request:
        shadow = beam.fork(child_seed(beam.seed, k))  # child k: same path, its seed
        node = self._requests_for(problem, [shadow], problem.search.iteration + 1)[0]
        node.kind, node.stalled = RequestKind.SPEC, node.limit <= 0
        problem.spec[(beam.uid, shadow.seed)] = node
        self._event("spec", problem.id, beam.uid, shadow.uid)
        return node

    # ------------------------------------------------------------ while it runs

    def stopped(self, node: Request) -> None:
        """A speculative request ended: its step is done, or it reached its cap."""
        node.stalled = not node.finished
        self._event("spec_done", node.beam.parent, node.generated)

    def preempt(self, k: int | None = None) -> int:
        """Stop up to k running speculative requests, newest first. Their tokens are kept
        to resume from when the generator's sampling is resumable; otherwise (vLLM) the
        step is wasted and restarts from its path, since a resumed request would sample
        another step than the child's own request."""
        spec = [r for r in self.runner.requests.values() if r.kind is RequestKind.SPEC]
        stop = spec[::-1][:k] if k is not None else spec
        for node in stop:
            self.exhausted = False
            self._event("preempt", node.beam.parent, len(node.tokens))
            if preempted(self.runner, node):  # it restarts from its path: a new step
                del node.problem.spec[(node.beam.parent, node.beam.seed)]
        self.runner.stop(stop, RequestState.WAITING)
        return len(stop)

    # ------------------------------------------------------------ at selection

    def request_for(self, nodes: Table, request: Request) -> Request | None:
        """The request to run for a kept child after selection: it takes over its parent's
        speculative step for its seed, if `nodes` holds one (`spec_steps.take_over`). None:
        the running speculative request became the child's."""
        taken = take_over(self.runner, self.cut, nodes, request)
        if taken is None:
            return request
        self._event("adopt", request.beam.parent, request.beam.uid, taken[0].value, taken[1])
        return None if taken[0] is Adoption.PROMOTED else request

    def drop(self, node: Request) -> None:
        """A speculative step whose beam selection did not keep: all its tokens are wasted."""
        drop(self.runner, [node])
        self._event("drop", node.beam.parent, node.beam.uid, node.generated)

    # ------------------------------------------------------------ reports

    def paths(self, problems: Sequence[Problem]) -> set[tuple[str, tuple[str, ...]]]:
        """(problem id, path) of every speculative step held now, for checks and tests."""
        out = set()
        for problem in problems:
            for node in problem.spec.values():
                if node.tokens:
                    text = self.runner.gen.decode(node.tokens)
                    out.add((problem.id, node.beam.step_texts + (text,)))
        return out
