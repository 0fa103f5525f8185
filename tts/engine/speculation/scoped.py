"""Scoped (`optim.spec_rule=scoped`), the decoupled schedule's start rule over the
speculative steps (`steps.py`: the steps, their adoption and what is wasted, shared with
the barrier's branches).

For a beam that is generated but not yet through selection, speculation generates the step
one of its children would generate: a request on the same path with that child's seed
(`Beam.seed_of_child(k)`) and the next iteration's limits. Which steps, by
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
(`memory.py`: KV usage at `kv_spec_limit`, or requests queued inside the backend two
steps running; then a pause of `PAUSE_STEPS` generator steps). With
`optim.decoupled_spec_guard` (the default) no new speculation starts while the run's own
cost model says it does not pay (`guard.py`).
"""

from __future__ import annotations

from collections.abc import Sequence

from tts.config.enums import DecoupledSpecScope
from tts.engine.inflight import ScheduleParts
from tts.engine.problem import Problem
from tts.engine.speculation.rule import StartRule
from tts.engine.speculation.steps import SpeculativeSteps
from tts.search.tree import Beam


class Scoped(StartRule):
    """The decoupled schedule's speculative steps (module docstring), by the scope's order;
    real work preempts them."""

    name = "scoped"
    disciplines = ("decoupled",)

    def __init__(self, steps: SpeculativeSteps, parts: ScheduleParts) -> None:
        super().__init__(steps, parts)
        self.survivors = DecoupledSpecScope(parts.opts.decoupled.spec_scope) is DecoupledSpecScope.survivors

    def candidates(self, problems: Sequence[Problem]) -> list[tuple[Problem, Beam, int]]:
        """(problem, generated beam, child index) to speculate, oldest problem first; within
        a problem in the scope's order (see the module docstring)."""
        out, policy = [], self.parts.policy
        for problem in problems:
            search = problem.search
            if not policy.stops_at_boundary or policy.is_last_iteration(search):
                continue
            plan = policy.likely_kept(search) if self.survivors else None
            if plan is None:
                beams = sorted(search.frontier, key=lambda b: -policy.path_score(b))
                plan = [(b, 1) for b in beams]
            for k in range(max((c for _, c in plan), default=0)):
                out += [(problem, beam, k) for beam, c in plan if k < c and self.steps.speculable(problem, beam, k)]
        return out
