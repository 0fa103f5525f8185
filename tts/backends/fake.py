"""A deterministic fake generator and verifier for unit tests of the engine logic.

The fake "model" is a step script `script(problem, steps, seed) -> step text`: a request
for the next step of a path samples that step. Two sampling modes:

- `context` (default): the next token depends only on the context and the request's
  seed, so a request that runs past a step boundary, or resumes from part of a step,
  produces exactly what a fresh request for that step with the same seed would: vLLM
  with the position-keyed sampler (`generator.sampler=position`).
- `stream`: like vLLM's own seeded sampling (`generator.sampler=vllm`), a request draws from its own random stream
  started at its first sampled token. A request that starts at a step boundary samples
  the script's step for its seed; a step it reaches by running on past a boundary, or
  resumes in the middle of, is sampled from a stream position the fresh request never
  has (the script is called with a seed mixed from the seed and that position). Tests
  that claim "the same tree as the baseline" whatever the sampler run in this mode.

Either mode can be made inexact as bf16 logits are (`batch_dependent`: the fake with
`generator.dtype=bfloat16` or `float16`): a request's tokens then also depend on the batch
it is first scheduled in (the script's seed is mixed with that batch's size), so the same
request, sent in another variant or at another moment, can sample another step.

With `lag` (`generator.overlap=on` on the fake), the generator behaves as vLLM's
asynchronous scheduling does (`EngineCore.step_with_batch_queue`, two batches in flight):
each step computes its batch and returns the one before (the first returns nothing); a
request aborted while its token is in flight loses that token, and one that ended at EOS is
scheduled once more before its EOS comes back (its token thrown away): both are late tokens
(`abort`'s return, `StepStats.late_tokens`). A request that reaches its `max_tokens` is not
scheduled again, as vLLM's scheduler knows the count ahead.

Tokens are characters (id = code point + 16); EOS is written "\x03".

It is never used by `tts bench` unless `generator.backend=fake` is chosen explicitly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tts import clock
from tts.backends.base import (FinishReason, GenDelta, Generator, GenRequest, ScoreBatchStats,
                               ScoreRequest, StepStats, Verifier)
from tts.backends.prefix_cache import PrefixCache

EOS_CHAR = "\x03"
EOS_ID = 3
OFFSET = 16
KV_BYTES_PER_TOKEN = 1024  # the fake model's KV per token: an engine's KV budget buys its cache blocks
BLOCK = 4  # the fake engines' block, in tokens (characters)
StepScript = Callable[[str, tuple[str, ...], int], str]
Scorer = Callable[[str, tuple[str, ...]], float]


def _h(*parts: object) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "big")


def default_script(problem: str, steps: tuple[str, ...], seed: int) -> str:
    """Steps of hash-determined length; from depth 3 on, some paths answer and end."""
    h = _h(problem, steps, seed)
    depth = len(steps)
    if depth >= 3 and h % 3 == 0:
        return f"so \\boxed{{{h % 4}}}{EOS_CHAR}"
    words = " ".join(f"w{(h >> (4 * i)) % 13}" for i in range(1 + h % 9))
    return f"d{depth} {words}.\n\n"


def endless_script(problem: str, steps: tuple[str, ...], seed: int) -> str:
    """Unique steps of seed-dependent length that never finish the path."""
    return f"d{len(steps)}s{seed % 1000}" + "x" * (seed % 7) + "\n\n"


def answering_script(problem: str, steps: tuple[str, ...], seed: int) -> str:
    """From depth 2 on, even seeds answer and end; other steps have seed-dependent length."""
    if len(steps) >= 2 and seed % 2 == 0:
        return f"\\boxed{{{seed % 3}}}{EOS_CHAR}"
    return f"d{len(steps)}s{seed % 1000}" + "y" * (seed % 11) + "\n\n"


def cache_blocks(kv_bytes: int) -> int:
    """The prefix-cache blocks a fake engine's KV budget of `kv_bytes` holds."""
    return kv_bytes // (BLOCK * KV_BYTES_PER_TOKEN)


def default_scorer(problem: str, steps: tuple[str, ...]) -> float:
    return (_h("score", problem, steps) % 1000) / 1000.0


def prompt_text(problem: str, system_prompt: str) -> str:
    """The fake's chat prompt."""
    return f"<{system_prompt}|{problem}>"


