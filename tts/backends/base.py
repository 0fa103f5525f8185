"""Backend contracts: the engine talks to models only through these two interfaces.

The generator is driven step by step (add, step, abort) so that the engine, not the
serving library, decides which requests run, in what order, and when a reasoning step
ends. The verifier scores chosen steps of reasoning paths in one batched call.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from tts import clock
from tts.token_hash import extend_hash


class FinishReason(str, enum.Enum):
    """Why the backend stopped a generation request."""

    EOS = "eos"  # the model emitted its end-of-sequence token
    LENGTH = "length"  # the request's max_tokens was reached
    ABORTED = "aborted"  # the engine aborted it


@dataclass(frozen=True)
class GenRequest:
    """One generation request: continue `prompt_token_ids` by at most `max_tokens`.

    The backend never stops at a step boundary itself: the engine watches the streamed
    tokens and aborts (or lets run on, for speculation) when a step ends.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    seed: int
    temperature: float = 0.8
    top_p: float = 1.0
    ignore_eos: bool = False  # run to max_tokens (benchmarks that need equal work per path)
    # `tts.token_hash.extend_hash(0, prompt_token_ids)` where the sender keeps it (the engine's
    # beams do); None: whoever needs it hashes the prompt
    prompt_key: int | None = None
    speculative: bool = False  # sent as speculation (a run's trace records it)

    def key(self) -> int:
        """The prompt's key (`tts.token_hash`): the one it carries, else its prompt's hash."""
        return self.prompt_key if self.prompt_key is not None else extend_hash(0, self.prompt_token_ids)


class GenDelta(NamedTuple):
    """The tokens one request produced during one backend step (a named tuple: a step
    makes one per running request, 512 at n=512, and a frozen dataclass costs three times
    as much to build)."""

    request_id: str
    new_token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None
    # Prompt tokens served from the prefix cache; reported once, with the first delta.
    num_cached_tokens: int | None = None
    num_prompt_tokens: int | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class StepStats:
    """What one backend (scheduler) step did: for batch-utilisation histograms."""

    num_running: int  # requests that produced work this step
    num_waiting: int  # requests queued but not scheduled
    num_scheduled_tokens: int  # prefill + decode tokens computed this step
    batch_cap: int  # the engine's max concurrent sequences
    token_cap: int  # the engine's max batched tokens per step
    kv_usage: float  # fraction of KV blocks in use after the step, in [0, 1]
    wall_s: float
    tokens_per_request: tuple[int, ...] = ()  # scheduled tokens per running request
    # host seconds in the backend's own request calls (`add`, `abort`: vLLM's input
    # processing) since the previous step, outside any step's `wall_s` (`Generator.step`)
    calls_s: float = 0.0
    # late tokens (overlap's price, `generator.overlap`): tokens computed for requests already
    # stopped, thrown away. Here: those of the requests that ended at EOS, scheduled once more
    # before their EOS came back (vLLM, the fake: in the step that returns the EOS; an abort's
    # come back from `Generator.abort`), or, in a replay, every one the step prices. 0 without overlap.
    late_tokens: int = 0
    # the step's seconds on the card a run is recorded for (`bench.record_for`,
    # `Generator.step_price`): what the decisions that weigh time read; None: `wall_s`
    card_s: float | None = None


