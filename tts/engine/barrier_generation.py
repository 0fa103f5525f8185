"""The barrier schedule's generation: one step for every request of an iteration, with
FlashTTS's speculative extension filling the slots of requests that finished early.

The backend never stops at a step boundary; the step rule (`StepCutter`) ends each
request's step at "\\n\\n", EOS or its token limit, and then the request is stopped or,
with speculation on, speculates in one of two ways:

- run-on (the paper's Algorithm 1): the request runs on past the boundary; the extra
  tokens become the beam's speculative tokens, which selection hands down to the
  original child in full and to duplicates truncated (`speculation.inherit_speculation`);
- branches (`spec_branches`): the request's step is committed to its beam as it
  finishes, the request stops, and up to `spec_priority` speculative steps start on the
  committed path: branch k is the very request child k would send (child k's seed, the
  next iteration's limits), a speculative step as the decoupled schedule's are, with the
  same start, cap and preemption (`spec_steps.SpeculativeSteps`); only the start rule is
  the barrier's (the highest score bins first, child 0 before duplicates). When generation ends the
  branches wait for selection (a running one holds its KV, no tokens are generated while
  the verifier runs), and in the next iteration child k adopts its own (whole, promoted
  to its request, or its start); branches of children selection did not choose are
  dropped. The tree is the one without speculation (on vLLM, up to its batch-dependent
  numerics, which move P's trees too), whatever the sampler. Run-on gives that too for
  child 0 (with R = 0, preset `PMS_exact`) only where sampling is resumable: with the
  position-keyed sampler on vLLM (`generator.sampler=position`, the default), not with
  vLLM's own, where a request that runs past a boundary, or one resumed from some of its
  tokens, samples differently from a fresh request with the same seed.

Real work always has priority (two-phase scheduling): speculation takes only the slots
real requests leave free. Memory pressure stops it by the rule the decoupled schedule
follows too (`memory_guard.py`: KV usage at `kv_spec_limit`, or requests queued in the
backend two steps running, then a pause): every speculative request is dropped (a run-on
request resumes from its tokens when slots free again; a branch resumes from its tokens
where sampling is resumable, else restarts from its path). Generation ends when every real
request has its step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tts.backends.base import GenDelta, StepStats
from tts.engine.memory_guard import MemoryGuard
from tts.engine.model_runner import ModelRunner
from tts.engine.options import KV_SPEC_LIMIT
from tts.engine.requests import Request, RequestKind, RequestState
from tts.engine.schedule import Problem
from tts.engine.spec_steps import SpeculativeSteps, step_tokens
from tts.engine.steps import StepCutter, completes_path
from tts.search.tree import Beam

_WAITING, _FINISHED = RequestState.WAITING, RequestState.FINISHED


class IterationGeneration:
    """Runs an iteration's requests on the generator until every one has its step:
    `begin`, then `advance` with each generator step's output while `active`, then `end`.
    `complete(request)` commits a request's step to its beam as soon as the step is whole
    (the schedule's `Schedule.complete`); a branch forks the committed beam, a speculative
    step (`spec_steps.SpeculativeSteps`) made by `requests_for(problem, beams, iteration)`."""

    def __init__(self, runner: ModelRunner, cut: StepCutter, complete: Callable[[Request], None],
                 requests_for: Callable[[Problem, list[Beam], int], list[Request]], speculative: bool = False,
                 spec_max_tokens: int = 0, kv_spec_limit: float = KV_SPEC_LIMIT, spec_batch_cap: int = 0,
                 spec_branches: bool = False) -> None:
        self.runner = runner
        self.gen = runner.gen
        self.cut = cut
        self.complete = complete
        self.spec_branches = speculative and spec_branches
        self.speculative = speculative
        self.spec_max_tokens = spec_max_tokens
        self.steps = SpeculativeSteps(runner, cut, requests_for, spec_max_tokens, kv_spec_limit)
        # Speculation may keep at most this many requests running (real + speculative);
        # 0 = the generator's batch cap. Beyond the decode roofline's ridge batch every
        # extra sequence slows the stragglers, so the engine passes that batch here.
        self.spec_batch_cap = spec_batch_cap
        # branches mode: the branches live in their problem's table of speculative steps
        # (`Problem.spec`, the decoupled schedule's too); after generation the next
        # iteration's kept children take theirs over (`spec_steps.take_over`), the others
        # are dropped. The problems whose tables hold branches, by id:
        self._tables: dict[str, Problem] = {}
        self._parents: list[Request] = []  # finished steps whose children branch, in finish order
        self._pruned: set[int] = set()  # their beams whose speculation pruning stopped
        self._requests: list[Request] = []
        self._pending: set[Request] = set()  # real requests without their step
        self._speculating: dict[Request, int] = {}  # running run-on request -> priority
        self._awaiting_slot: dict[int, Request] = {}  # run-on: finished steps waiting for a speculative slot, by beam uid

    @property
    def memory(self) -> MemoryGuard:
        """The one memory rule of speculation (`memory_guard.py`)."""
        return self.steps.memory

    @property
    def active(self) -> bool:
        """Some request still lacks its step."""
        return bool(self._pending)

    def begin(self, requests: Sequence[Request]) -> None:
        """Send each request; a request that adopted a whole step branches at once (the
        slots real work leaves free are idle from the start)."""
        self._requests = list(requests)
        self._pending, self._speculating, self._awaiting_slot = set(), {}, {}
        self._start(self._requests)
        self._parents = [r for r in self._requests if r.finished and self.spec_branches and self._may_speculate(r)]
        self._pruned = set()
        if self._pending:
            self._start_branches()

    def advance(self, outputs: list[tuple[Request, GenDelta]], step: StepStats) -> None:
        """Take one generator step's output: cut steps, start and stop speculation."""
        finished_now: list[Request] = []
        stops: list[tuple[Request, RequestState]] = []
        for request, d in outputs:
            if request.kind is RequestKind.SPEC:
                if self._take_branch_delta(request, d):
                    stops.append((request, _FINISHED))
            elif self._take_delta(request, d):
                speculate = self._may_speculate(request)
                if speculate and self.spec_branches:
                    self._parents.append(request)
                if d.finished:
                    request.state = _FINISHED
                elif speculate and not self.spec_branches:
                    finished_now.append(request)
                else:
                    stops.append((request, _FINISHED))
        self.memory.observe(step)
        stops += self._preempt_speculation()
        if self._pending and self.memory.allows():
            if self.spec_branches:
                self._start_branches()
            else:
                stops += self._assign_slots(finished_now)
        else:  # real work only: memory is short, or speculation pauses after it was
            self._awaiting_slot.update((r.beam.uid, r) for r in finished_now)
            stops += [(r, _WAITING) for r in finished_now]
        self._stop(stops)

    def running(self) -> list[Request]:
        """The real requests still decoding their step."""
        return list(self._pending)

    def speculating(self) -> bool:
        """Some speculation runs or waits for a slot."""
        return bool(self._speculating or self._awaiting_slot or self._branches_running() or self._waiting_branches())

    def stop_speculating(self, beams: set[int]) -> int:
        """Speculation pruning: these beams' finished steps cannot make selection's cut, so
        their speculation stops (running requests stop, waiting ones lose their claim: their
        steps are finished, so nothing claims a slot for them again this iteration); the slots
        go to the others from the next step. Returns how many speculative requests stopped or
        left the queue."""
        stops = [r for r in self._speculating if r.beam.uid in beams]
        for r in stops:
            del self._speculating[r]
        stops += [b for b in self._branches_running() if b.beam.parent in beams]
        queued = [uid for uid in beams if uid in self._awaiting_slot]
        for uid in queued:
            del self._awaiting_slot[uid]
        queued += [k for r, k in self._waiting_branches() if r.beam.uid in beams]
        self._pruned |= beams
        self._stop([(r, _FINISHED) for r in stops])
        return len(stops) + len(queued)

    def reject(self, requests: Sequence[Request]) -> None:
        """Early rejection: stop these requests; their beams get no step this iteration."""
        self._pending.difference_update(requests)
        self.runner.stop(requests)

    def end(self) -> None:
        """Every request has its step: the branches wait for selection (a kept child adopts
        its own, a running one goes on running), running run-ons stop."""
        if not self.spec_branches and self._speculating:
            self.runner.stop(list(self._speculating), _FINISHED)
        self._speculating = {}

    def release(self) -> None:
        """Stop the branch requests no child adopted (the search ended)."""
        self._drop_tables()

    def _drop_tables(self) -> None:
        """Drop the branches still in the tables (no kept child took them over)."""
        for p in self._tables.values():
            self.steps.drop_table(p)
        self._tables = {}

    def _stop(self, stops: list[tuple[Request, RequestState]]) -> None:
        """Stop backend requests in one call, each left in its state."""
        if stops:
            self.runner.stop([r for r, _ in stops])
            for request, state in stops:
                request.state = state

    # ------------------------------------------------------------ real requests

    def _start(self, requests: Sequence[Request]) -> None:
        """Send each request: a kept child takes over its branch, or starts from its beam's
        speculative tokens (`SpeculativeSteps.take_over_all`); one that may speculate by
        running on asks for `spec_max_tokens` more than its step."""
        running, to_send = self.steps.take_over_all(requests, self.complete)
        self._pending.update(running)
        self._drop_tables()  # branches of problems that ended
        for request in to_send:
            budget = request.limit - len(request.tokens)
            run_on = self.speculative and not self.spec_branches and request.spec_priority > 0 and not request.to_eos
            self.runner.submit(request, budget + (self.spec_max_tokens if run_on else 0), request.tokens)
            self._pending.add(request)

    def _take_delta(self, request: Request, d: GenDelta) -> bool:
        """Apply one delta of a real request; True when it finished the request's step."""
        if request in self._speculating:
            request.spec.extend(d.new_token_ids)  # a final EOS is kept: the next step ends there
            if d.finished:
                self._speculating.pop(request, None)
                request.state = _FINISHED
            return False
        overflow = self.cut.take(request, d)
        if not request.finished or request not in self._pending:
            return False
        self._pending.discard(request)
        if not self.spec_branches:  # tokens of a run-on past the step are speculative
            request.spec.extend(overflow)
        self.complete(request)
        return True

    def _may_speculate(self, request: Request) -> bool:
        """Speculation on a finished step: not past EOS, nor past a step with a boxed
        answer, which completes the path (no child would use what it generated)."""
        return (self.speculative and request.spec_priority > 0 and not request.to_eos
                and not completes_path(request, self.gen.decode))

    # ------------------------------------------------------------ speculation

    def _take_branch_delta(self, branch: Request, d: GenDelta) -> bool:
        """Apply one delta of a branch; True when its step ended before its request did. A
        branch stopped at its speculative cap holds part of a step (`stalled`)."""
        self.cut.take(branch, d)
        if branch.finished or d.finished:
            if d.finished:
                branch.state = _FINISHED
            self.steps.stopped(branch)
        return branch.finished and not d.finished

    def branches_of(self, request: Request) -> list[Request]:
        """The branches of a request's finished step, child 0 first."""
        return [b for (uid, _), b in request.problem.spec.items() if uid == request.beam.uid]

    def _branches_running(self) -> list[Request]:
        """The branches running in the backend (not those whose step just ended)."""
        return [b for b in self.steps.running() if not b.finished]

    def _waiting_branches(self) -> list[tuple[Request, int]]:
        """(finished request, child k) of the branches not running: new, or stopped short
        and resumable; the highest priority bins first, child 0 before duplicates."""
        out = [(r, k) for r in self._parents if r.beam.uid not in self._pruned for k in range(r.spec_priority)
               if self.steps.speculable(r.problem, r.beam, k)]
        return sorted(out, key=lambda c: (-c[0].spec_priority, c[1]))

    def _start_branches(self) -> None:
        """Free slots go to the waiting branches (`_waiting_branches`); branch k is child k's
        speculative step on its parent's committed path (`SpeculativeSteps.start`)."""
        free = self._spec_batch() - len(self._pending) - len(self._branches_running())
        for request, k in self._waiting_branches():
            if free <= 0:
                return
            self._tables[request.problem.id] = request.problem
            free -= self.steps.start(request.problem, request.beam, k)

    def branch_steps(self, request: Request) -> dict[int, tuple[int, ...]]:
        """The branches' steps by child seed, as a child would start from them (a final EOS
        kept): the finished ones; where sampling is resumable, also those stopped short
        (preempted, at their cap). Not the running ones, which a kept child takes over.
        What the barrier's lookahead reads of child 0's step."""
        mine = self.branches_of(request)
        steps = {b.beam.seed: step_tokens(self.runner, b) for b in mine if b.finished}
        if self.gen.resumable_sampling:
            steps.update((b.beam.seed, tuple(b.tokens)) for b in mine
                         if not b.finished and b.tokens and not b.state.in_backend)
        return steps

    def _assign_slots(self, finished_now: list[Request]) -> list[tuple[Request, RequestState]]:
        """Speculative slots go to the highest priority bins first. A request that just
        finished its step runs on in place; one awaiting a slot (finished while none
        was free) restarts from its path, served from the prefix cache. Returns the requests
        to stop."""
        free = self._spec_batch() - len(self._pending) - len(self._speculating)
        cands = [(r.spec_priority, 1, r) for r in finished_now]
        cands += [(r.spec_priority, 0, r) for r in self._awaiting_slot.values()]
        cands.sort(key=lambda c: (-c[0], -c[1]))
        stops = []
        for prio, running, request in cands:
            if free > 0:
                if running:
                    self._speculating[request] = prio
                    request.state = RequestState.SPECULATIVE
                    free -= 1
                else:
                    del self._awaiting_slot[request.beam.uid]
                    budget = self.spec_max_tokens - len(request.spec)
                    if budget > 0:  # a request whose speculation is spent takes no slot
                        self.runner.submit(request, budget, request.spec, speculative=True)
                        self._speculating[request] = prio
                        free -= 1
            elif running:
                stops.append((request, _WAITING))
                self._awaiting_slot[request.beam.uid] = request
        return stops

    def _spec_batch(self) -> int:
        """Requests kept running while speculating: `spec_batch_cap` (0 = the batch cap),
        never above the generator's batch cap (M may lower it below the ridge batch): a
        request beyond it would wait in the backend, which preempts speculation (`memory`)."""
        return min(self.spec_batch_cap or self.gen.batch_cap, self.gen.batch_cap)

    def _preempt_speculation(self) -> list[tuple[Request, RequestState]]:
        """Stop every speculative request when memory is short (`memory`): a run-on goes
        back to wait for a slot and resumes from its speculative tokens; a branch waits
        again, from its tokens where sampling is resumable (`SpeculativeSteps.preempt`)."""
        branches = self._branches_running()
        if not ((self._speculating or branches) and self.memory.short()):
            return []
        self.memory.preempted()
        self.steps.preempt(branches)
        dropped = list(self._speculating)
        self._speculating.clear()
        self._awaiting_slot.update((r.beam.uid, r) for r in dropped)
        return [(r, _WAITING) for r in dropped]