def encode(text: str) -> list[int]:
    return [EOS_ID if c == EOS_CHAR else ord(c) + OFFSET for c in text]


def decode(ids: Sequence[int]) -> str:
    return "".join(EOS_CHAR if i == EOS_ID else chr(i - OFFSET) for i in ids)


class FakeCodec:
    """The fake backend's text side without a generator (`tts.backends.codec.generator_codec`)."""

    eos_token_id = EOS_ID

    def encode_prompt(self, problem: str, system_prompt: str) -> list[int]:
        return encode(prompt_text(problem, system_prompt))

    def decode(self, token_ids: Sequence[int]) -> str:
        return decode(token_ids)

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id])


@dataclass
class _Running:
    request: GenRequest
    produced: str = ""  # text generated so far
    reported_prompt: bool = False
    batch: int | None = None  # the size of the batch it was first scheduled in (batch-dependent sampling)
    prompt: str | None = None  # the request's prompt as text, decoded once
    stopping: bool = False  # lag: it ended at EOS, not yet returned; scheduled once more (a late token)

    def prompt_text(self) -> str:
        if self.prompt is None:
            self.prompt = decode(self.request.prompt_token_ids)
        return self.prompt


class FakeGenerator(Generator):
    """Scripted generator with a batch cap and an LRU prefix cache of `block` tokens."""

    def __init__(self, script: StepScript = default_script, batch_cap: int = 64,
                 cache_blocks: int = 1 << 20, block: int = BLOCK, sampling: str = "context",
                 batch_dependent: bool = False, lag: bool = False) -> None:
        if sampling not in ("context", "stream"):
            raise ValueError(f"fake generator: sampling {sampling!r}; valid choices: context, stream")
        self.script = script
        self.sampling = sampling
        self.batch_dependent = batch_dependent
        self.resumable_sampling = sampling == "context"
        self._cap = batch_cap
        self._prompts: dict[str, str] = {}  # prompt text -> problem
        self._queue: list[_Running] = []
        self.prefix_cache = PrefixCache(block, cache_blocks)
        self.calls: list[str] = []  # request ids in the order they were first scheduled
        self.lag = lag  # one step behind, as vLLM's asynchronous scheduling (module doc)
        self._in_flight: list[GenDelta] = []  # lag: the last batch's deltas, which the next step returns

    @property
    def eos_token_id(self) -> int:
        return EOS_ID

    def reset_prefix_cache(self) -> bool:
        if self._queue:
            return False  # like vLLM: not while requests hold blocks
        self.prefix_cache.clear()
        return True

    @property
    def batch_cap(self) -> int:
        return self._cap

    def set_limits(self, batch_cap: int | None = None) -> None:
        if batch_cap:
            self._cap = batch_cap

    def encode_prompt(self, problem: str, system_prompt: str) -> list[int]:
        text = prompt_text(problem, system_prompt)
        self._prompts[text] = problem
        return encode(text)

    def decode(self, token_ids: Sequence[int]) -> str:
        return decode(token_ids)

    def token_text(self, token_id: int) -> str:
        return decode([token_id])

    def _add(self, request: GenRequest) -> None:
        self._queue.append(_Running(request))

    def _abort(self, request_ids: list[str]) -> int:
        ids = set(request_ids)
        self._queue = [r for r in self._queue if r.request.request_id not in ids]
        late = sum(1 for d in self._in_flight if d.request_id in ids)  # computed, now thrown away
        if late:
            self._in_flight = [d for d in self._in_flight if d.request_id not in ids]
        return late

    def num_unfinished(self) -> int:
        """Requests added whose end was not returned yet (an EOS in flight still counts)."""
        if not self.lag:
            return len(self._queue)
        return sum(not r.stopping for r in self._queue) + sum(d.finished for d in self._in_flight)

    def _next_token(self, request_text: str, produced: str, seed: int, batch: int | None = None) -> int:
        if batch is not None:  # bf16: the batch's shape moves the logits
            seed = _h("batch", seed, batch) % (2**31 - 1)
        context = request_text + produced
        prompt = next((p for p in self._prompts if context.startswith(p)), None)
        assert prompt is not None, "fake generator: unknown prompt"
        parts = context[len(prompt):].split("\n\n")
        steps, partial = tuple(p + "\n\n" for p in parts[:-1]), parts[-1]
        if self.sampling == "stream":
            start = request_text[len(prompt):].split("\n\n")
            ahead, resumed = len(steps) - (len(start) - 1), len(start[-1])
            if ahead or resumed:  # not the stream position a fresh request for this step has
                seed = _h("stream", seed, ahead, resumed) % (2**31 - 1)
        step = self.script(self._prompts[prompt], steps, seed)
        if len(partial) < len(step):
            return encode(step[len(partial)])[0]
        return EOS_ID  # a script step without "\n\n" or EOS ends the sequence

    def _step(self) -> tuple[list[GenDelta], StepStats]:
        start = clock.now()
        running, deltas, per_req = self._queue[: self._cap], [], []
        waiting = len(self._queue) - len(running)
        late = [r for r in running if r.stopping]  # lag: scheduled before their EOS came back
        for run in running:
            if run.stopping:
                per_req.append(1)
                continue
            req = run.request
            first = not run.reported_prompt
            cached = self.prefix_cache.admit(run.request.prompt_token_ids) if first else None
            if first:
                self.calls.append(req.request_id)
                run.reported_prompt = True
                run.batch = len(running) if self.batch_dependent else None
            tok = self._next_token(run.prompt_text(), run.produced, req.seed, run.batch)
            run.produced += decode([tok])
            finish = (FinishReason.EOS if tok == EOS_ID else
                      FinishReason.LENGTH if len(run.produced) >= req.max_tokens else None)
            deltas.append(GenDelta(req.request_id, (tok,), finish, cached,
                                   len(req.prompt_token_ids) if first else None))
            # as vLLM schedules it: a new request's uncached prompt (its first token sampled from it)
            per_req.append(max(1, len(req.prompt_token_ids) - (cached or 0)) if first else 1)
        done = {d.request_id for d in deltas if d.finished}
        if self.lag:  # an EOS stays scheduled one step more; a length stop does not
            eos = {d.request_id for d in deltas if d.finish_reason is FinishReason.EOS}
            for run in running:
                run.stopping = run.stopping or run.request.request_id in eos
            done -= eos
        gone = done | {r.request.request_id for r in late}
        self._queue = [r for r in self._queue if r.request.request_id not in gone]
        stats = StepStats(len(running), waiting, sum(per_req), self._cap, 1 << 16, self.prefix_cache.usage,
                          clock.now() - start, tuple(per_req), late_tokens=len(late))
        if self.lag:
            deltas, self._in_flight = self._in_flight, deltas
        return deltas, stats


