"""KV-cache thrash counting inside one vLLM engine's block pool (the thesis's Algorithm 1).

A block is *thrashed* when its KV was computed and cached, then evicted to make room, and
later needed again: the prefix-cache lookup misses on a hash the pool has held before.

How it is counted (vLLM 0.32, v1 engine, in-process; see `ThrashCounter.attach`):

- ``seen`` (the thesis's SeenBlocks): every block hash ever registered in this pool's
  prefix cache (``BlockPool._insert_block_hash``, the one place v1 adds a hash).
- The cached set (CacheBlocks) is the pool's own ``cached_block_hash_to_block`` map; a
  lookup that returns nothing proves the hash is not cached now.
- Lookups: vLLM looks a waiting request's full prompt blocks up one by one
  (``BlockPool.get_cached_block``, via ``KVCacheManager.get_computed_blocks``) and stops
  at the first miss (hashes chain over the prefix, so every later block misses too). A
  request that cannot be admitted this step is looked up again next step, so, like vLLM's
  own prefix-cache stats, lookups are committed only when the request is admitted
  (``KVCacheManager.record_prefix_cache_stats``). A preempted request that is re-admitted
  is looked up again and counts again (its recomputation is real).
- ``hits``: looked-up blocks found in the cache (reused).
- ``misses``: looked-up blocks not found: at most one per admitted lookup.
- ``thrash``: misses on a hash in ``seen`` (Algorithm 1, line 9).
- ``thrash_blocks``: for each thrashing lookup, the missed block and every later block up
  to the lookup limit whose hash is in ``seen``: blocks the pool held before and must now
  recompute (single-group models only; 0 otherwise); ``thrash_tokens``: their tokens.
- ``lookups``: admitted requests with at least one block looked up.
- ``evictions``: cached blocks whose hashes were dropped because the block was handed out
  again (``BlockPool._maybe_evict_cached_block`` returning True).
- ``resets``: successful ``reset_prefix_cache`` calls. A reset is not an eviction: it
  clears ``seen``, so blocks dropped by a reset never count as thrash.
- ``preemptions``: running requests the scheduler preempted because KV blocks ran out
  (``Scheduler._preempt_request``): their blocks are freed and they are prefilled again,
  from what the prefix cache still holds of them, when re-admitted.

The hooks are instance attributes on this engine's own ``KVCacheManager`` and ``BlockPool``
(they shadow the bound methods; no vLLM class or file is patched, other engines are
untouched); ``detach`` removes them. Counts are per engine: attach one counter to the
generator and one to the verifier.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tts.backends.vllm.internals import (
    BLOCK_POOL_METHODS,
    KV_MANAGER_METHODS,
    PREEMPT_METHOD,
    UnsupportedVllmError,
    find_scheduler,
    blocks_in_use,
    kv_cache_manager,
    observe_schedule,
    pool_blocks,
    scheduled_tokens,
)

if TYPE_CHECKING:  # pragma: no cover
    import vllm

logger = logging.getLogger(__name__)

COUNTERS = ("lookups", "hits", "misses", "thrash", "thrash_blocks", "thrash_tokens", "evictions", "resets",
            "preemptions")


@dataclass
class _Lookup:
    hits: int = 0
    misses: int = 0
    thrash: int = 0
    thrash_blocks: int = 0


@dataclass
class ThrashCounter:
    """Prefix-cache hits, misses, evictions and thrash of one engine's block pool."""

    lookups: int = 0
    hits: int = 0
    misses: int = 0
    thrash: int = 0
    thrash_blocks: int = 0
    thrash_tokens: int = 0
    evictions: int = 0
    resets: int = 0
    preemptions: int = 0
    enabled: bool = False
    reason: str = ""
    _seen: set[bytes] = field(default_factory=set, repr=False)
    _trace: list[tuple[bytes, bool]] | None = field(default=None, repr=False)
    _pending: dict[str, _Lookup] = field(default_factory=dict, repr=False)
    _pool: Any = field(default=None, repr=False)
    _manager: Any = field(default=None, repr=False)
    _scheduler: Any = field(default=None, repr=False)

    @classmethod
    def attach(cls, llm: vllm.LLM, strict: bool = True) -> ThrashCounter:
        """Hook the block pool of `llm` (an in-process vLLM 0.32 engine) and return its counter.

        Raises `UnsupportedVllmError` on another vLLM version or engine layout; with
        ``strict=False`` it logs a warning instead and returns a disabled counter (all
        counts stay 0, ``enabled`` is False, ``reason`` says why).
        """
        counter = cls()
        manager, counter.reason = _checked_manager(llm, strict, "thrash counting")
        if manager is not None:
            counter._hook(manager)
            counter._hook_scheduler(find_scheduler(llm))
        return counter

    @property
    def seen(self) -> int:
        """Distinct block hashes this pool has cached since attach (or the last reset)."""
        return len(self._seen)

    @property
    def cached(self) -> int:
        """Block hashes in the pool's prefix cache now."""
        return 0 if self._pool is None else len(self._pool.cached_block_hash_to_block)

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool, the null block included."""
        return 0 if self._pool is None else pool_blocks(self._pool)

    def counts(self) -> dict[str, int]:
        """The counters (`COUNTERS`) now."""
        return {name: getattr(self, name) for name in COUNTERS}

    def snapshot(self) -> dict[str, Any]:
        """The counters now, plus ``seen``, ``cached``, ``num_blocks``, ``hit_rate``
        (hits / looked-up blocks) and ``thrash_rate`` (thrash / misses)."""
        out: dict[str, Any] = dict(self.counts())
        queries = self.hits + self.misses
        out.update(seen=self.seen, cached=self.cached, num_blocks=self.num_blocks,
                   hit_rate=self.hits / queries if queries else 0.0,
                   thrash_rate=self.thrash / self.misses if self.misses else 0.0,
                   enabled=self.enabled)
        return out

    def detach(self) -> None:
        """Remove the hooks (the engine runs on, uncounted); the counts are kept."""
        for obj, names in ((self._pool, BLOCK_POOL_METHODS), (self._manager, KV_MANAGER_METHODS),
                           (self._scheduler, (PREEMPT_METHOD,))):
            for name in names:
                if obj is not None and name in vars(obj) and callable(vars(obj)[name]) \
                        and getattr(vars(obj)[name], "_tts_thrash_hook", False):
                    delattr(obj, name)
        self.enabled = False

    # -- hooks -------------------------------------------------------------------------

    def _hook(self, manager: Any) -> None:
        pool = manager.block_pool
        if getattr(pool.get_cached_block, "_tts_thrash_hook", False):
            raise ValueError("this engine's block pool already has a ThrashCounter; "
                             "detach it first")
        self._manager, self._pool = manager, pool
        _wrap(pool, "get_cached_block", self._on_get_cached_block)
        _wrap(pool, "_insert_block_hash", self._on_insert)
        _wrap(pool, "_maybe_evict_cached_block", self._on_evict)
        _wrap(pool, "reset_prefix_cache", self._on_reset)
        _wrap(manager, "get_computed_blocks", self._on_lookup)
        _wrap(manager, "record_prefix_cache_stats", self._on_admit)
        self.enabled = True

    def _hook_scheduler(self, scheduler: Any) -> None:
        """Count preemptions where the scheduler has vLLM 0.32's preemption method."""
        if scheduler is not None and callable(getattr(scheduler, PREEMPT_METHOD, None)):
            self._scheduler = scheduler
            _wrap(scheduler, PREEMPT_METHOD, self._on_preempt)

    def _on_preempt(self, original: Any, *args: Any, **kw: Any) -> Any:
        self.preemptions += 1
        return original(*args, **kw)

    def _on_get_cached_block(self, original: Any, block_hash: bytes, *args: Any, **kw: Any) -> Any:
        blocks = original(block_hash, *args, **kw)
        if self._trace is not None:
            self._trace.append((bytes(block_hash), bool(blocks)))
        return blocks

    def _on_insert(self, original: Any, key: bytes, *args: Any, **kw: Any) -> Any:
        result = original(key, *args, **kw)
        self._seen.add(bytes(key[:-4]))  # BlockHashWithGroupId = hash + 4-byte group id
        return result

    def _on_evict(self, original: Any, *args: Any, **kw: Any) -> Any:
        evicted = original(*args, **kw)
        if evicted:
            self.evictions += 1
        return evicted

    def _on_reset(self, original: Any, *args: Any, **kw: Any) -> Any:
        done = original(*args, **kw)
        if done:
            self.resets += 1
            self._seen.clear()
            self._pending.clear()
        return done

    def _on_lookup(self, original: Any, request: Any, *args: Any, **kw: Any) -> Any:
        self._trace = []
        try:
            result = original(request, *args, **kw)
        finally:
            trace, self._trace = self._trace, None
        self._pending[request.request_id] = self._classify(request, trace or [])
        return result

    def _classify(self, request: Any, trace: list[tuple[bytes, bool]]) -> _Lookup:
        found = _Lookup(hits=sum(1 for _, hit in trace if hit),
                        misses=sum(1 for _, hit in trace if not hit))
        missed = [h for h, hit in trace if not hit]
        if missed and missed[0] in self._seen:
            found.thrash = 1
            found.thrash_blocks = self._recompute_blocks(request, found.hits, missed[0])
        return found

    def _recompute_blocks(self, request: Any, first_miss: int, miss_hash: bytes) -> int:
        """Blocks from the first miss to the lookup limit that the pool had cached before."""
        hashes = list(getattr(request, "block_hashes", ()))
        block_size = int(self._pool.hash_block_size)
        limit = min(len(hashes), (int(request.num_tokens) - 1) // block_size)
        if first_miss >= len(hashes) or bytes(hashes[first_miss]) != miss_hash:
            return 0  # hashes are not viewed at the pool's granularity (multi-group model)
        return sum(1 for h in hashes[first_miss:limit] if bytes(h) in self._seen)

    def _on_admit(self, original: Any, request: Any, *args: Any, **kw: Any) -> Any:
        found = self._pending.pop(request.request_id, None)
        if found is not None and (found.hits or found.misses):
            self.lookups += 1
            self.hits += found.hits
            self.misses += found.misses
            self.thrash += found.thrash
            self.thrash_blocks += found.thrash_blocks
            self.thrash_tokens += found.thrash_blocks * int(self._pool.hash_block_size)
        return original(request, *args, **kw)


class BlockUsageTrace:
    """KV blocks in use right after each scheduling decision of one engine (thesis Fig 5.3).

    Observes the engine's scheduler (`internals.observe_schedule`, shared with tts's
    `SchedulerProbe`) and, after every schedule that scheduled tokens, records the pool's
    blocks held by requests (`internals.blocks_in_use`). This is the batch's allocation
    while the step runs; usage read after the step misses requests that finish within it
    (verifier scoring requests mostly do).
    """

    def __init__(self) -> None:
        self.blocks: list[int] = []
        self.num_blocks = 0
        self._remove: Any = None

    @classmethod
    def attach(cls, llm: vllm.LLM, strict: bool = True) -> BlockUsageTrace:
        """Start recording for `llm`; on an unsupported vLLM raise `UnsupportedVllmError`
        (``strict``) or return a trace that records nothing."""
        trace = cls()
        manager, _ = _checked_manager(llm, strict, "KV block trace")
        if manager is None:
            return trace
        pool = manager.block_pool
        trace.num_blocks = pool_blocks(pool)

        def record(output: Any) -> None:
            if scheduled_tokens(output):
                trace.blocks.append(blocks_in_use(pool))

        trace._remove = observe_schedule(find_scheduler(llm), record)
        return trace

    def detach(self) -> None:
        """Stop recording."""
        if self._remove is not None:
            self._remove()
            self._remove = None


def attach_counters(**backends: Any) -> dict[str, Any]:
    """A counter on the block pool of each named backend that runs an in-process vLLM 0.32
    engine (`backend.llm`); for a backend that keeps its own `PrefixCache` (`prefix_cache`:
    the fake and replay backends) a `CacheCounter` on it; none for an absent one (None) or
    another vLLM (logged). Each has `counts()`; detach them with `detach_counters`."""
    from tts.backends.prefix_cache import CacheCounter, PrefixCache

    out: dict[str, Any] = {}
    for role, backend in backends.items():
        llm = None if backend is None else backend.llm
        cache = getattr(backend, "prefix_cache", None)
        if llm is not None and (counter := ThrashCounter.attach(llm, strict=False)).enabled:
            out[role] = counter
        elif llm is None and isinstance(cache, PrefixCache):
            out[role] = CacheCounter(cache)
    return out


def detach_counters(counters: dict[str, ThrashCounter]) -> None:
    for counter in counters.values():
        counter.detach()


def _wrap(obj: Any, name: str, hook: Any) -> None:
    """Shadow `obj.name` (a bound method) with an instance attribute calling `hook(original, ...)`."""
    original = getattr(obj, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return hook(original, *args, **kwargs)

    wrapper._tts_thrash_hook = True  # type: ignore[attr-defined]
    setattr(obj, name, wrapper)


def _checked_manager(llm: Any, strict: bool, what: str) -> tuple[Any | None, str]:
    """(the engine's KV cache manager, "") after the version and shape checks; where they
    fail, `UnsupportedVllmError` (`strict`) or (None, why) with a warning that `what` is off."""
    try:
        return kv_cache_manager(llm), ""
    except UnsupportedVllmError as err:
        if strict:
            raise
        logger.warning("%s disabled: %s", what, err)
        return None, str(err)
