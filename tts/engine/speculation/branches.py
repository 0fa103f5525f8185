"""Branches (`optim.spec_rule=branches`), a start rule of the barrier over the speculative
steps (`steps.py`).

A real request's step is committed to its beam as it finishes and the request stops; up
to `spec_priority` speculative steps then start on the committed path, in batch slots real
work leaves free: branch k is the very request child k would send (child k's seed, the next
iteration's limits), the highest score bins first, child 0 before duplicates. When
generation ends the branches wait for selection (a running one holds its KV; no tokens are
generated while the verifier runs), and in the next iteration child k takes over its own
(`SpeculativeSteps.take_over_all`); the others are dropped. The tree is the one without
speculation (on vLLM up to its batch-dependent numerics, which move P's trees too),
whatever the sampler; child 0's branch doubles as its beam's lookahead step.
"""

from __future__ import annotations

from collections.abc import Sequence

from tts.backends.base import GenDelta
from tts.engine.frontier import ScheduleParts
from tts.engine.problem import Problem
from tts.engine.requests import Request
from tts.engine.speculation.policy import next_runs_to_eos
from tts.engine.speculation.rule import TableRule
from tts.engine.speculation.steps import SpeculativeSteps, step_tokens
from tts.search.base import ProblemSearch
from tts.search.tree import Beam


class Branches(TableRule):
    """The iteration's branches (module docstring)."""

    name = "branches"

    def __init__(self, steps: SpeculativeSteps, parts: ScheduleParts) -> None:
        super().__init__(steps, parts)
        self._parents: list[Request] = []  # finished steps whose children branch, in finish order
        self._pruned: set[int] = set()  # their beams whose speculation pruning stopped

    def begin(self, finished: Sequence[Request]) -> None:
        """A new iteration; `finished`: the requests that adopted a whole step and may
        speculate (they branch at once)."""
        self._parents, self._pruned = list(finished), set()

    def speculates(self, search: ProblemSearch) -> bool:
        """Not where the next iteration samples to EOS and sampling is not resumable: no
        child could take a branch, its request runs past the step."""
        parts = self.parts
        return not (next_runs_to_eos(parts.opts, parts.policy, search) and not parts.runner.gen.resumable_sampling)

    def step_done(self, request: Request, speculate: bool, d: GenDelta, overflow: Sequence[int]) -> bool:
        """A real request's step just finished: its children branch when it may speculate.
        It never keeps running."""
        if speculate:
            self._parents.append(request)
        return False

    def candidates(self, problems: Sequence[Problem]) -> list[tuple[Problem, Beam, int]]:
        """(problem, finished request's beam, child k) of the branches not running: new, or
        stopped short and resumable; the highest priority bins first, child 0 before
        duplicates."""
        out = [(r, k) for r in self._parents if r.beam.uid not in self._pruned for k in range(r.spec_priority)
               if self.steps.speculable(r.problem, r.beam, k)]
        return [(r.problem, r.beam, k) for r, k in sorted(out, key=lambda c: (-c[0].spec_priority, c[1]))]

    def stop_beams(self, beams: set[int]) -> tuple[list[Request], int]:
        """Speculation pruning: these beams' branches stop, the waiting ones lose their
        claim. Returns the requests to stop, and how many waiting branches left the queue."""
        stops = [b for b in self.running() if b.beam.parent in beams]
        queued = [k for _, beam, k in self.candidates(()) if beam.uid in beams]
        self._pruned |= beams
        return stops, len(queued)

    def speculating(self) -> bool:
        return bool(self.running() or self.candidates(()))

    def steps_of(self, request: Request) -> dict[int, tuple[int, ...]]:
        """The branches' steps by child seed, as a child would start from them (a final EOS
        kept): the finished ones; where sampling is resumable, also those stopped short
        (preempted, at their cap). Not the running ones, which a kept child takes over."""
        mine, runner = self.steps.of(request), self.parts.runner
        steps = {b.beam.seed: step_tokens(runner, b) for b in mine if b.finished}
        if runner.gen.resumable_sampling:
            steps.update((b.beam.seed, tuple(b.tokens)) for b in mine
                         if not b.finished and b.tokens and not b.state.in_backend)
        return steps

    def spec_tokens(self, request: Request) -> tuple[int, ...]:
        """The beam's speculative tokens after generation: child 0's branch, which doubles
        as the lookahead step."""
        return self.steps_of(request).get(request.beam.seed, ())