class FakeVerifier(Verifier):
    """Scores from `scorer(problem, steps[: i + 1])`; counts every scored index. Each backend
    request's prompt (the problem and the path up to its last scored step) goes through an
    LRU prefix cache of `cache_blocks` blocks, as a vLLM verifier's does."""

    def __init__(self, scorer: Scorer = default_scorer, request_per_score: bool = False,
                 cache_blocks: int = 1 << 20) -> None:
        self.scorer = scorer
        self._per_score = request_per_score  # how a real verifier of this shape would ask
        self.scored: list[tuple[str, tuple[str, ...]]] = []
        self.prefix_cache = PrefixCache(BLOCK, cache_blocks)

    def reset_prefix_cache(self) -> bool:
        self.prefix_cache.clear()
        return True

    def _prompts(self, req: ScoreRequest) -> list[list[int]]:
        """The token prompts a real verifier of this shape would send for `req`."""
        ends = req.indices if self._per_score else req.indices[-1:]
        return [encode(f"<{req.problem}>" + "".join(req.steps[: i + 1])) for i in ends]

    def _score(self, requests: Sequence[ScoreRequest]) -> tuple[list[tuple[float, ...]], ScoreBatchStats]:
        start = clock.now()
        out = []
        for req in requests:
            scores = []
            for i in req.indices:
                path = req.steps[: i + 1]
                self.scored.append((req.problem, path))
                scores.append(self.scorer(req.problem, path))
            out.append(tuple(scores))
        prompts = [p for req in requests for p in self._prompts(req)]
        cached = sum(self.prefix_cache.admit(p) for p in prompts)
        return out, ScoreBatchStats(len(prompts), sum(map(len, prompts)), cached, clock.now() - start)

    @property
    def request_per_score(self) -> bool:
        return self._per_score

    @property
    def reads_partial_steps(self) -> bool:
        return True
