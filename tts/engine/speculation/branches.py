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
from collections.abc import Iterator, Sequence

from tts.engine.inflight import ScheduleParts
from tts.engine.problem import Problem
from tts.engine.requests import Request
from tts.engine.speculation.policy import next_runs_to_eos
from tts.engine.speculation.rule import StartRule
from tts.engine.speculation.steps import SpeculativeSteps
from tts.search.tree import Beam


class Branches(StartRule):
    """The iteration's branches (module docstring)."""

    name = "branches"

    def __init__(self, steps: SpeculativeSteps, parts: ScheduleParts) -> None:
        super().__init__(steps, parts)
        # the branches waiting to start, kept as the iteration goes (a scan of every finished
        # step's children at every generator step cost O(n) a step): by (-priority, child k),
        # each a list of (finish order, parent request); those started leave it for
        # `_started`, and come back if preempted
        self._queue: dict[tuple[int, int], list[tuple[int, Request]]] = {}
        # (parent uid, child seed) -> (finish order, parent request, child k)
        self._started: dict[tuple[int, int], tuple[int, Request, int]] = {}
        self._order = 0

    def step_done(self, request: Request) -> None:
        """A real request's step just finished and may speculate: its children branch, but
        where the next iteration samples to EOS and sampling is not resumable (no child
        could take a branch: its request runs past the step)."""
        parts = self.parts
        if next_runs_to_eos(parts.opts, parts.policy, request.problem.search) and not parts.runner.gen.resumable_sampling:
            return
        for k in range(request.spec_priority):
            self._queue.setdefault((-request.spec_priority, k), []).append((self._order, request))
        self._order += 1

    def candidates(self, problems: Sequence[Problem]) -> Iterator[tuple[Problem, Beam, int]]:
        """(problem, finished request's beam, child k) of the branches not running: new, or
        stopped short and resumable; the highest priority bins first, child 0 before
        duplicates, each in the order their parents finished. A branch that has finished,
        stalled or been pruned leaves the queue for good; one running leaves it until it is
        preempted (`preempted`). Lazy: a step with few free slots reads the queue only as
        far as they go (a full scan cost O(n) a step), and what it read is tidied when the
        reading stops (`finally`)."""
        pruned, speculable = self.steps.pruned, self.steps.speculable
        for key in sorted(self._queue):
            entries, k, keep, read = self._queue[key], key[1], [], 0
            try:
                for entry in entries:
                    read += 1
                    r = entry[1]
                    if r.beam.uid in pruned:
                        continue
                    if speculable(r.problem, r.beam, k):
                        keep.append(entry)
                        yield r.problem, r.beam, k
                        continue
                    spec_step = r.problem.spec_table.get((r.beam.uid, r.beam.seed_of_child(k)))
                    if spec_step is None:
                        if r.beam.is_finished_path:
                            continue  # no child steps past the path's end
                    elif spec_step.finished or spec_step.stalled:
                        continue
                    elif spec_step.state.in_backend:
                        self._started[(r.beam.uid, spec_step.beam.seed)] = (entry[0], r, k)
                        continue
                    keep.append(entry)
            finally:
                self._queue[key] = keep + entries[read:]

    def preempted(self, requests: Sequence[Request]) -> None:
        """Stopped branches wait to start again: back to the queue, in their parents' order."""
        for spec_step in requests:
            started = self._started.pop((spec_step.beam.parent, spec_step.beam.seed), None)
            if started is not None:
                order, r, c = started
                bisect.insort(self._queue.setdefault((-r.spec_priority, c), []), (order, r), key=lambda e: e[0])

    def selected(self, problem: Problem, parents: dict[int, Beam]) -> None:
        """The problem's branches were adopted or dropped: they leave the queue."""
        self._queue = {key: [e for e in entries if e[1].problem is not problem] for key, entries in self._queue.items()}
        self._started = {key: v for key, v in self._started.items() if v[1].problem is not problem}
