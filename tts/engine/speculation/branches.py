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

import bisect
from collections.abc import Sequence

from tts.backends.base import GenDelta
from tts.engine.frontier import ScheduleParts
from tts.engine.problem import Problem
from tts.engine.requests import Request
from tts.engine.speculation.policy import next_runs_to_eos
from tts.engine.speculation.rule import TableRule
from tts.engine.speculation.steps import SpeculativeSteps, step_tokens
from tts.search.base import ProblemSearch
from tts.search.tree import Beam, child_seed


class Branches(TableRule):
    """The iteration's branches (module docstring)."""

    name = "branches"

    def __init__(self, steps: SpeculativeSteps, parts: ScheduleParts) -> None:
        super().__init__(steps, parts)
        self._pruned: set[int] = set()  # beams whose speculation pruning stopped
        # the branches waiting to start, kept as the iteration goes (a scan of every finished
        # step's children at every generator step cost O(n) a step): by (-priority, child k),
        # each a list of (finish order, parent request); those started leave it for
        # `_started`, and come back if preempted
        self._queue: dict[tuple[int, int], list[tuple[int, Request]]] = {}
        # (parent uid, child seed) -> (finish order, parent request, child k)
        self._started: dict[tuple[int, int], tuple[int, Request, int]] = {}
        self._order = 0

    def begin(self, finished: Sequence[Request]) -> None:
        """A new iteration; `finished`: the requests that adopted a whole step and may
        speculate (they branch at once)."""
        self._pruned, self._queue, self._started, self._order = set(), {}, {}, 0
        for request in finished:
            self._enqueue(request)

    def speculates(self, search: ProblemSearch) -> bool:
        """Not where the next iteration samples to EOS and sampling is not resumable: no
        child could take a branch, its request runs past the step."""
        parts = self.parts
        return not (next_runs_to_eos(parts.opts, parts.policy, search) and not parts.runner.gen.resumable_sampling)

    def step_done(self, request: Request, speculate: bool, d: GenDelta, overflow: Sequence[int]) -> bool:
        """A real request's step just finished: its children branch when it may speculate.
        It never keeps running."""
        if speculate:
            self._enqueue(request)
        return False

    def _enqueue(self, request: Request) -> None:
        for k in range(request.spec_priority):
            self._queue.setdefault((-request.spec_priority, k), []).append((self._order, request))
        self._order += 1

    def candidates(self, problems: Sequence[Problem]) -> list[tuple[Problem, Beam, int]]:
        """(problem, finished request's beam, child k) of the branches not running: new, or
        stopped short and resumable; the highest priority bins first, child 0 before
        duplicates, each in the order their parents finished. A branch that has finished,
        stalled or been pruned leaves the queue for good; one running leaves it until it is
        preempted (`preempt`)."""
        out = []
        for key in sorted(self._queue):
            k, keep = key[1], []
            for entry in self._queue[key]:
                r = entry[1]
                if r.beam.uid in self._pruned:
                    continue
                if self.steps.speculable(r.problem, r.beam, k):
                    out.append((r.problem, r.beam, k))
                else:
                    node = r.problem.spec.get((r.beam.uid, child_seed(r.beam.seed, k)))
                    if node is None:
                        if r.beam.is_finished_path:
                            continue  # no child steps past the path's end
                    elif node.finished or node.stalled:
                        continue
                    elif node.state.in_backend:
                        self._started[(r.beam.uid, node.beam.seed)] = (entry[0], r, k)
                        continue
                keep.append(entry)
            self._queue[key] = keep
        return out

    def preempt(self, k: int | None = None) -> list[Request]:
        """Stopped branches wait to start again (`StartRule.preempt`): back to the queue, in
        their parents' order."""
        nodes = super().preempt(k)
        for node in nodes:
            started = self._started.pop((node.beam.parent, node.beam.seed), None)
            if started is not None:
                order, r, c = started
                bisect.insort(self._queue.setdefault((-r.spec_priority, c), []), (order, r), key=lambda e: e[0])
        return nodes

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
