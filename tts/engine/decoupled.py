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
   generated but not yet through selection, the step one of its children would
   generate: a request on the same path with that child's seed and the next iteration's
   limits; by default only for the beams selection would keep on the scores known so
   far, `optim.decoupled_spec_scope`).

Speculative steps, their adoption by the children that selection keeps, their dropping
(counted as wasted) and preemption are in `decoupled_spec.py`; the run's counters and
the step-log summary in `decoupled_stats.py`.

Not used here: `options.speculative` and `options.lookahead` (FlashTTS's run-on
speculation and lookahead scoring); speculation is what the fill policy does, and the
PRM never sees a speculative step. `options.score_cache` still lets beams with equal
paths share a score.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator

from tts.backends.base import FinishReason, Generator, GenRequest, Verifier
from tts.config.schema import DecoupledSpecScope, EngineKind, OptimConfig
from tts.engine.base import EngineBase, EngineOptions, ProblemInput, ProblemOutcome
from tts.engine.decoupled_policy import EAGER_FIRST, Filler, FillPolicy, FillState, make_fill_policy
from tts.engine.decoupled_spec import SpeculationMixin
from tts.engine.decoupled_stats import DecoupledStats, account_prm
from tts.engine.decoupled_work import Kind, _DLive, _Work
from tts.engine.scoring import ScoreItem
from tts.search.base import SearchPolicy
from tts.search.tree import Beam

_request_ids = itertools.count()


class DecoupledEngine(SpeculationMixin, EngineBase):
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
        self.spec_survivors = DecoupledSpecScope(self.optim.decoupled_spec_scope) is DecoupledSpecScope.survivors
        self.prm_cap = max(0, self.optim.verifier_batch_size)
        # speculative tokens per beam: `spec_max_tokens`, 0 meaning one step's limit
        self._init_speculation(max(0, options.spec_max_tokens) or self.policy.step_max_tokens, kv_spec_limit)
        self.round_steps = max(1, round_steps or self.policy.step_max_tokens)
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

    def _admit(self) -> None:
        p = self._queue.popleft()
        if not self._lives and not self._running:  # nothing in flight: start it cold
            self._fresh_caches()
        item = self._start(p)
        live = _DLive(item.input, item.search, item.metrics, item.rng, order=next(self._order))
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
                self._spec_generated(work, n)
            finish = d.finish_reason
            if finish is FinishReason.LENGTH and work.capped:
                finish = None  # the speculative cap, not the step's limit
            self.cut.consume(job, d.new_token_ids, finish)
            if not (job.finished or d.finished):
                continue
            del self._running[d.request_id]
            if not d.finished:
                aborts.append(d.request_id)
            if work.kind is Kind.SPEC:
                self._spec_stopped(work)
            else:
                self._complete(work)
        if aborts:
            self.gen.abort(aborts)
        self._relieve_memory()
        self._settle()

    def _complete(self, work: _Work) -> None:
        """A real job has its step: commit it to the beam and queue its score."""
        job, live = work.job, work.live
        beam = job.beam
        total_left = self.policy.max_total_tokens - beam.num_tokens
        for step in self.cut.steps(job, total_left):
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
        account_prm(batch, scored, hits0, self.cache)
        requeue = []
        for (live, beam), item, b0 in zip(batch, items, before):
            self._event("prm", live.input.id, beam.uid, item.indices[0], b0, beam.last_scored, beam.step_texts)
            if self._next_index(live, beam) is not None:
                requeue.append((live, beam))
            else:
                live.to_score -= 1
        self._prm.extendleft(reversed(requeue))
        self._spec_exhausted = False  # new scores change which beams look like survivors
        self._settle()
        return True

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
        self._count_iteration(m)
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
                work = self._work_for(live, nodes, job)
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

    # ------------------------------------------------------------------ reports

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


__all__ = ["DecoupledEngine", "DecoupledStats", "Kind"]
