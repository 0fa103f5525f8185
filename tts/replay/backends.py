"""Replay backends: a generator and a verifier that answer the engine from a trace and move
a virtual clock by a step cost model, so the engine's own code (scheduling, speculation,
lookahead, ordering, the memory policy) runs unchanged on a simulated device.

Each backend keeps a simulated vLLM engine (`SimEngine`): running sequences decode one
token per step, new ones are admitted while the batch cap, the step's token budget and the
KV cache allow, their prompts prefilled less what the prefix cache holds (full blocks,
LRU); a finished or aborted sequence leaves its blocks cached, as vLLM does. When the running
sequences' next tokens need more blocks than the pool has, the one admitted last is preempted
(vLLM V1's rule for first-come-first-served scheduling): its blocks go back to the pool, still
cached until evicted, and it waits at the head of the queue to be prefilled again, its
prompt and the tokens it had generated, less what the cache still holds of them. Thrash,
evictions and preemptions are counted in the prefix cache (`PrefixCache.counts`), as a vLLM
run counts them in its block pool. Not modelled: chunked prefill's interplay with
preemption beyond the step's token budget, vLLM's null block and the KV a sliding window
adds, and anything a step costs that the cost model does not see.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from tts.backends.base import (FinishReason, GenDelta, Generator, GenRequest, ScoreBatchStats, ScoreRequest,
                               StepStats, Verifier)
from tts.backends.prefix_cache import PrefixCache, block_keys
from tts.clock import VirtualClock
from tts.engine.model_runner import SPECULATIVE_PREFIX
from tts.replay.cost import StepCost
from tts.replay.reader import VariantReader, Whose
from tts.replay.sampler import StepSampler
from tts.replay.served import ReplayCounts
from tts.trace.format import Generation, extend_hash, score_key


@dataclass(eq=False)
class Slot:
    """One sequence in a simulated engine."""

    ids: list[int]
    todo: int = 0  # prompt tokens still to compute
    cached: int = 0  # prompt tokens the prefix cache served
    keys: list[int] = field(default_factory=list)  # its full blocks' hashes while it runs


class SimEngine:
    """A vLLM engine's scheduling, as far as the clock goes (module docstring)."""

    def __init__(self, cost: StepCost, cache: PrefixCache, batch_cap: int, token_cap: int, kv_blocks: int) -> None:
        self.cost = cost
        self.cache = cache
        self.batch_cap = batch_cap
        self.token_cap = token_cap
        self.kv_blocks = kv_blocks
        self.waiting: list[Slot] = []
        self.running: list[Slot] = []

    def _hold(self, slot: Slot) -> None:
        """The slot's full blocks (as far as its tokens go) are held while it runs."""
        new = list(block_keys(slot.ids, self.cache.block, len(slot.keys), slot.keys[-1] if slot.keys else 0))
        slot.keys += new
        self.cache.held.update(new)

    def _unhold(self, slot: Slot) -> None:
        self.cache.held.subtract(slot.keys)
        for key in slot.keys:
            if self.cache.held[key] <= 0:
                del self.cache.held[key]
        slot.keys = []

    def in_use(self) -> int:
        """Blocks the running sequences hold: a full block once however many share it (a
        common prefix), and each sequence's block for its next token."""
        for s in self.running:
            self._hold(s)
        return len(self.cache.held) + len(self.running)

    def _need(self, slot: Slot) -> int:
        """The blocks a waiting sequence would add: its full blocks nobody holds, and one
        for its next token."""
        held = self.cache.held
        return sum(1 for key in block_keys(slot.ids, self.cache.block) if key not in held) + 1

    def step(self) -> tuple[list[Slot], float, tuple[int, ...]]:
        """Schedule and cost one step: the sequences that sample a token in it (decoders,
        and those whose prefill completes), its seconds, its tokens per sequence."""
        self._preempt()
        budget = self.token_cap
        decode = [s for s in self.running if not s.todo][:budget]
        budget -= len(decode)
        chunks = []
        for s in self.running:
            if s.todo and budget > 0:
                chunks.append((s, min(s.todo, budget)))
                budget -= chunks[-1][1]
        in_use = self.in_use()
        while self.waiting and len(self.running) < self.batch_cap and budget > 0:
            s = self.waiting[0]
            need = self._need(s)
            if self.running and in_use + need > self.kv_blocks:
                break  # waits for KV blocks, as vLLM's scheduler makes it
            self.waiting.pop(0)
            self.running.append(s)
            self._hold(s)
            in_use += need
            # vLLM computes at least a prompt's last token: a hit stops at the last full block before it
            s.cached = min(self.cache.admit(s.ids, reserve=in_use), (len(s.ids) - 1) // self.cache.block * self.cache.block)
            s.todo = len(s.ids) - s.cached
            chunks.append((s, min(s.todo, budget)))
            budget -= chunks[-1][1]
        seconds = self.cost.step_s([len(s.ids) for s in decode], [(n, len(s.ids) - s.todo) for s, n in chunks])
        for s, n in chunks:
            s.todo -= n
        sampled = decode + [s for s, _ in chunks if not s.todo]
        return sampled, seconds, (1,) * len(decode) + tuple(n for _, n in chunks)

    def _preempt(self) -> None:
        """While the running sequences' next tokens need more blocks than the pool has, the
        last admitted is preempted (module docstring)."""
        while len(self.running) > 1 and self.in_use() > self.kv_blocks:
            victim = self.running.pop()
            self._unhold(victim)
            self.cache.admit(victim.ids, reserve=self.in_use(), count=False)  # cached, evictable
            victim.todo = victim.cached = 0
            self.waiting.insert(0, victim)
            self.cache.note("preemptions")

    def release(self, slot: Slot) -> None:
        """A sequence leaves (finished or aborted); its full blocks stay cached."""
        if slot in self.running:
            self.running.remove(slot)
            self._unhold(slot)
            self.cache.admit(slot.ids, reserve=self.in_use(), count=False)
        elif slot in self.waiting:
            self.waiting.remove(slot)

    def stats(self, tokens: tuple[int, ...], seconds: float) -> StepStats:
        return StepStats(len(tokens), len(self.waiting), sum(tokens), self.batch_cap, self.token_cap,
                         min(1.0, self.in_use() / self.kv_blocks) if self.kv_blocks else 0.0, seconds, tokens)


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
    out; the clock moves by each step's cost plus `host_s` (the recorded host time per step)."""

    def __init__(self, codec, eos_ids: frozenset[int], reader: VariantReader, sampler: StepSampler,
                 engine: SimEngine, clock: VirtualClock, counts: ReplayCounts, host_s: float, resumable: bool) -> None:
        self.codec = codec
        self._eos_ids = eos_ids
        self.reader = reader
        self.sampler = sampler
        self.engine = engine
        self.clock = clock
        self.counts = counts
        self.host_s = host_s
        self.resumable_sampling = resumable
        self._runs: dict[str, _Run] = {}

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
        seed, speculative = request.seed, request.request_id.startswith(SPECULATIVE_PREFIX)
        h = prompt_hash = request.key()
        served, found = [], None
        note = functools.partial(self.reader.divergence.request, request.prompt_token_ids, seed, speculative)
        if (taken := self.reader.take(seed, h, speculative)) is not None:
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
            if not gen.finished:  # aborted where it was recorded: the same request recorded further
                found = self.reader.extending(seed, prompt_hash, served)
            if found is None and self.resumable_sampling:
                found = self.reader.resumed(seed, h)
            if found is None or not found[0].tokens[found[1]:]:
                break
            self.counts.resumed += 1
        for token in self.sampler.tokens(seed * 1_000_003 + h):
            yield token, Whose.DRAWN

    def _abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            run = self._runs.pop(rid, None)
            if run is not None:
                self.engine.release(run.slot)

    def _step(self) -> tuple[list[GenDelta], StepStats]:
        sampled, seconds, tokens = self.engine.step()
        by_slot = {id(r.slot): (rid, r) for rid, r in self._runs.items()}
        deltas = []
        for slot in sampled:
            rid, run = by_slot[id(slot)]
            deltas.append(self._emit(rid, run))
        self.clock.advance(seconds + self.host_s)
        return deltas, self.engine.stats(tokens, seconds)

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
            self.engine.release(run.slot)
        n_prompt = len(run.request.prompt_token_ids)
        return GenDelta(rid, (token,), finish, run.slot.cached if first else None, n_prompt if first else None)


def _whose(found: tuple[Generation, int, Whose]) -> str:
    return "its own" if found[2] is Whose.OWN else f"{found[0].variant or 'another variant'}'s"


@dataclass
class ReplayVerifier(Verifier):
    """Scores from the trace (drawn where it has none), each call's prompts built as the
    recorded verifier builds them (`build`), its time from the simulated engine plus
    `host_s` per engine step."""

    build: Callable[[ScoreRequest], list[Sequence[int]]]
    reader: VariantReader
    sampler: StepSampler
    engine: SimEngine
    clock: VirtualClock
    counts: ReplayCounts
    host_s: float = 0.0
    per_score: bool = False
    partial_steps: bool = False

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
        steps, wall = [], 0.0
        while self.engine.waiting or self.engine.running:
            sampled, seconds, tokens = self.engine.step()
            for slot in sampled:
                self.engine.release(slot)
            wall += seconds
            steps.append(self.engine.stats(tokens, seconds))
        self.clock.advance(wall + self.host_s * len(steps))
        stats = ScoreBatchStats(len(slots), sum(len(s.ids) for s in slots), sum(s.cached for s in slots), wall,
                                tuple(steps))
        return scores, stats
