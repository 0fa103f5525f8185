"""Replay backends: a generator and a verifier that answer the engine from a trace and move
a virtual clock by a step cost model, so the engine's own code (scheduling, speculation,
lookahead, ordering, the memory policy) runs unchanged on a simulated device.

Each backend keeps a simulated vLLM engine (`tts.replay.sim_engine.SimEngine`: batch cap,
token budget, chunked prefill, prefix cache, preemption).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from tts.backends.base import (FinishReason, GenDelta, Generator, GenRequest, ScoreBatchStats, ScoreRequest,
                               StepStats, Verifier)
from tts.backends.prefix_cache import PrefixCache
from tts.clock import VirtualClock
from tts.replay.reader import VariantReader, Whose
from tts.replay.sampler import StepSampler
from tts.replay.served import ReplayCounts
from tts.replay.sim_engine import SimEngine, Slot
from tts.token_hash import extend_hash
from tts.trace.format import Generation, score_key


@dataclass
class _Run:
    request: GenRequest
    slot: Slot
    source: Iterator[tuple[int, Whose]]  # (token, where it came from)
    produced: int = 0
    reported: bool = False
    drawn: bool = False
    borrowed: bool = False


class ReplayGenerator(Generator):
    """Serves each request the tokens the trace recorded for it (its seed and prompt: the
    variant's own recording first, `VariantReader`), then drawn steps where the trace runs
    out; the clock moves by each step's cost plus `host_s` (the recorded host time per step).

    With `overlap` (`replay.overlap`: vLLM's asynchronous scheduling) the host work hides
    behind the model's step: a step moves the clock by the larger of the two. Its price: a
    request that stops in step k (at EOS, or aborted while decoding) decodes one more token
    in step k+1, thrown away; each such late token is one more sequence in that step's
    batch, counted there (`StepStats.late_tokens`: the step that computes it, so every late
    token counted is priced). A request that reaches its `max_tokens` costs none (vLLM does
    not schedule it again). The tokens served, and the tree, are those without overlap."""

    def __init__(self, codec, eos_ids: frozenset[int], reader: VariantReader, sampler: StepSampler,
                 engine: SimEngine, clock: VirtualClock, counts: ReplayCounts, host_s: float, resumable: bool,
                 overlap: bool = False) -> None:
        self.codec = codec
        self._eos_ids = eos_ids
        self.reader = reader
        self.sampler = sampler
        self.engine = engine
        self.clock = clock
        self.counts = counts
        self.host_s = host_s
        self.resumable_sampling = resumable
        self.overlap = overlap
        self._runs: dict[str, _Run] = {}
        self._late: list[int] = []  # overlap: contexts of requests stopped since the last step

    @property
    def eos_token_id(self) -> int:
        return self.codec.eos_token_id

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos_ids

    @property
    def batch_cap(self) -> int:
        return self.engine.batch_cap

    def set_limits(self, batch_cap: int | None = None) -> None:
        if batch_cap:
            self.engine.batch_cap = batch_cap

    def reset_prefix_cache(self) -> bool:
        if self._runs:
            return False
        self.engine.cache.clear()
        return True

    @property
    def prefix_cache(self) -> PrefixCache:
        """The simulated engine's prefix cache (its evictions and thrash are the run's)."""
        return self.engine.cache

    def encode_prompt(self, problem: str, system_prompt: str) -> list[int]:
        ids = self.codec.encode_prompt(problem, system_prompt)
        self.reader.divergence.start(problem, ids)  # where a divergent request is from
        return ids

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.codec.decode(token_ids)

    def token_text(self, token_id: int) -> str:
        return self.codec.token_text(token_id)

    def num_unfinished(self) -> int:
        return len(self._runs)

    def _add(self, request: GenRequest) -> None:
        self.counts.requests += 1
        slot = Slot(list(request.prompt_token_ids))
        source = self._source(request)
        self._runs[request.request_id] = _Run(request, slot, source)
        self.engine.waiting.append(slot)

    def _source(self, request: GenRequest) -> Iterator[tuple[int, Whose]]:
        """(token, whose) for a request: what the trace recorded for its seed and prompt
        (`VariantReader.take`); where that was aborted before this request ends, a longer
        recorded output of the same request that begins with what was served; with a
        resumable sampler, where it runs out before EOS, what the trace recorded for the
        prompt extended by those tokens (the next step's request: the same context and seed
        sample the same tokens), and so on; then drawn steps. A request the variant's own
        recording does not hold, or one run past it, is noted (`Divergence`)."""
        seed, speculative = request.seed, request.speculative
        h = prompt_hash = request.key()
        served, found = [], None
        note = functools.partial(self.reader.divergence.request, request.prompt_token_ids, seed, speculative)
        taken = self.reader.take(seed, h, speculative)
        if taken is not None and taken[1] is Whose.BORROWED and self.resumable_sampling \
                and (found := self.reader.resumed(seed, h, own_only=True)) is not None:
            taken = None  # the variant's own recording of the step it resumes, before another's
            self.counts.resumed += 1
            note("never sent when recorded; served its recording of the step it resumes (the same tokens)")
        elif taken is not None:
            gen, whose, repeated = taken
            found = (gen, 0, whose)
            self.counts.recorded += whose is Whose.OWN and not repeated
            self.counts.repeated += repeated
            if repeated or whose is not Whose.OWN:
                note("sent more often than recorded; served its own recording again" if repeated else
                     f"never sent when recorded; served {gen.variant or 'another variant'}'s recording")
        elif self.resumable_sampling and (found := self.reader.resumed(seed, h)) is not None:
            self.counts.resumed += 1
            note(f"never sent when recorded; served {_whose(found)} recording of the step it resumes (the same tokens)")
        if found is None:
            note("no variant sent it when recorded; drawn")
        while found is not None:
            gen, start, whose = found
            for token in gen.tokens[start:]:
                yield token, whose
                h = extend_hash(h, (token,))
                served.append(token)
            if gen.finish == FinishReason.EOS.value:
                break
            note(f"ran past the {len(served)} tokens recorded for it ({gen.finish} there)")
            found = None
            for own_only in (True, False):  # the variant's own recording first, then another's
                if found is None and not gen.finished:  # aborted where recorded: the same request recorded further
                    found = self.reader.extending(seed, prompt_hash, served, own_only)
                if found is None and self.resumable_sampling:
                    found = self.reader.resumed(seed, h, own_only)
            if found is None or not found[0].tokens[found[1]:]:
                break
            self.counts.resumed += 1
        for token in self.sampler.tokens(seed * 1_000_003 + h):
            yield token, Whose.DRAWN

    def _abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            run = self._runs.pop(rid, None)
            if run is not None:
                self._stopped(run.slot)  # its late token is counted in the step that prices it
                self.engine.release(run.slot)

    def _stopped(self, slot: Slot) -> None:
        """With overlap, a sequence stopped while decoding is in the batch in flight: it
        decodes once more in the next step (a late token)."""
        if self.overlap and not slot.todo and slot in self.engine.running:
            self._late.append(len(slot.ids))

    def _step(self) -> tuple[list[GenDelta], StepStats]:
        late, self._late = self._late, []
        sampled, seconds, tokens = self.engine.step(late)
        by_slot = {id(r.slot): (rid, r) for rid, r in self._runs.items()}
        deltas = []
        for slot in sampled:
            rid, run = by_slot[id(slot)]
            deltas.append(self._emit(rid, run))
        self.clock.advance(max(seconds, self.host_s) if self.overlap else seconds + self.host_s)
        stats = self.engine.stats(tokens, seconds)
        return deltas, replace(stats, late_tokens=len(late)) if late else stats

    def _emit(self, rid: str, run: _Run) -> GenDelta:
        token, whose = next(run.source, (self.eos_token_id, Whose.DRAWN))
        self.counts.tokens += 1
        if whose is Whose.DRAWN:
            self.counts.drawn_tokens += 1
            self.counts.drawn_requests += not run.drawn
            run.drawn = True
        elif whose is Whose.BORROWED:
            self.counts.borrowed_tokens += 1
            self.counts.borrowed_requests += not run.borrowed
            run.borrowed = True
        run.produced += 1
        run.slot.ids.append(token)
        finish = (FinishReason.EOS if token in self._eos_ids else
                  FinishReason.LENGTH if run.produced >= run.request.max_tokens else None)
        first = not run.reported
        run.reported = True
        if finish is not None:
            del self._runs[rid]
            if finish is FinishReason.EOS:
                self._stopped(run.slot)
            self.engine.release(run.slot)
        n_prompt = len(run.request.prompt_token_ids)
        return GenDelta(rid, (token,), finish, run.slot.cached if first else None, n_prompt if first else None)


def _whose(found: tuple[Generation, int, Whose]) -> str:
    return "its own" if found[2] is Whose.OWN else f"{found[0].variant or 'another variant'}'s"


@dataclass
class ReplayVerifier(Verifier):
    """Scores from the trace (drawn where it has none), each call's prompts built as the
    recorded verifier builds them (`build`), its time from the simulated engine plus
    `host_s` per engine step; with `overlap`, the larger of the two per step (a scoring
    request samples one token at most: no late tokens)."""

    build: Callable[[ScoreRequest], list[Sequence[int]]]
    reader: VariantReader
    sampler: StepSampler
    engine: SimEngine
    clock: VirtualClock
    counts: ReplayCounts
    host_s: float = 0.0
    per_score: bool = False
    partial_steps: bool = False
    overlap: bool = False

    @property
    def request_per_score(self) -> bool:
        return self.per_score

    @property
    def reads_partial_steps(self) -> bool:
        return self.partial_steps

    def set_limits(self, batch_cap: int | None = None) -> None:
        if batch_cap:
            self.engine.batch_cap = batch_cap

    def reset_prefix_cache(self) -> bool:
        self.engine.cache.clear()
        return True

    @property
    def prefix_cache(self) -> PrefixCache:
        return self.engine.cache

    def _lookup(self, req: ScoreRequest, i: int) -> float:
        key = score_key(req.problem, req.steps[: i + 1])
        self.counts.scores += 1
        owned = self.reader.owns_score(key)
        found = self.reader.score(key)
        if not owned:
            self.reader.divergence.score(req.problem, i + 1, "a score it never asked for when recorded; " + (
                "drawn" if found is None else "served another variant's score" if found[1] is Whose.BORROWED
                else "served its own again"))
        if found is None:
            self.counts.drawn_scores += 1
            return self.sampler.score(key, i)
        self.counts.borrowed_scores += found[1] is Whose.BORROWED
        return found[0]

    def _score(self, requests: Sequence[ScoreRequest]) -> tuple[list[tuple[float, ...]], ScoreBatchStats]:
        scores = [tuple(self._lookup(req, i) for i in req.indices) for req in requests]
        slots = [Slot(list(ids)) for req in requests for ids in self.build(req)]
        self.engine.waiting.extend(slots)
        steps, wall, clocked = [], 0.0, 0.0
        while self.engine.waiting or self.engine.running:
            sampled, seconds, tokens = self.engine.step()
            for slot in sampled:
                self.engine.release(slot)
            wall += seconds
            clocked += max(seconds, self.host_s)
            steps.append(self.engine.stats(tokens, seconds))
        self.clock.advance(clocked if self.overlap else wall + self.host_s * len(steps))
        stats = ScoreBatchStats(len(slots), sum(len(s.ids) for s in slots), sum(s.cached for s in slots), wall,
                                tuple(steps))
        return scores, stats
