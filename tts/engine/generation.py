"""The generation phase: one step for every job, driven token by token.

The backend never stops at a step boundary; this module feeds the streamed tokens to the
step rule (`tts.engine.steps.StepCutter`), which ends each job's step at "\\n\\n", EOS or
its token limit, and then either aborts the request or, with speculation on, speculates in
one of two ways:

- run-on (the paper's Algorithm 1): the request runs on past the boundary; the extra
  tokens become the beam's speculative tokens, which selection hands down to the
  original child in full and to duplicates truncated (`speculation.hand_down`);
- branches (`spec_branches`): the request stops and up to `spec_priority` new requests
  start from the finished path, branch k with child k's seed (`child_seed`) and the next
  step's boundary rule. Branch k is the very request child k would send: a finished
  branch becomes child k's step, and a branch still running when the phase ends waits
  (it holds its KV, no tokens are generated while the verifier runs) and becomes child
  k's request in the next phase; branches of beams selection did not keep are aborted.
  The tree is the one without speculation (on vLLM, up to its batch-dependent
  numerics, which move P's trees too), whatever the sampler. Run-on gives that too
  for child 0 (with R = 0, preset `PMS_exact`) only where sampling is resumable: with
  the position-keyed sampler on vLLM (`generator.sampler=position`, the default), not
  with vLLM's own, where a request that runs past a boundary, or one resumed from some
  of its tokens, samples differently from a fresh request with the same seed.

Real work always has priority (two-phase scheduling): a request may only speculate while
no real request waits, and speculation is dropped at once when the KV cache runs short
(a dropped run-on request resumes from its tokens when slots free again; a dropped branch
restarts from its path). The phase ends when every real job has its step.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tts.backends.base import Generator, GenRequest, StepStats
from tts.engine.steps import GenJob, StepCutter
from tts.search.tree import StepEnd, child_seed, has_answer

_request_ids = itertools.count()


@dataclass
class PhaseStats:
    """What a generation phase cost and did."""

    wall_s: float = 0.0
    steps: list[StepStats] = field(default_factory=list)
    tokens: int = 0  # tokens produced by the backend, speculative included
    spec_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    requests: int = 0
    step_lengths: list[int] = field(default_factory=list)  # real tokens per job
    by_problem: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))

    def add(self, problem_id: str, **counts: int) -> None:
        """Add to the phase's counters and to the problem's share of them."""
        for key, n in counts.items():
            setattr(self, key, getattr(self, key) + n)
            self.by_problem[problem_id][key] += n


class GenerationPhase:
    """Runs jobs on a generator until every job has its step."""

    def __init__(self, generator: Generator, temperature: float, top_p: float,
                 speculative: bool = False, spec_max_tokens: int = 0,
                 kv_spec_limit: float = 0.95, spec_batch_cap: int = 0, spec_branches: bool = False,
                 step_max_tokens: int = 0, cut: StepCutter | None = None) -> None:
        self.gen = generator
        self.cut = cut or StepCutter(generator)  # the step rule (the engine's, when it has one)
        # a branch that stops at its cap (`spec_max_tokens`) below this limit holds part of a step
        self.step_max_tokens = step_max_tokens or spec_max_tokens
        self.spec_branches = speculative and spec_branches
        self.temperature = temperature
        self.top_p = top_p
        self.speculative = speculative
        self.spec_max_tokens = spec_max_tokens
        self.kv_spec_limit = kv_spec_limit
        # branches mode: branch requests still running when a phase ended, by (parent uid,
        # child seed); the next phase hands each to its child, and aborts the others
        self.carried: dict[tuple[int, int], tuple[str, GenJob]] = {}
        # Speculation may keep at most this many requests running (real + speculative);
        # 0 = the generator's batch cap. Beyond the decode roofline's ridge batch every
        # extra sequence slows the stragglers, so the engine passes that batch here.
        self.spec_batch_cap = spec_batch_cap

    def run(self, jobs: Sequence[GenJob], on_step: Callable[[StepStats], None] | None = None) -> PhaseStats:
        stats, start = PhaseStats(), time.perf_counter()
        self._by_id: dict[str, GenJob] = {}
        self._start(jobs, stats)
        pending = set(self._by_id)  # real work not finished
        speculating: dict[str, int] = {}  # request id -> speculative priority
        parked: dict[int, GenJob] = {}  # run-on: finished jobs waiting for a speculative slot
        # branches mode: branches waiting for a slot; a job that adopted a whole step
        # branches at once (the slots real work leaves free are idle from the start)
        branches = [b for job in jobs if job.finished and self.spec_branches and self._may_speculate(job)
                    for b in self._branches(job)]
        if pending:
            self._start_branches(branches, pending, speculating, stats)
        while pending:
            deltas, step = self.gen.step()
            stats.steps.append(step)
            if on_step:
                on_step(step)
            finished_now: list[str] = []
            aborts = []
            for d in deltas:
                job = self._by_id[d.request_id]
                if job.branch_of is not None:
                    if self._take_branch_delta(job, d, stats, speculating):
                        aborts.append(d.request_id)
                elif self._take_delta(d, stats, pending, speculating):
                    speculate = self._may_speculate(job)
                    if speculate and self.spec_branches:
                        branches += self._branches(job)
                    if d.finished:
                        continue
                    if speculate and not self.spec_branches:
                        finished_now.append(d.request_id)
                    else:
                        aborts.append(d.request_id)
            aborts += self._preempt_speculation(speculating, step, branches, parked)
            if pending and not self._preempted(step):
                if self.spec_branches:
                    self._start_branches(branches, pending, speculating, stats)
                else:
                    aborts += self._assign_slots(finished_now, parked, pending, speculating, stats)
            else:  # phase 1 only: real work waits, or the KV cache is short
                parked.update((self._by_id[r].beam.uid, self._by_id[r]) for r in finished_now)
                aborts += finished_now
            if aborts:
                self.gen.abort(aborts)
        if self.spec_branches:  # running branches wait for selection: a kept child takes one over
            self.carried = {(b.branch_of.beam.uid, b.beam.seed): (rid, b)
                            for rid in speculating if (b := self._by_id[rid]).branch_of is not None}
        elif speculating:
            self.gen.abort(list(speculating))
        for job in jobs:
            stats.step_lengths.append(len(job.tokens) - job.adopted)
        stats.wall_s = time.perf_counter() - start
        return stats

    def _start(self, jobs: Sequence[GenJob], stats: PhaseStats) -> None:
        """Send each job's request: a child takes over its running branch, a job starts
        from its beam's speculative tokens, and one that may speculate by running on
        asks for `spec_max_tokens` more than its step."""
        carried, self.carried = self.carried, {}
        for job in jobs:
            if self._take_over(job, carried.pop((job.beam.parent, job.beam.seed), None)):
                continue
            self._adopt_spec(job)
            if not job.finished:
                budget = job.limit - len(job.tokens)
                run_on = self.speculative and not self.spec_branches and job.spec_priority > 0 and not job.to_eos
                self._submit(job, tuple(job.tokens), budget + (self.spec_max_tokens if run_on else 0), stats)
        if carried:  # branches of beams that selection did not keep
            self.gen.abort([rid for rid, _ in carried.values()])

    def _submit(self, job: GenJob, extra_prompt: tuple[int, ...], max_tokens: int, stats: PhaseStats) -> str:
        rid = f"g{next(_request_ids)}"
        job.request_id = rid
        self._by_id[rid] = job
        self.gen.add(GenRequest(rid, job.beam.token_ids + extra_prompt, max_tokens, job.beam.seed,
                                self.temperature, self.top_p))
        stats.add(job.beam.problem_id, requests=1)
        return rid

    @staticmethod
    def _count(job: GenJob, d, stats: PhaseStats) -> None:
        pid = job.beam.problem_id
        if d.num_prompt_tokens is not None:
            stats.add(pid, prompt_tokens=d.num_prompt_tokens, cached_tokens=d.num_cached_tokens or 0)
        stats.add(pid, tokens=len(d.new_token_ids))

    def _take_delta(self, d, stats: PhaseStats, pending: set[str], speculating: dict[str, int]) -> bool:
        """Apply one delta of a real request; True when it finished the job's step."""
        job = self._by_id[d.request_id]
        self._count(job, d, stats)
        if d.request_id in speculating:
            job.spec.extend(d.new_token_ids)  # a final EOS is kept: the next step ends there
            stats.add(job.beam.problem_id, spec_tokens=len(d.new_token_ids))
            if d.finished:
                speculating.pop(d.request_id, None)
            return False
        overflow = self.cut.consume(job, d.new_token_ids, d.finish_reason)
        if not job.finished or d.request_id not in pending:
            return False
        pending.discard(d.request_id)
        if not self.spec_branches:  # tokens of a run-on past the step are speculative
            job.spec.extend(overflow)
        return True

    def _take_branch_delta(self, branch: GenJob, d, stats: PhaseStats, speculating: dict[str, int]) -> bool:
        """Apply one delta of a speculative branch; True when its step ended before its request."""
        self._count(branch, d, stats)
        stats.add(branch.beam.problem_id, spec_tokens=len(d.new_token_ids))
        self.cut.consume(branch, d.new_token_ids, None)  # a request cut at its cap is partial, not ended
        if branch.finished or d.finished:
            speculating.pop(d.request_id, None)
        return branch.finished and not d.finished

    def _take_over(self, job: GenJob, carried: tuple[str, GenJob] | None) -> bool:
        """Child job takes over its branch's running request: the same request the job
        would send (path, seed), already some tokens in. True when the job is settled
        (its step ended within the branch's tokens, or it runs on the branch's request)."""
        if carried is None:
            return False
        rid, branch = carried
        if job.to_eos or job.split or branch.limit < job.limit or job.beam.spec_tokens:
            self.gen.abort([rid])  # the request would stop short of the job's end
            return False
        self.cut.consume(job, branch.tokens, None)
        job.adopted = len(job.tokens)
        if job.finished:
            self.gen.abort([rid])
        else:
            job.request_id = rid
            self._by_id[rid] = job
        return True

    def release(self) -> None:
        """Abort the branch requests no child took over (the search ended)."""
        if self.carried:
            self.gen.abort([rid for rid, _ in self.carried.values()])
            self.carried = {}

    def _branches(self, job: GenJob) -> list[GenJob]:
        """Branch k of a finished job: child k's next step (child k's seed, the same path)."""
        for k in range(job.spec_priority):
            shadow = job.beam.fork(child_seed(job.beam.seed, k))
            job.branches.append(GenJob(shadow, self.spec_max_tokens, spec_priority=job.spec_priority,
                                       branch_of=job))
        return list(job.branches)

    def _start_branches(self, waiting: list[GenJob], pending: set[str], speculating: dict[str, int],
                        stats: PhaseStats) -> None:
        """Free slots go to the highest priority bins first, child 0 before duplicates.
        A branch starts from its parent's finished path; a preempted one resumes from its
        tokens where sampling is resumable, and was reset to none otherwise."""
        cap = self._spec_cap()
        free = cap - len(pending) - len(speculating)
        if free <= 0 or not waiting:
            return
        waiting.sort(key=lambda b: (-b.spec_priority, b.branch_of.branches.index(b)))
        while free > 0 and waiting:
            branch = waiting.pop(0)
            prompt = tuple(branch.branch_of.tokens) + tuple(branch.tokens)
            budget = branch.limit - len(branch.tokens)
            speculating[self._submit(branch, prompt, budget, stats)] = branch.spec_priority
            free -= 1

    def branch_steps(self, job: GenJob) -> dict[int, tuple[int, ...]]:
        """The finished branches' steps by child seed, as children adopt them (a final EOS
        kept). Running ones are taken over by their child (`carried`). A branch cut short
        (preempted, waiting for a slot) is handed down as the start of its child's step
        where sampling is resumable: the child's request samples the rest exactly; not
        otherwise, where that request would sample other tokens after it."""
        eos = (self.gen.eos_token_id,)
        steps = {b.beam.seed: tuple(b.tokens) + (eos if b.end is StepEnd.EOS else ())
                 for b in job.branches if self._whole_step(b)}
        if self.gen.resumable_sampling:
            steps.update((b.beam.seed, tuple(b.tokens)) for b in job.branches
                         if not self._whole_step(b) and b.tokens and (job.beam.uid, b.beam.seed) not in self.carried)
        return steps

    def _whole_step(self, branch: GenJob) -> bool:
        """The branch ended as its step does: not cut at a speculation cap below the step limit."""
        capped = branch.end is StepEnd.STEP_LIMIT and branch.limit < self.step_max_tokens
        return branch.finished and not capped

    def _assign_slots(self, finished_now: list[str], parked: dict[int, GenJob], pending: set[str],
                      speculating: dict[str, int], stats: PhaseStats) -> list[str]:
        """Speculative slots go to the highest priority bins first. A request that just
        finished its step runs on in place; a parked one (finished while no slot was
        free) restarts from its path, served from the prefix cache. Returns aborts."""
        cap = self._spec_cap()
        free = cap - len(pending) - len(speculating)
        cands = [(self._by_id[r].spec_priority, 1, r) for r in finished_now]
        cands += [(job.spec_priority, 0, uid) for uid, job in parked.items()]
        cands.sort(key=lambda c: (-c[0], -c[1]))
        aborts = []
        for prio, running, key in cands:
            if free > 0:
                if running:
                    speculating[key] = prio
                    free -= 1
                else:
                    job = parked.pop(key)
                    budget = self.spec_max_tokens - len(job.spec)
                    if budget > 0:  # a job whose speculation is spent takes no slot
                        speculating[self._submit(job, tuple(job.tokens) + tuple(job.spec), budget, stats)] = prio
                        free -= 1
            elif running:
                aborts.append(key)
                parked[self._by_id[key].beam.uid] = self._by_id[key]
        return aborts

    def _spec_cap(self) -> int:
        """Requests kept running while speculating: `spec_batch_cap` (0 = the batch cap),
        never above the generator's batch cap (M may lower it below the ridge batch): a
        request beyond it would wait in the backend, which preempts all speculation."""
        return min(self.spec_batch_cap or self.gen.batch_cap, self.gen.batch_cap)

    def _preempted(self, step: StepStats) -> bool:
        """Speculation stops at once when real requests wait or the KV cache runs short."""
        return step.kv_usage >= self.kv_spec_limit or step.num_waiting > 0

    def _adopt_spec(self, job: GenJob) -> None:
        """Start from the beam's speculative tokens; they may already hold the whole step."""
        if self.spec_branches and job.to_eos and not self.gen.resumable_sampling:
            job.beam.spec_tokens = ()  # a request to EOS past a branch's step end would sample on differently
            return
        self.cut.adopt(job)

    def _may_speculate(self, job: GenJob) -> bool:
        """Speculation on a finished step: not past EOS, nor past a step with a boxed
        answer, which completes the path (no child would use what it generated)."""
        return (self.speculative and job.spec_priority > 0 and not job.to_eos and job.end is not StepEnd.EOS
                and not has_answer(self.gen.decode(job.tokens)))

    def _preempt_speculation(self, speculating: dict[str, int], step: StepStats,
                             branches: list[GenJob], parked: dict[int, GenJob]) -> list[str]:
        """Drop every speculative request when real work waits or KV runs short; each goes
        back to wait for a slot (a run-on job resumes from its speculative tokens)."""
        if speculating and self._preempted(step):
            dropped = list(speculating)
            speculating.clear()
            for r in dropped:
                b = self._by_id[r]
                if b.branch_of is None:
                    parked[b.beam.uid] = b
                elif not b.finished:
                    if not self.gen.resumable_sampling:
                        # from scratch: a request resumed from its tokens would sample differently
                        b.tokens, b.last_char = [], ""
                    branches.append(b)
            return dropped
        return []

