"""The model runner: the one place the engine talks to its two models.

It submits generation requests (the one submitter), runs generator steps and routes each
delta to its request (the one token loop's body), stops requests, and runs verifier calls
through the score cache. It is the one writer of a request's state: `submit`, `stop`,
`promote` (a kept child takes over its speculative step's backend request), `run_on` (a
finished step runs on as speculation), and a backend request's end in `step`; it knows
which of its requests run as speculation (`speculative`). A schedule's submits and stops
change the batch's bookkeeping at once and are written into the next step's plan
(`StepPlan`), which the schedule hands back with the step (`Generate`) and the runner runs
before it (`step`): the generator sees the changes only then. What each costs and
produces goes to the metrics collector as events; the schedules only decide what runs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence

from tts.backends.base import GenDelta, Generator, GenRequest, StepStats, Verifier
from tts.engine.messages import ResetPrefixCache, StepPlan, Stop
from tts.engine.requests import Request, RequestState
from tts.engine.scoring import ScoreItem, ScoringPhase, ScoringStats
from tts.metrics.collector import MetricsCollector
from tts.metrics.events import ModelTime, RequestAdded, ScoresMade, StepDone, TokensGenerated, TokensLate
from tts.token_hash import extend_hash

_request_ids = itertools.count()


class ModelRunner:
    """Runs generation requests and verifier calls for the engine (module docstring)."""

    def __init__(self, generator: Generator, scoring: ScoringPhase, collector: MetricsCollector,
                 temperature: float, top_p: float) -> None:
        self.gen = generator
        self.scoring = scoring
        self.collector = collector
        self.temperature = temperature
        self.top_p = top_p
        self.requests: dict[str, Request] = {}  # in the backend, by request id
        # those of them running as speculation, in the order they began to (oldest first)
        self.speculative: dict[str, Request] = {}
        self._plan = StepPlan()  # the batch's changes since the last step

    @property
    def verifier(self) -> Verifier | None:
        return self.scoring.verifier

    def free_slots(self) -> int:
        """The generator's batch slots no request holds: its batch cap less the requests in it."""
        return self.gen.batch_cap - len(self.requests)

    def submit(self, request: Request, max_tokens: int, prefix: Sequence[int] = (),
               speculative: bool = False) -> str:
        """Send the request to the generator (at the next step's plan): its beam's path plus
        `prefix` (tokens it already has), sampled with its beam's seed, for at most
        `max_tokens` tokens."""
        rid = f"r{next(_request_ids)}"
        request.request_id = rid
        request.state = RequestState.SPECULATIVE if speculative else RequestState.RUNNING
        request.counted_as = (request.problem_id, speculative, request.kind)
        self.requests[rid] = request
        if speculative:
            self.speculative[rid] = request
        beam = request.beam
        self._plan.calls.append(GenRequest(rid, beam.token_ids + tuple(prefix), max_tokens, beam.seed,
                                           self.temperature, self.top_p, prompt_key=extend_hash(beam.path_key, prefix),
                                           speculative=speculative))
        self.collector.emit(RequestAdded(request.problem_id, request.kind.value))
        return rid

    def take_plan(self) -> StepPlan:
        """The batch's changes since the last step (a schedule hands them back with it)."""
        plan, self._plan = self._plan, StepPlan()
        return plan

    def run(self, plan: StepPlan) -> None:
        """Make the plan's changes to the generator's batch, in order."""
        gen = self.gen
        for call in plan.calls:
            if isinstance(call, GenRequest):
                gen.add(call)
            elif isinstance(call, Stop):
                if late := gen.abort(call.request_ids):  # with overlap: tokens already in flight
                    self.collector.emit(TokensLate(late))
            else:
                gen.reset_prefix_cache()

    def flush(self) -> None:
        """Make the changes not handed back with a step now (the search ended)."""
        self.run(self.take_plan())

    def step(self, plan: StepPlan) -> tuple[list[tuple[Request, GenDelta, bool]], StepStats]:
        """One generator step after `plan`: each delta with its request and whether the
        request ran as speculation (deltas of requests stopped meanwhile are dropped; a
        request whose backend request ended is FINISHED), its tokens counted as speculative
        where it did (one `TokensGenerated` per problem, kind and speculative or not: a step
        at n=512 has 512 deltas, and the counts are sums)."""
        if self._plan.calls:
            raise RuntimeError("model runner: batch changes left out of the step's plan")
        self.run(plan)
        deltas, stats = self.gen.step()
        self.collector.emit(StepDone("generator", stats))
        out, made, requests = [], {}, self.requests
        for d in deltas:
            request = requests.get(d.request_id)
            if request is None:
                continue
            n = len(d.new_token_ids)
            request.generated += n
            key = request.counted_as
            counts = made.get(key)
            if counts is None:
                counts = made[key] = [0, None, 0]
            counts[0] += n
            if d.num_prompt_tokens is not None:  # a request's first delta
                counts[1] = (counts[1] or 0) + d.num_prompt_tokens
                counts[2] += d.num_cached_tokens or 0
            if d.finish_reason is not None:
                del requests[d.request_id]
                if key[1]:
                    del self.speculative[d.request_id]
                request.state = RequestState.FINISHED
            out.append((request, d, key[1]))
        for (problem_id, speculative, kind), (n, prompt, cached) in made.items():
            self.collector.emit(TokensGenerated(problem_id, n, speculative, prompt, cached, kind.value))
        return out, stats

    def stop(self, requests: Iterable[Request], state: RequestState = RequestState.ABORTED) -> None:
        """Abort the requests' backend requests (those still running), each left in `state`."""
        self.stop_each((request, state) for request in requests)

    def stop_each(self, stops: Iterable[tuple[Request, RequestState]]) -> None:
        """Abort the requests' backend requests (those still running) in one call (at the
        next step's plan), each left in its own state."""
        rids = []
        for request, state in stops:
            rid = request.request_id
            if rid is not None and self.requests.pop(rid, None) is not None:
                rids.append(rid)
                self.speculative.pop(rid, None)
            request.state = state
        if rids:
            self._plan.calls.append(Stop(rids))

    def reset_prefix_caches(self) -> None:
        """Empty both models' prefix caches: the verifier's now, the generator's in the plan
        (after the stops before it: a backend keeps a cache its requests hold)."""
        self._plan.calls.append(ResetPrefixCache())
        if self.verifier is not None:
            self.verifier.reset_prefix_cache()

    def promote(self, spec_step: Request, request: Request) -> None:
        """`request` (a kept child's) takes over the backend request of its speculative step
        `spec_step`, some tokens in: it runs on as the child's real request."""
        rid = spec_step.request_id
        self.requests[rid] = request
        del self.speculative[rid]
        request.request_id, request.state = rid, RequestState.RUNNING
        request.counted_as = (request.problem_id, False, request.kind)

    def run_on(self, request: Request) -> None:
        """A running real request whose step ended runs on in its backend request: what it
        generates from now on is speculation (the newest of it)."""
        request.state = RequestState.SPECULATIVE
        request.counted_as = (request.problem_id, True, request.kind)
        self.speculative[request.request_id] = request

    def stop_all(self) -> None:
        """Abort every request still in the backend."""
        self.stop(list(self.requests.values()))

    def score(self, items: Sequence[ScoreItem], order: Callable[[list[ScoreItem]], list[ScoreItem]],
              charge: Iterable[str], purpose: str = "select") -> ScoringStats:
        """One verifier call for `purpose`; its wall time is charged to the problems in `charge`."""
        scored = self.scoring.run(items, order=order)
        for batch in scored.batches:
            for s in batch.step_stats:
                self.collector.emit(StepDone("verifier", s))
        self.collector.emit(ModelTime("verifier", tuple(charge), scored.wall_s))
        self.collector.emit(ScoresMade(scored.by_problem, tuple(scored.batches), purpose, len(items)))
        return scored