class Generator(ABC):
    """A step-level text generator over token ids.

    Contract: `add` queues a request; each `step` advances every running request by at
    most one decode token (or a prefill chunk) and returns the new tokens of each
    request that made progress; `abort` removes requests at once, and no delta for an
    aborted request is returned afterwards. With overlap (vLLM's asynchronous scheduling,
    the fake's lag mode) a step returns the tokens of the step before (the first returns
    none), and a request stopped meanwhile has had one more token computed, thrown away:
    `abort` returns how many such late tokens it caused, `StepStats.late_tokens` counts
    those of requests that ended at EOS.

    `resumable_sampling`: whether a request whose prompt ends with the first k tokens of
    a step samples the rest of it as the uninterrupted request (same seed) would. True for
    vLLM with the position-keyed sampler (`generator.sampler=position`); not with vLLM's
    own sampler, where a seeded request draws from its own random generator, started at
    the request's first sampled token, so a resumed request, or one run on past a step
    boundary, samples other tokens than a fresh request with the same seed.
    """

    resumable_sampling: bool = False
    _step_observers: tuple[Callable[[list[GenDelta], StepStats, float], None], ...] = ()
    _add_observers: tuple[Callable[[GenRequest], None], ...] = ()
    _abort_observers: tuple[Callable[[list[str]], None], ...] = ()
    # a run recorded for a card (`bench.record_for`): each step's price there (`StepStats.card_s`)
    step_price: Callable[[list[GenDelta], StepStats], float] | None = None

    @property
    @abstractmethod
    def eos_token_id(self) -> int: ...

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Every token id at which the backend ends a request (models such as Qwen2.5 and
        Llama-3 have several); `eos_token_id` is one of them."""
        return frozenset((self.eos_token_id,))

    @property
    @abstractmethod
    def batch_cap(self) -> int:
        """The maximum number of sequences scheduled together."""

    @abstractmethod
    def encode_prompt(self, problem: str, system_prompt: str) -> list[int]:
        """Token ids of the chat-templated prompt, ready for the first step."""

    @abstractmethod
    def decode(self, token_ids: Sequence[int]) -> str: ...

    @abstractmethod
    def token_text(self, token_id: int) -> str:
        """The text of one token in isolation (cached): used to find step boundaries."""

    _calls_s: float = 0.0  # host time in `_add` and `_abort` since the last step (`StepStats.calls_s`)

    def add(self, request: GenRequest) -> None:
        """Queue a request (the class contract); each request observer then sees it."""
        start = clock.now()
        self._add(request)
        self._calls_s += clock.now() - start
        for observer in self._add_observers:
            observer(request)

    @abstractmethod
    def _add(self, request: GenRequest) -> None:
        """The backend's own queueing (what `add` runs)."""

    def step(self) -> tuple[list[GenDelta], StepStats]:
        """Run one step (the class contract); each step observer then sees its deltas, its
        statistics and its wall time."""
        start = clock.now()
        deltas, stats = self._step()
        if self._calls_s:
            stats, self._calls_s = replace(stats, calls_s=self._calls_s), 0.0
        if self.step_price is not None:
            stats = replace(stats, card_s=self.step_price(deltas, stats))
        for observer in self._step_observers:
            observer(deltas, stats, clock.now() - start)
        return deltas, stats

    @abstractmethod
    def _step(self) -> tuple[list[GenDelta], StepStats]:
        """The backend's own step (what `step` runs)."""

    def add_step_observer(self, observer: Callable[[list[GenDelta], StepStats, float], None]) -> Callable[[], None]:
        """Call `observer(deltas, stats, wall_s)` after every step; returns its remover."""
        return _add_observer(self, "_step_observers", observer)

    def add_request_observer(self, on_add: Callable[[GenRequest], None],
                             on_abort: Callable[[list[str]], None]) -> Callable[[], None]:
        """Call `on_add(request)` after every `add` and `on_abort(request_ids)` after every
        `abort` (a run's trace records them); returns the remover of both."""
        removers = (_add_observer(self, "_add_observers", on_add), _add_observer(self, "_abort_observers", on_abort))

        def remove() -> None:
            for remover in removers:
                remover()

        return remove

    @property
    def llm(self) -> Any | None:
        """The vLLM engine behind this backend, for instrumentation (block-pool counters,
        memory breakdown); None for a backend without one (the fake)."""
        return None

    def abort(self, request_ids: Iterable[str]) -> int:
        """Remove requests at once (the class contract); each abort observer then sees them.
        Returns the late tokens the aborts cost: those of the requests already scheduled in
        the step in flight (with overlap; else 0), computed and thrown away."""
        ids = list(request_ids)
        start = clock.now()
        late = self._abort(ids) or 0
        self._calls_s += clock.now() - start
        for observer in self._abort_observers:
            observer(ids)
        return late

    @abstractmethod
    def _abort(self, request_ids: list[str]) -> int | None:
        """The backend's own abort (what `abort` runs): the late tokens it costs (None: 0)."""

    @abstractmethod
    def num_unfinished(self) -> int: ...

    def set_limits(self, batch_cap: int | None = None) -> None:
        """Change the batch cap between steps (memory allocation policy); optional."""

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix, so that what runs next does not depend on what ran
        before; False when it cannot now (requests still hold blocks). Optional: a backend
        without a prefix cache has nothing to forget."""
        return True

    def close(self) -> None:
        """Free the model; optional."""


@dataclass(frozen=True)
class ScoreRequest:
    """Score steps of one reasoning path: `indices` are 0-based step positions."""

    problem: str
    steps: tuple[str, ...]
    indices: tuple[int, ...]


@dataclass(frozen=True)
class ScoreBatchStats:
    """What one verifier call cost."""

    num_requests: int  # backend requests issued (an adapter may issue one per index)
    prompt_tokens: int
    cached_tokens: int
    wall_s: float
    step_stats: tuple[StepStats, ...] = field(default=())


class Verifier(ABC):
    """A process reward model: scores in [0, 1] for chosen steps of reasoning paths.

    Contract: `score` returns, for each request, one score per index, in order.
    """

    _score_observers: tuple[Callable[[ScoreBatchStats, float], None], ...] = ()
    _result_observers: tuple[Callable[[Sequence[ScoreRequest], list[tuple[float, ...]]], None], ...] = ()

    def score(self, requests: Sequence[ScoreRequest]) -> tuple[list[tuple[float, ...]], ScoreBatchStats]:
        """Score the requests (the class contract); each score observer then sees the call's
        statistics and its wall time, each result observer the requests and their scores."""
        start = clock.now()
        scores, stats = self._score(requests)
        for observer in self._score_observers:
            observer(stats, clock.now() - start)
        for result_observer in self._result_observers:
            result_observer(requests, scores)
        return scores, stats

    @abstractmethod
    def _score(self, requests: Sequence[ScoreRequest]) -> tuple[list[tuple[float, ...]], ScoreBatchStats]:
        """The backend's own scoring (what `score` runs)."""

    def add_score_observer(self, observer: Callable[[ScoreBatchStats, float], None]) -> Callable[[], None]:
        """Call `observer(stats, wall_s)` after every `score` call; returns its remover."""
        return _add_observer(self, "_score_observers", observer)

    def add_result_observer(self, observer: Callable[[Sequence[ScoreRequest], list[tuple[float, ...]]], None],
                            ) -> Callable[[], None]:
        """Call `observer(requests, scores)` after every `score` call (a run's trace records
        them); returns its remover."""
        return _add_observer(self, "_result_observers", observer)

    @property
    def llm(self) -> Any | None:
        """The vLLM engine behind this backend (see `Generator.llm`); None without one."""
        return None

    @property
    def request_per_score(self) -> bool:
        """Each scored step is a backend request of its own (an LLM judge), rather than one
        read of a pass over the whole path (a PRM head): a lookahead score then costs its
        own prefill, and is worth computing only for a step that will be kept."""
        return False

    @property
    def reads_partial_steps(self) -> bool:
        """A step cut off mid-way gets a meaningful score (early rejection): true of an LLM
        judge, which reads the text as it stands; not claimed for a PRM head trained to
        score whole steps at its step tag."""
        return False

    def set_limits(self, batch_cap: int | None = None) -> None:
        """Change the batch cap between calls (memory allocation policy); optional."""

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (see `Generator.reset_prefix_cache`); optional."""
        return True

    def close(self) -> None:
        """Free the model; optional."""


def _add_observer(backend: object, slot: str, observer: Callable) -> Callable[[], None]:
    """Add `observer` to the backend's tuple `slot` (an instance attribute shadowing the
    class's empty one); the returned function removes it again."""
    setattr(backend, slot, (*getattr(backend, slot), observer))

    def remove() -> None:
        setattr(backend, slot, tuple(o for o in getattr(backend, slot) if o is not observer))

    return remove
