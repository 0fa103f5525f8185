"""The decoupled engine: the LLM and the PRM each work from their own queue.

Each problem's search stays iteration-synchronous in its decisions: the policy's
`select` runs once every beam of the problem's frontier has its step and the scores
`indices_to_score` asks for, so the final candidates are the synchronous engine's. What
changes is that neither model waits for the other. The loop alternates

- one LLM round: generator steps, with freed batch slots refilled between steps, until
  the PRM has something worth a call (a problem waits only for scores, the PRM queue
  reaches `verifier_batch_size`, only speculation is left running, or `round_steps`
  steps passed);
- one PRM call: at most `verifier_batch_size` beams (0 = all queued), and for each only
  its shallowest unscored step (`last_scored + 1`). Speculative steps are never queued:
  they live outside the beams until a selection adopts them.

The LLM fills its batch (the generator's `batch_cap`) in this order:
1. real work: the next step of every beam of a frontier (after a selection, or the
   first steps of a problem in flight); it preempts running speculation;
2. and 3., in the order the fill policy chooses (`decoupled_policy.py`):
   eager work (start the next problem from the request queue, up to
   `options.concurrency` problems in flight) and speculative work (for a beam that is
   generated but not yet through selection, the step its child 0 would generate: a
   request on the same path with the same seed and the next iteration's limits).

When a selection keeps a beam, its child 0 adopts the speculative step: a finished one
becomes the child's step with no generation request, a running one becomes the child's
request, a partial one (preempted, or stopped at `spec_max_tokens`, 0 = one step's limit) seeds the child's
request through `Beam.spec_tokens`. When the beam is pruned (or completes), its
speculative step is dropped and counted as wasted. Real work (and eager work, when the
policy ranks it first) preempts running speculation (its tokens are kept, to resume or adopt later); so does memory pressure
(KV usage at `kv_spec_limit`, or requests queued inside the backend two steps running),
after which speculation pauses for `SPEC_PAUSE_STEPS` generator steps.

Not used here: `options.speculative` and `options.lookahead` (FlashTTS's run-on
speculation and lookahead scoring); speculation is what the fill policy does, and the
PRM never sees a speculative step. `options.score_cache` still lets beams with equal
paths share a score.
"""

from __future__ import annotations

import enum
import itertools
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace

from tts.backends.base import FinishReason, Generator, GenRequest, Verifier
from tts.config.schema import EngineKind, OptimConfig
from tts.engine.decoupled_policy import EAGER_FIRST, Filler, FillPolicy, FillState, make_fill_policy
from tts.engine.generation import GenJob, make_steps
from tts.engine.scoring import ScoreItem
from tts.engine.sync import EngineOptions, ProblemInput, ProblemOutcome, SyncEngine, _Live
from tts.metrics.collector import UTIL_BINS, StepLog
from tts.search.base import SearchPolicy
from tts.search.tree import Beam, StepEnd

_request_ids = itertools.count()
SPEC_PAUSE_STEPS = 16  # after a memory preemption, no new speculation for this many steps


class Kind(str, enum.Enum):
    """What a generation request is for."""

    EAGER = "eager"  # a first step of a problem taken from the request queue
    FRESH = "fresh"  # a next step after a selection
    SPEC = "spec"  # a speculative next step of a beam still waiting for selection


@dataclass
class _SpecNode:
    """A speculative step: `job` generates `parent`'s child-0 step ahead of selection."""

    parent: Beam
    job: GenJob  # on a same-seed fork of `parent`, with the next iteration's limits
    work: _Work | None = None  # the request in flight, if any
    generated: int = 0  # backend tokens produced for it (a final EOS included)
    stalled: bool = False  # reached `spec_max_tokens` (or has no budget) before its step end


@dataclass
class _Work:
    """A generation job, queued or in flight."""

    job: GenJob
    kind: Kind
    live: _DLive
    node: _SpecNode | None = None
    request_id: str | None = None
    capped: bool = False  # max_tokens below the job's budget: LENGTH is not a step end


