"""Speculation in the decoupled engine: speculative steps, their adoption, and what is wasted.

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
speculation; so does memory pressure (KV usage at `kv_spec_limit`, or requests queued
inside the backend two steps running), after which speculation pauses for
`SPEC_PAUSE_STEPS` generator steps.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tts.engine.decoupled_work import Kind, _DLive, _SpecNode, _Work
from tts.engine.steps import GenJob
from tts.search.tree import Beam, StepEnd, child_seed

SPEC_PAUSE_STEPS = 16  # after a memory preemption, no new speculation for this many steps


class SpeculationMixin:
    """The speculation half of `DecoupledEngine`.

    It reads the engine's state (`gen`, `cut`, `policy`, `spec_survivors`, `dstats`,
    `_lives`, `_running`, `_kv`, `_backend_waiting`) and calls its `_jobs`, `_submit`,
    `_free` and `_event`; the state below is its own.
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
        for live, beam, k in self._spec_candidates():
            if self._free() <= 0:
                return moved
            node = live.spec.get((beam.uid, child_seed(beam.seed, k))) or self._new_spec(live, beam, k)
            if node.stalled:
                continue
            work = _Work(node.job, Kind.SPEC, live, node)
            if self._submit(work):
                node.work = work
                moved = True
        self._spec_exhausted = True  # until a step commits, scores arrive, a selection runs or a request stops
        return moved

    def _spec_candidates(self) -> list[tuple[_DLive, Beam, int]]:
        """(problem, generated beam, child index) to speculate, oldest problem first; within
        a problem in the scope's order (see the module docstring)."""
        out = []
        for live in self._lives:
            search = live.search
            if not self.policy.stops_at_boundary or self.policy.is_last_iteration(search):
                continue
            plan = self.policy.likely_kept(search) if self.spec_survivors else None
            if plan is None:
                beams = sorted(search.frontier, key=lambda b: -self.policy.path_score(b))
                plan = [(b, 1) for b in beams]
            for k in range(max((c for _, c in plan), default=0)):
                out += [(live, beam, k) for beam, c in plan if k < c and self._speculable(live, beam, k)]
        return out

    def _speculable(self, live: _DLive, beam: Beam, k: int) -> bool:
        """The beam has its step, and its child k's speculative step is not started, or
        was preempted and can resume from its tokens."""
        if beam.uid in live.waiting:
            return False
        node = live.spec.get((beam.uid, child_seed(beam.seed, k)))
        if node is None:
            return not beam.is_finished_path
        return node.work is None and not node.job.finished and not node.stalled

    def _new_spec(self, live: _DLive, beam: Beam, k: int) -> _SpecNode:
        shadow = beam.fork(child_seed(beam.seed, k))  # child k: same path, its seed
        job = self._jobs_for(live, [shadow], live.search.iteration + 1)[0]
        node = _SpecNode(beam, job, stalled=job.limit <= 0)
        live.spec[(beam.uid, shadow.seed)] = node
        self._event("spec", live.input.id, beam.uid, shadow.uid)
        return node

    def _jobs_for(self, live: _DLive, beams: list[Beam], iteration: int) -> list[GenJob]:
        """The jobs both engines make for `beams` at `iteration` (same limits)."""
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
        """Stop up to k running speculative requests, newest first. Their tokens are kept
        to resume from when the generator's sampling is resumable; otherwise (vLLM) the
        step is wasted and restarts from its path, since a resumed request would sample
        another step than the child's own request."""
        spec = [rid for rid, w in self._running.items() if w.kind is Kind.SPEC]
        stop = spec[::-1][:k] if k is not None else spec
        for rid in stop:
            work = self._running.pop(rid)
            node = work.node
            node.work = None
            self._spec_exhausted = False
            self.dstats.spec_preempted += 1
            self._event("preempt", node.parent.uid, len(node.job.tokens))
            if not self.gen.resumable_sampling:
                del work.live.spec[(node.parent.uid, node.job.beam.seed)]
                self.dstats.spec_wasted += node.generated
                self.dstats.spec_reset += 1
        if stop:
            self.gen.abort(stop)
        return len(stop)

    # ------------------------------------------------------------ at selection

    def _work_for(self, live: _DLive, nodes: dict[int, _SpecNode], job: GenJob) -> _Work | None:
        """The work for a job after selection: its parent's speculative step for its seed
        adopted, if there is one (taken out of `nodes`), else a fresh request. None: the
        running speculative request became the job's."""
        key = (job.beam.parent, job.beam.seed)
        node = nodes.get(key) if job.beam.parent is not None else None
        if node is not None and job.beam.depth == node.parent.depth:
            del nodes[key]
            return self._adopt(live, node, job)
        return _Work(job, Kind.FRESH, live)

    def _adopt(self, live: _DLive, node: _SpecNode, job: GenJob) -> _Work | None:
        """A kept beam's child takes over its speculative step."""
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
            if not self.gen.resumable_sampling:  # the child's own request would sample otherwise
                self.dstats.spec_discarded += 1
                self.dstats.spec_wasted += node.generated
                self._event("adopt", node.parent.uid, job.beam.uid, "discarded", 0)
                return _Work(job, Kind.FRESH, live)
            eos = (self.gen.eos_token_id,) if spec.end is StepEnd.EOS else ()
            job.beam.spec_tokens = tuple(spec.tokens) + eos
            self.cut.adopt(job)
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
    """The part of a problem in flight that `EngineBase._jobs` reads."""

    search: object
