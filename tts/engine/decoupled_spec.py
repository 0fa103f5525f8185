"""Speculation in the decoupled engine: speculative steps, their adoption, and what is wasted.

For a beam that is generated but not yet through selection, speculation generates the step
its child 0 would generate: a request on the same path with the same seed and the next
iteration's limits. Speculative steps live outside the beams (the PRM never sees one)
until a selection adopts them.

When a selection keeps a beam, its child 0 adopts the speculative step: a finished one
becomes the child's step with no generation request, a running one becomes the child's
request, a partial one (preempted, or stopped at `spec_max_tokens`, 0 = one step's limit)
seeds the child's request through `Beam.spec_tokens`. When the beam is pruned (or
completes), its speculative step is dropped and counted as wasted. Real work (and eager
work, when the fill policy ranks it first) preempts running speculation (its tokens are
kept, to resume or adopt later); so does memory pressure (KV usage at `kv_spec_limit`, or
requests queued inside the backend two steps running), after which speculation pauses for
`SPEC_PAUSE_STEPS` generator steps.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tts.engine.decoupled_work import Kind, _DLive, _SpecNode, _Work
from tts.engine.generation import GenJob
from tts.search.tree import Beam, StepEnd

SPEC_PAUSE_STEPS = 16  # after a memory preemption, no new speculation for this many steps


class SpeculationMixin:
    """The speculation half of `DecoupledEngine`.

    It reads the engine's state (`gen`, `phase`, `policy`, `dstats`, `_lives`, `_running`,
    `_kv`, `_backend_waiting`) and calls its `_jobs`, `_submit`, `_free` and `_event`; the
    state below is its own.
    """

    def _init_speculation(self, spec_cap: int, kv_spec_limit: float) -> None:
        self.spec_cap = spec_cap  # speculative tokens per beam
        self.kv_spec_limit = kv_spec_limit
        self._spec_exhausted = False  # the last scan found no speculation left to start
        self._spec_pause = 0  # generator steps left without speculation after a preemption

    # ------------------------------------------------------------ starting it

    def _memory_short(self) -> bool:
        """KV usage at `kv_spec_limit`, or requests queued in the backend two steps running."""
        return self._kv >= self.kv_spec_limit or self._backend_waiting >= 2

    def _spec_allowed(self) -> bool:
        return not self._memory_short() and self._spec_pause == 0

    def _submit_spec(self) -> bool:
        if self._free() <= 0 or self._spec_exhausted or not self._spec_allowed():
            return False
        moved = False
        for live, beam in self._spec_candidates():
            if self._free() <= 0:
                return moved
            node = live.spec.get(beam.uid) or self._new_spec(live, beam)
            if node.stalled:
                continue
            work = _Work(node.job, Kind.SPEC, live, node)
            if self._submit(work):
                node.work = work
                moved = True
        self._spec_exhausted = True  # until a step commits, a selection runs or a request stops
        return moved

    def _spec_candidates(self) -> list[tuple[_DLive, Beam]]:
        """Generated beams whose child-0 step may be speculated, oldest problem first and,
        within a problem, by the path score known so far (best first)."""
        out = []
        for live in self._lives:
            search = live.search
            if not self.policy.stops_at_boundary or self.policy.is_last_iteration(search):
                continue
            beams = []
            for beam in search.frontier:
                if beam.uid in live.waiting:
                    continue
                node = live.spec.get(beam.uid)
                if node is None:
                    if not beam.is_finished_path:
                        beams.append(beam)
                elif node.work is None and not node.job.finished and not node.stalled:
                    beams.append(beam)  # preempted earlier: resume from its tokens
            beams.sort(key=lambda b: -self.policy.path_score(b))
            out += [(live, b) for b in beams]
        return out

    def _new_spec(self, live: _DLive, beam: Beam) -> _SpecNode:
        shadow = beam.fork(beam.seed)  # child 0: same path, same seed
        job = self._jobs_for(live, [shadow], live.search.iteration + 1)[0]
        node = _SpecNode(beam, job, stalled=job.limit <= 0)
        live.spec[beam.uid] = node
        self._event("spec", live.input.id, beam.uid, shadow.uid)
        return node

    def _jobs_for(self, live: _DLive, beams: list[Beam], iteration: int) -> list[GenJob]:
        """The synchronous engine's jobs for `beams` at `iteration` (same limits)."""
        view = replace(live.search, frontier=list(beams), iteration=iteration)
        return self._jobs(_View(view))

    # ------------------------------------------------------------ while it runs

    def _spec_generated(self, work: _Work, n: int) -> None:
        """A speculative request produced `n` more tokens."""
        work.node.generated += n
        work.live.metrics.spec_generated += n
        self.dstats.spec_generated += n

    def _spec_stopped(self, work: _Work) -> None:
        """A speculative request ended: its step is done, or it reached its cap."""
        work.node.work = None
        work.node.stalled = not work.job.finished
        self._event("spec_done", work.node.parent.uid, work.node.generated)

    def _relieve_memory(self) -> None:
        """After a generator step: when memory is short, stop speculation for a while."""
        self._spec_pause = max(0, self._spec_pause - 1)
        if self._memory_short():
            if self._preempt_spec():  # KV short, or the backend queues requests
                self._spec_pause = SPEC_PAUSE_STEPS  # do not restart it at once

    def _preempt_spec(self, k: int | None = None) -> int:
        """Stop up to k running speculative requests, newest first; their tokens are kept."""
        spec = [rid for rid, w in self._running.items() if w.kind is Kind.SPEC]
        stop = spec[::-1][:k] if k is not None else spec
        for rid in stop:
            work = self._running.pop(rid)
            work.node.work = None
            self._spec_exhausted = False
            self.dstats.spec_preempted += 1
            self._event("preempt", work.node.parent.uid, len(work.job.tokens))
        if stop:
            self.gen.abort(stop)
        return len(stop)

    # ------------------------------------------------------------ at selection

    def _work_for(self, live: _DLive, nodes: dict[int, _SpecNode], job: GenJob) -> _Work | None:
        """The work for a job after selection: its parent's speculative step adopted, if the
        job is that step's child 0 (taken out of `nodes`), else a fresh request. None: the
        running speculative request became the job's."""
        node = nodes.get(job.beam.parent) if job.beam.parent is not None else None
        if node is not None and job.beam.seed == node.parent.seed and job.beam.depth == node.parent.depth:
            del nodes[job.beam.parent]
            return self._adopt(live, node, job)
        return _Work(job, Kind.FRESH, live)

    def _adopt(self, live: _DLive, node: _SpecNode, job: GenJob) -> _Work | None:
        """Child 0 of a kept beam takes over its speculative step."""
        spec, running = node.job, node.work
        same = (spec.limit, spec.to_eos, spec.split) == (job.limit, job.to_eos, job.split)
        m = live.metrics
        if same and spec.finished:
            job.tokens, job.end, job.last_char = list(spec.tokens), spec.end, spec.last_char
            job.adopted = len(job.tokens)
            used, how, out = node.generated, "whole", _Work(job, Kind.FRESH, live)
            self.dstats.spec_whole += 1
        elif same and running is not None and not running.capped:
            spec.beam = job.beam  # the request already generates exactly this step
            spec.adopted = len(spec.tokens)
            running.kind, running.node = Kind.FRESH, None
            used, how, out = node.generated, "promoted", None
            self.dstats.spec_promoted += 1
        else:
            if running is not None:
                self._running.pop(running.request_id, None)
                self.gen.abort([running.request_id])
            eos = (self.gen.eos_token_id,) if spec.end is StepEnd.EOS else ()
            job.beam.spec_tokens = tuple(spec.tokens) + eos
            self.phase._adopt_spec(job)
            used = min(node.generated, job.adopted + (1 if eos and job.end is StepEnd.EOS else 0))
            how, out = "partial", _Work(job, Kind.FRESH, live)
            self.dstats.spec_partial += 1
        m.spec_used += used
        self.dstats.spec_used += used
        self.dstats.spec_wasted += node.generated - used
        self._event("adopt", node.parent.uid, job.beam.uid, how, used)
        return out

    def _drop(self, live: _DLive, node: _SpecNode) -> None:
        """A speculative step whose beam selection did not keep: all its tokens are wasted."""
        if node.work is not None:
            self._running.pop(node.work.request_id, None)
            self.gen.abort([node.work.request_id])
            node.work = None
        self.dstats.spec_wasted += node.generated
        self.dstats.spec_dropped += 1
        self._event("drop", node.parent.uid, node.job.beam.uid, node.generated)

    # ------------------------------------------------------------ reports

    def speculative_paths(self) -> set[tuple[str, tuple[str, ...]]]:
        """(problem id, path) of every speculative step held now, for checks and tests."""
        out = set()
        for live in self._lives:
            for node in live.spec.values():
                if node.job.tokens:
                    text = self.gen.decode(node.job.tokens)
                    out.add((live.input.id, node.parent.step_texts + (text,)))
        return out


@dataclass
class _View:
    """The part of a problem in flight that `SyncEngine._jobs` reads."""

    search: object