@dataclass
class _DLive(_Live):
    """A problem in flight."""

    order: int = 0
    waiting: set[int] = field(default_factory=set)  # frontier beams without their step
    to_score: int = 0  # frontier beams with a score still missing
    spec: dict[int, _SpecNode] = field(default_factory=dict)  # by parent uid
    lengths: list[int] = field(default_factory=list)  # new tokens per step, this iteration


@dataclass
class DecoupledStats:
    """Run-level counters of the decoupled engine."""

    llm_rounds: int = 0
    llm_steps: int = 0
    prm_calls: int = 0
    prm_items: list[int] = field(default_factory=list)  # beams per PRM call
    prm_computed: int = 0  # step scores the verifier computed (cache hits excluded)
    tokens: dict[str, int] = field(default_factory=lambda: {k.value: 0 for k in Kind})
    requests: dict[str, int] = field(default_factory=lambda: {k.value: 0 for k in Kind})
    spec_generated: int = 0
    spec_used: int = 0
    spec_wasted: int = 0
    spec_whole: int = 0  # adopted finished: a step with no generation request
    spec_promoted: int = 0  # adopted while running: the request became the real one
    spec_partial: int = 0  # adopted as a prefix of the real step
    spec_dropped: int = 0  # speculative steps of beams that selection did not keep
    spec_preempted: int = 0  # speculative requests stopped to make room (tokens kept)
    problems_started: int = 0
    max_live: int = 0

    def summary(self, gen_log: StepLog, fill: FillPolicy, prm_cap: int) -> dict:
        total_tok, total_req = sum(self.tokens.values()), sum(self.requests.values())
        filler = self.tokens[Kind.EAGER.value] + self.tokens[Kind.SPEC.value]
        util = [min(1.0, n / prm_cap) for n in self.prm_items] if prm_cap else []
        hist = [0] * UTIL_BINS
        for u in util:
            hist[min(UTIL_BINS - 1, int(u * UTIL_BINS))] += 1
        g = gen_log.summary()
        return {
            "policy": fill.name,
            "fill_decisions": dict(fill.decisions),
            # the results summary reads `batch_util_mean` from every step log: the LLM's
            "batch_util_mean": g["batch_util_mean"],
            "llm_batch_util_mean": g["batch_util_mean"],
            "llm_batch_util_hist": g["batch_util_hist"],
            "llm_rounds": self.llm_rounds,
            "llm_steps": self.llm_steps,
            "prm_calls": self.prm_calls,
            "prm_items_mean": statistics.fmean(self.prm_items) if self.prm_items else 0.0,
            "prm_batch_cap": prm_cap,
            "prm_batch_util_mean": statistics.fmean(util) if util else None,
            "prm_batch_util_hist": hist if util else None,
            "prm_scores_computed": self.prm_computed,
            "tokens": dict(self.tokens),
            "requests": dict(self.requests),
            "tokens_per_request_mean": total_tok / total_req if total_req else 0.0,
            "tokens_per_request_by_kind": {k: (self.tokens[k] / n if n else 0.0) for k, n in self.requests.items()},
            "scheduled_tokens_per_request_hist": g["tokens_per_request_hist"],
            "eager_tokens": self.tokens[Kind.EAGER.value],
            "spec_tokens": self.tokens[Kind.SPEC.value],
            "eager_share": self.tokens[Kind.EAGER.value] / filler if filler else 0.0,
            "spec_share": self.tokens[Kind.SPEC.value] / filler if filler else 0.0,
            "spec_generated": self.spec_generated,
            "spec_used": self.spec_used,
            "spec_wasted": self.spec_wasted,
            "spec_hit_rate": self.spec_used / self.spec_generated if self.spec_generated else 0.0,
            "spec_steps_whole": self.spec_whole,
            "spec_steps_promoted": self.spec_promoted,
            "spec_steps_partial": self.spec_partial,
            "spec_steps_dropped": self.spec_dropped,
            "spec_preempted": self.spec_preempted,
            "requests_saved": self.spec_whole,
            "kv_usage_mean": g["kv_usage_mean"],
            "kv_usage_max": g["kv_usage_max"],
            "problems_started": self.problems_started,
            "max_live_problems": self.max_live,
        }


