"""The model runner: the one place the engine talks to its two models.

It submits generation requests (the one submitter), runs generator steps and routes each
delta to its request (the one token loop's body), stops requests, and runs verifier calls
through the score cache. What each costs and produces goes to the metrics collector as
events; the schedules only decide what runs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence

from tts.backends.base import GenDelta, Generator, GenRequest, StepStats, Verifier
from tts.engine.requests import Request, RequestState
from tts.engine.scoring import ScoreItem, ScoringPhase, ScoringStats
from tts.metrics.collector import MetricsCollector
from tts.metrics.events import ModelTime, RequestAdded, ScoresMade, StepDone, TokensGenerated, TokensLate
from tts.token_hash import extend_hash

_request_ids = itertools.count()
SPECULATIVE_PREFIX = "s"  # the ids of requests sent as speculation start with it (a run's trace reads it)


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

    @property
    def verifier(self) -> Verifier | None:
        return self.scoring.verifier

    def free_slots(self) -> int:
        """The generator's batch slots no request holds: its batch cap less the requests in it."""
        return self.gen.batch_cap - len(self.requests)

    def submit(self, request: Request, max_tokens: int, prefix: Sequence[int] = (),
               speculative: bool = False) -> str:
        """Send the request to the generator: its beam's path plus `prefix` (tokens it
        already has), sampled with its beam's seed, for at most `max_tokens` tokens."""
        rid = f"{SPECULATIVE_PREFIX if speculative else 'r'}{next(_request_ids)}"
        request.request_id = rid
        request.state = RequestState.SPECULATIVE if speculative else RequestState.RUNNING
        self.requests[rid] = request
        beam = request.beam
        self.gen.add(GenRequest(rid, beam.token_ids + tuple(prefix), max_tokens, beam.seed, self.temperature,
                                self.top_p, prompt_key=extend_hash(beam.path_key, prefix)))
        self.collector.emit(RequestAdded(request.problem_id, request.kind.value))
        return rid

    def step(self) -> tuple[list[tuple[Request, GenDelta]], StepStats]:
        """One generator step: each delta with its request (deltas of requests stopped
        meanwhile are dropped), its tokens counted as speculative while the request is
        (one `TokensGenerated` per problem, kind and speculative or not: a step at n=512
        has 512 deltas, and the counts are sums)."""
        deltas, stats = self.gen.step()
        self.collector.emit(StepDone("generator", stats))
        out, made, requests = [], {}, self.requests
        for d in deltas:
            request = requests.get(d.request_id)
            if request is None:
                continue
            n = len(d.new_token_ids)
            request.generated += n
            key = (request.beam.problem_id, request.state is RequestState.SPECULATIVE, request.kind)
            counts = made.get(key)
            if counts is None:
                counts = made[key] = [0, None, 0]
            counts[0] += n
            if d.num_prompt_tokens is not None:  # a request's first delta
                counts[1] = (counts[1] or 0) + d.num_prompt_tokens
                counts[2] += d.num_cached_tokens or 0
            if d.finish_reason is not None:
                del requests[d.request_id]
            out.append((request, d))
        for (problem_id, speculative, kind), (n, prompt, cached) in made.items():
            self.collector.emit(TokensGenerated(problem_id, n, speculative, prompt, cached, kind.value))
        return out, stats

    def stop(self, requests: Iterable[Request], state: RequestState = RequestState.ABORTED) -> None:
        """Abort the requests' backend requests (those still running) and set their state."""
        rids = []
        for request in requests:
            if request.request_id is not None and self.requests.pop(request.request_id, None) is not None:
                rids.append(request.request_id)
            request.state = state
        if rids and (late := self.gen.abort(rids)):  # with overlap: tokens already in flight
            self.collector.emit(TokensLate(late))

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
