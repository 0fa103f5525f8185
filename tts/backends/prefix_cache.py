"""A prefix cache of full token blocks with LRU eviction, as vLLM's automatic prefix
caching keeps them: a prompt's leading full blocks that are cached are not computed again.

Used by the fake backends (tests) and by the replay backends (`tts.replay`), which charge
only the uncached part of a prompt to the simulated clock. It counts what
`tts.backends.vllm.thrash.ThrashCounter` counts in vLLM's block pool (`counts()`, the same
keys), so a fake or replayed run's summary carries evictions and thrash as a vLLM run's does.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterator, Sequence


def block_keys(token_ids: Sequence[int], block: int, start: int = 0, parent: int = 0) -> Iterator[int]:
    """The hashes of `token_ids`' full blocks from block `start` on (`parent`: the hash of
    the block before it), each chained to the blocks before it, as vLLM hashes them."""
    for end in range(block * (start + 1), len(token_ids) + 1, block):
        parent = hash((parent, tuple(token_ids[end - block:end])))
        yield parent


class PrefixCache:
    """Block hashes chained from the start of a sequence, at most `capacity` blocks.

    `held` counts the blocks running sequences hold (set by a simulated engine that keeps
    it): as in vLLM's block pool, a held block is never evicted, and only the cached
    blocks nobody holds count against what `reserve` leaves (`evict`)."""

    def __init__(self, block: int, capacity: int) -> None:
        if block < 1 or capacity < 0:
            raise ValueError(f"prefix cache: block {block} must be >= 1, capacity {capacity} >= 0")
        self.block = block
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.held: Counter[int] = Counter()
        self._seen: set[int] = set()  # every block hash ever cached (the thesis's SeenBlocks)
        # `ThrashCounter`'s keys; preemptions are the engine's to note (`note`)
        self._counts = dict.fromkeys(("lookups", "hits", "misses", "thrash", "thrash_blocks", "thrash_tokens",
                                      "evictions", "resets", "preemptions"), 0)

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: int) -> bool:
        return key in self._blocks

    def insert(self, keys: Sequence[int]) -> None:
        """Cache blocks a running sequence has just filled, as vLLM caches a block once it
        is full (held while the sequence runs, so not evicted); no lookup is counted."""
        for key in keys:
            if key not in self._blocks:
                self._blocks[key] = None
                self._seen.add(key)

    def admit(self, token_ids: Sequence[int], reserve: int = 0, count: bool = True) -> int:
        """The tokens of `token_ids`' leading cached blocks (touched as most recently used);
        its other full blocks are cached from now on. At most `capacity - reserve` blocks
        stay cached (`reserve`: blocks running sequences hold outside the cache). Counted as
        vLLM's lookup is: hits, one miss at the first uncached block, and as thrash the
        uncached blocks this cache held before (computed again after an eviction).
        `count=False` caches a finished sequence's blocks without counting a lookup."""
        cached, hit, thrash, keys = 0, True, 0, []
        for end, key in zip(range(self.block, len(token_ids) + 1, self.block), block_keys(token_ids, self.block)):
            keys.append(key)
            if hit and key in self._blocks:
                cached = end
            else:
                if hit and count:
                    self._counts["misses"] += 1
                hit = False
                thrash += key in self._seen
                self._blocks[key] = None
                self._seen.add(key)
        for key in reversed(keys):  # a sequence's last block is evicted first, its first last (as vLLM frees them)
            self._blocks.move_to_end(key)
        if count and len(token_ids) >= self.block:
            c = self._counts
            c["lookups"] += 1
            c["hits"] += cached // self.block
            c["thrash"] += thrash > 0
            c["thrash_blocks"] += thrash
            c["thrash_tokens"] += thrash * self.block
        self.evict(reserve)
        return cached

    def evict(self, reserve: int = 0) -> None:
        """Drop least recently used blocks nobody holds down to `capacity - reserve` of them
        (`reserve`: the blocks running sequences hold, held cached ones among them)."""
        limit = max(0, self.capacity - reserve)
        if len(self._blocks) <= limit:
            return
        free = [key for key in self._blocks if key not in self.held]
        for key in free[:max(0, len(free) - limit)]:
            del self._blocks[key]
            self._counts["evictions"] += 1

    def clear(self) -> None:
        """Empty the cache and forget what it held (vLLM's `reset_prefix_cache`)."""
        self._blocks.clear()
        self._seen.clear()
        self._counts["resets"] += 1

    def note(self, event: str) -> None:
        """Count an event of the engine this cache belongs to (`preemptions`)."""
        self._counts[event] += 1

    def counts(self) -> dict[str, int]:
        """What `ThrashCounter.counts` gives (its keys), so far."""
        return dict(self._counts)

    @property
    def usage(self) -> float:
        return min(1.0, len(self._blocks) / self.capacity) if self.capacity else 0.0


class CacheCounter:
    """A `PrefixCache`'s counts from the moment it is made, with `ThrashCounter`'s
    interface (`counts`, `detach`): what a run's variant records for a fake or replayed
    engine, as `ThrashCounter` gives it for a vLLM engine's block pool."""

    def __init__(self, cache: PrefixCache) -> None:
        self.cache = cache
        self._base = cache.counts()

    def note(self, event: str) -> None:
        """Count an event of the engine this cache belongs to (`preemptions`)."""
        self._counts[event] += 1

    def counts(self) -> dict[str, int]:
        now = self.cache.counts()
        return {key: now[key] - self._base[key] for key in now}

    def snapshot(self) -> dict:
        """`counts()` with `ThrashCounter.snapshot`'s derived fields."""
        out: dict = self.counts()
        queries = out["hits"] + out["misses"]
        out.update(cached=len(self.cache), num_blocks=self.cache.capacity, enabled=True,
                   hit_rate=out["hits"] / queries if queries else 0.0,
                   thrash_rate=out["thrash"] / out["misses"] if out["misses"] else 0.0)
        return out

    def detach(self) -> None:
        """Nothing to unhook: the cache counts by itself."""