class DecoupledEngine(SyncEngine):
    """Runs problems with separate LLM and PRM work queues (see the module docstring).

    `round_steps` bounds an LLM round (default: the policy's step token limit);
    `kv_spec_limit` is the KV usage at which speculation stops and running speculative
    requests are preempted. Set `trace` to a list to record the engine's events.
    """

    def __init__(self, generator: Generator, verifier: Verifier | None,
                 make_policy: Callable[[], SearchPolicy], system_prompt: str,
                 options: EngineOptions = EngineOptions(), optim: OptimConfig | None = None,
                 round_steps: int | None = None, kv_spec_limit: float = 0.95) -> None:
        super().__init__(generator, verifier, make_policy, system_prompt, options)
        self.optim = optim if optim is not None else OptimConfig(engine=EngineKind.decoupled)
        self.fill_policy: FillPolicy = make_fill_policy(self.optim.decoupled_policy)
        self.prm_cap = max(0, self.optim.verifier_batch_size)
        # speculative tokens per beam: `spec_max_tokens`, 0 meaning one step's limit
        self.spec_cap = max(0, options.spec_max_tokens) or self.policy.step_max_tokens
        self.round_steps = max(1, round_steps or self.policy.step_max_tokens)
        self.kv_spec_limit = kv_spec_limit
        self.dstats = DecoupledStats()
        self.trace: list[tuple] | None = None
        self._queue: deque[ProblemInput] = deque()
        self._lives: list[_DLive] = []
        self._real: deque[_Work] = deque()  # real jobs waiting for a batch slot
        self._running: dict[str, _Work] = {}
        self._prm: deque[tuple[_DLive, Beam]] = deque()
        self._done: list[_DLive] = []
        self._order = itertools.count()
        self._util = 0.0  # moving average of the generator's batch utilisation
        self._kv = 0.0
        self._backend_waiting = 0  # consecutive steps with requests queued in the backend
        self._spec_exhausted = False  # the last scan found no speculation left to start
        self._spec_pause = 0  # generator steps left without speculation after a preemption

    # ------------------------------------------------------------------ the loop

    def run(self, problems: Iterable[ProblemInput]) -> Iterator[ProblemOutcome]:
        """Yield each problem's outcome as soon as it finishes."""
        self._queue.extend(problems)
        while self._queue or self._lives or self._done:
            moved = self._llm_round()
            moved = self._prm_call() or moved
            while self._done:
                yield self._finish(self._done.pop(0))
            if not moved and (self._queue or self._lives):
                raise RuntimeError("decoupled engine: no progress with problems in flight "
                                   f"({len(self._lives)} live, {len(self._real)} queued jobs)")
        if self._running:  # nothing should be left; never leave requests behind
            self.gen.abort(list(self._running))
            self._running.clear()

    def _llm_round(self) -> bool:
        start, steps, moved = time.perf_counter(), 0, False
        touched: dict[int, _DLive] = {}
        while True:
            moved = self._fill() or moved
            if not self._running:
                break
            for w in self._running.values():
                touched[id(w.live)] = w.live
            self._gen_step()
            steps += 1
            if self._round_over(steps):
                break
        if steps:
            self.dstats.llm_rounds += 1
            wall = time.perf_counter() - start
            for live in touched.values():
                live.metrics.generator_s += wall
        return moved or steps > 0

    def _round_over(self, steps: int) -> bool:
        """Whether the PRM should run now."""
        if not self._prm:
            return False  # nothing to score: keep the LLM busy
        if self.prm_cap and len(self._prm) >= self.prm_cap:
            return True
        if any(not live.waiting and live.to_score for live in self._lives):
            return True  # a selection waits only for the PRM
        if all(w.kind is Kind.SPEC for w in self._running.values()):
            return True  # only speculation runs: real work depends on the PRM
        return steps >= self.round_steps

    # ------------------------------------------------------------ batch filling

    def _free(self) -> int:
        return self.gen.batch_cap - len(self._running)

    def _fill(self) -> bool:
        """Fill free batch slots: real work, then eager and speculative in policy order."""
        moved = False
        while True:
            moved = self._submit_real() or moved
            admissible = bool(self._queue) and len(self._lives) < self.opts.concurrency
            if not admissible:
                return self._submit_spec() or moved
            spec_room = self._free() > 0 or any(w.kind is Kind.SPEC for w in self._running.values())
            if not spec_room:
                return moved
            has_spec = not self._spec_exhausted and bool(self._spec_candidates())
            order = self.fill_policy.order(self._fill_state()) if has_spec else EAGER_FIRST
            if order[0] is Filler.SPECULATIVE:
                moved = self._submit_spec() or moved
                if self._free() <= 0:
                    return moved
            self._admit()  # eager first: its jobs preempt running speculation
            moved = True

    def _fill_state(self) -> FillState:
        return FillState(self.gen.batch_cap, len(self._running), self._util, self._kv,
                         len(self._lives), self.opts.concurrency)

    def _submit_real(self) -> bool:
        moved = False
        while self._real:
            if self._free() <= 0 and not self._preempt_spec(1):
                break
            self._submit(self._real.popleft())
            moved = True
        return moved

    def _spec_allowed(self) -> bool:
        return self._kv < self.kv_spec_limit and self._backend_waiting < 2 and self._spec_pause == 0

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

    def _admit(self) -> None:
        p = self._queue.popleft()
        item = self._start(p)
        live = _DLive(item.input, item.search, item.metrics, order=next(self._order))
        jobs = self.ordering.order(self._jobs(live), lambda j: j.beam)
        live.waiting = {j.beam.uid for j in jobs}
        self._real.extend(_Work(j, Kind.EAGER, live) for j in jobs)
        self._lives.append(live)
        self.dstats.problems_started += 1
        self.dstats.max_live = max(self.dstats.max_live, len(self._lives))
        self._event("admit", p.id)

    def _submit(self, work: _Work) -> bool:
        job = work.job
        budget = max_tokens = job.limit - len(job.tokens)
        if work.kind is Kind.SPEC and self.spec_cap:
            max_tokens = min(budget, self.spec_cap - len(job.tokens))
        if max_tokens < 1:
            if work.kind is Kind.SPEC:
                work.node.stalled = True
                return False
            max_tokens = 1
        work.capped = max_tokens < budget
        rid = f"d{next(_request_ids)}"
        work.request_id = job.request_id = rid
        self.gen.add(GenRequest(rid, job.beam.token_ids + tuple(job.tokens), max_tokens, job.beam.seed,
                                self.opts.temperature, self.opts.top_p))
        self._running[rid] = work
        self.dstats.requests[work.kind.value] += 1
        work.live.metrics.gen_requests += 1
        self._event("submit", work.kind.value, job.beam.uid, rid)
        return True

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

    # ---------------------------------------------------------------- generation

    def _gen_step(self) -> None:
        deltas, st = self.gen.step()
        self.gen_log.observe(st)
        self.fill_policy.observe(st)
        self.dstats.llm_steps += 1
        self._util = 0.8 * self._util + 0.2 * min(1.0, st.num_running / max(1, st.batch_cap))
        self._kv = st.kv_usage
        # requests queued inside the backend for two steps running: memory is short (a
        # single step may only be a prefill waiting for the token budget)
        self._backend_waiting = self._backend_waiting + 1 if st.num_waiting > 0 else 0
        self._event("step", st.num_running, st.kv_usage)
        aborts = []
        for d in deltas:
            work = self._running.get(d.request_id)
            if work is None:
                continue
            m, job, n = work.live.metrics, work.job, len(d.new_token_ids)
            if d.num_prompt_tokens is not None:
                m.gen_prompt_tokens += d.num_prompt_tokens
                m.gen_cached_tokens += d.num_cached_tokens or 0
            m.gen_tokens += n
            self.dstats.tokens[work.kind.value] += n
            if work.kind is Kind.SPEC:
                work.node.generated += n
                m.spec_generated += n
                self.dstats.spec_generated += n
            finish = d.finish_reason
            if finish is FinishReason.LENGTH and work.capped:
                finish = None  # the speculative cap, not the step's limit
            self.phase._consume(job, d.new_token_ids, finish)
            if not (job.finished or d.finished):
                continue
            del self._running[d.request_id]
            if not d.finished:
                aborts.append(d.request_id)
            if work.kind is Kind.SPEC:
                work.node.work = None
                work.node.stalled = not job.finished
                self._event("spec_done", work.node.parent.uid, work.node.generated)
            else:
                self._complete(work)
        if aborts:
            self.gen.abort(aborts)
        self._spec_pause = max(0, self._spec_pause - 1)
        if self._kv >= self.kv_spec_limit or self._backend_waiting >= 2:
            if self._preempt_spec():  # KV short, or the backend queues requests
                self._spec_pause = SPEC_PAUSE_STEPS  # do not restart it at once
        self._settle()

    def _complete(self, work: _Work) -> None:
        """A real job has its step: commit it to the beam and queue its score."""
        job, live = work.job, work.live
        beam = job.beam
        total_left = self.policy.max_total_tokens - beam.num_tokens
        for step in make_steps(job, self.gen.decode, self.gen.token_text, total_left):
            beam.append(step)
        live.waiting.discard(beam.uid)
        self._spec_exhausted = False
        live.lengths.append(len(job.tokens) - job.adopted)
        if self._next_index(live, beam) is not None:
            live.to_score += 1
            self._prm.append((live, beam))
        self._event("commit", work.kind.value, live.input.id, beam.uid, beam.step_texts)

    def _next_index(self, live: _DLive, beam: Beam) -> int | None:
        """The shallowest step the policy needs scored that has no score yet."""
        for i in self.policy.indices_to_score(beam, live.search):
            if beam.scores[i] is None:
                return i
        return None

    # ------------------------------------------------------------------ scoring

    def _prm_call(self) -> bool:
        if not self._prm:
            return False
        n = min(len(self._prm), self.prm_cap or len(self._prm))
        batch = [self._prm.popleft() for _ in range(n)]
        items = [ScoreItem(beam, live.input.problem, (self._next_index(live, beam),)) for live, beam in batch]
        before = [beam.last_scored for _, beam in batch]
        pids = {live.input.id for live, _ in batch}
        hits0 = {pid: self.cache.hits_by_problem[pid] for pid in pids} if self.cache is not None else {}
        scored = self.scoring.run(items, order=lambda xs: self.ordering.order(xs, lambda i: i.beam))
        for b in scored.batches:
            for s in b.step_stats:
                self.ver_log.observe(s)
        self.dstats.prm_calls += 1
        self.dstats.prm_items.append(n)
        self.dstats.prm_computed += scored.computed
        self._account_prm(batch, scored, hits0)
        requeue = []
        for (live, beam), item, b0 in zip(batch, items, before):
            self._event("prm", live.input.id, beam.uid, item.indices[0], b0, beam.last_scored, beam.step_texts)
            if self._next_index(live, beam) is not None:
                requeue.append((live, beam))
            else:
                live.to_score -= 1
        self._prm.extendleft(reversed(requeue))
        self._settle()
        return True

    def _account_prm(self, batch, scored, hits0: dict[str, int]) -> None:
        lives = {id(live): live for live, _ in batch}
        items: dict[int, int] = {}
        for live, _ in batch:
            items[id(live)] = items.get(id(live), 0) + 1
        computed = {}
        for key, live in lives.items():
            hits = self.cache.hits_by_problem[live.input.id] - hits0[live.input.id] if self.cache is not None else 0
            computed[key] = max(0, items[key] - hits)
        total = sum(computed.values()) or 1
        for key, live in lives.items():
            m = live.metrics
            m.verifier_s += scored.wall_s
            m.scores_requested += items[key]
            m.scores_computed += computed[key]
            for b in scored.batches:
                m.ver_prompt_tokens += b.prompt_tokens * computed[key] // total
                m.ver_cached_tokens += b.cached_tokens * computed[key] // total
                m.ver_requests += b.num_requests * computed[key] // total

    # ---------------------------------------------------------------- selection

    def _settle(self) -> None:
        """Run the selection of every problem whose frontier is generated and scored."""
        again = True
        while again:
            again = False
            for live in list(self._lives):
                if not live.waiting and not live.to_score and not live.search.done:
                    self._select(live)
                    again = True

    def _select(self, live: _DLive) -> None:
        search, m = live.search, live.metrics
        m.iterations += 1
        if live.lengths:
            m.step_tokens_mean.append(sum(live.lengths) / len(live.lengths))
            m.step_tokens_max.append(max(live.lengths))
        live.lengths = []
        self.policy.select(search, m.elapsed())
        search.iteration += 1
        nodes, live.spec = live.spec, {}
        self._spec_exhausted = False
        self._event("select", live.input.id, search.iteration, [(b.uid, b.parent) for b in search.frontier])
        if not search.frontier:
            search.done = True
            self._lives.remove(live)
            self._done.append(live)
        else:
            jobs = self.ordering.order(self._jobs(live), lambda j: j.beam)
            live.waiting = {j.beam.uid for j in jobs}
            finished = []
            for job in jobs:
                node = nodes.get(job.beam.parent) if job.beam.parent is not None else None
                if node is not None and job.beam.seed == node.parent.seed and job.beam.depth == node.parent.depth:
                    del nodes[job.beam.parent]
                    work = self._adopt(live, node, job)
                else:
                    work = _Work(job, Kind.FRESH, live)
                if work is None:
                    continue  # the running speculative request became this job's
                if work.job.finished:
                    finished.append(work)
                else:
                    self._real.append(work)
            for work in finished:
                self._complete(work)
        for node in nodes.values():
            self._drop(live, node)

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
        if node.work is not None:
            self._running.pop(node.work.request_id, None)
            self.gen.abort([node.work.request_id])
            node.work = None
        self.dstats.spec_wasted += node.generated
        self.dstats.spec_dropped += 1
        self._event("drop", node.parent.uid, node.job.beam.uid, node.generated)

    # ------------------------------------------------------------------ reports

    def speculative_paths(self) -> set[tuple[str, tuple[str, ...]]]:
        """(problem id, path) of every speculative step held now, for checks and tests."""
        out = set()
        for live in self._lives:
            for node in live.spec.values():
                if node.job.tokens:
                    text = self.gen.decode(node.job.tokens)
                    out.add((live.input.id, node.parent.step_texts + (text,)))
        return out

    def committed_beams(self) -> list[Beam]:
        """The frontier beams of every problem in flight."""
        return [b for live in self._lives for b in live.search.frontier]

    def step_logs(self) -> dict[str, dict]:
        out = super().step_logs()
        out["decoupled"] = self.dstats.summary(self.gen_log, self.fill_policy, self.prm_cap)
        return out

    def _event(self, *event) -> None:
        if self.trace is not None:
            self.trace.append(event)


@dataclass
class _View:
    """The part of a problem in flight that `SyncEngine._jobs` reads."""

    search: object


__all__ = ["DecoupledEngine", "DecoupledStats", "Kind"]
