"""Branches (`optim.spec_branches`), the barrier's start rule over the speculative steps
(`spec_steps.py`).

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
from tts.engine.requests import Request, RequestKind, RequestState
from tts.engine.problem import Problem
from tts.engine.spec_steps import SpeculativeSteps, step_tokens

Stops = list[tuple[Request, RequestState]]


class Branches(SpeculativeSteps):
    """The iteration's branches (module docstring), as `IterationGeneration` drives a start
    rule: `begin`, `take`/`step_done` with each delta, `fill` after each generator step."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self._tables: dict[str, Problem] = {}  # the problems whose tables hold branches, by id
        self._parents: list[Request] = []  # finished steps whose children branch, in finish order
        self._pruned: set[int] = set()  # their beams whose speculation pruning stopped

    def begin(self, finished: Sequence[Request]) -> None:
        """A new iteration; `finished`: the requests that adopted a whole step and may
        speculate (they branch at once)."""
        self._parents, self._pruned = list(finished), set()

    def extra_tokens(self, request: Request) -> int:
        return 0

    def owns(self, request: Request) -> bool:
        return request.kind is RequestKind.SPEC

    def take(self, branch: Request, d: GenDelta) -> bool:
        """Apply one delta of a branch; True when its step ended before its request did (to
        stop). A branch stopped at its speculative cap holds part of a step (`stalled`)."""
        out = self.cut.finish(branch, d)
        if out.ended:
            self.stopped(branch)
        return out.stop

    def step_done(self, request: Request, speculate: bool, d: GenDelta, overflow: Sequence[int]) -> bool:
        """A real request's step just finished: its children branch when it may speculate.
        It never keeps running."""
        if speculate:
            self._parents.append(request)
        return False

    def live(self) -> list[Request]:
        """The branches running in the backend (not those whose step just ended)."""
        return [b for b in self.running() if not b.finished]

    def live_count(self) -> int:
        return len(self.live())

    def waiting(self) -> list[tuple[Request, int]]:
        """(finished request, child k) of the branches not running: new, or stopped short
        and resumable; the highest priority bins first, child 0 before duplicates."""
        out = [(r, k) for r in self._parents if r.beam.uid not in self._pruned for k in range(r.spec_priority)
               if self.speculable(r.problem, r.beam, k)]
        return sorted(out, key=lambda c: (-c[0].spec_priority, c[1]))

    def fill(self, free: int) -> Stops:
        """Free slots go to the waiting branches; branch k is child k's speculative step on
        its parent's committed path (`SpeculativeSteps.start`)."""
        for request, k in self.waiting():
            if free <= 0:
                break
            self._tables[request.problem.id] = request.problem
            free -= self.start(request.problem, request.beam, k)
        return []

    def hold(self) -> Stops:
        return []

    def preempt_live(self) -> Stops:
        """Memory is short: every running branch waits again, from its tokens where sampling
        is resumable (`SpeculativeSteps.preempt`)."""
        self.preempt(self.live())
        return []

    def stop_beams(self, beams: set[int]) -> tuple[list[Request], int]:
        """Speculation pruning: these beams' branches stop, the waiting ones lose their
        claim. Returns the requests to stop, and how many waiting branches left the queue."""
        stops = [b for b in self.live() if b.beam.parent in beams]
        queued = [k for r, k in self.waiting() if r.beam.uid in beams]
        self._pruned |= beams
        return stops, len(queued)

    def speculating(self) -> bool:
        return bool(self.live() or self.waiting())

    def end(self) -> None:
        """The branches wait for selection (a running one goes on running)."""

    def release(self) -> None:
        """Drop the branches still in the tables (no kept child took them over)."""
        for p in self._tables.values():
            self.drop_table(p)
        self._tables = {}

    def steps_of(self, request: Request) -> dict[int, tuple[int, ...]]:
        """The branches' steps by child seed, as a child would start from them (a final EOS
        kept): the finished ones; where sampling is resumable, also those stopped short
        (preempted, at their cap). Not the running ones, which a kept child takes over."""
        mine = self.of(request)
        steps = {b.beam.seed: step_tokens(self.runner, b) for b in mine if b.finished}
        if self.runner.gen.resumable_sampling:
            steps.update((b.beam.seed, tuple(b.tokens)) for b in mine
                         if not b.finished and b.tokens and not b.state.in_backend)
        return steps

    def spec_tokens(self, request: Request) -> tuple[int, ...]:
        """The beam's speculative tokens after generation: child 0's branch, which doubles
        as the lookahead step."""
        return self.steps_of(request).get(request.beam.seed, ())
