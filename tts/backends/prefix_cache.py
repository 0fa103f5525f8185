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

    A hash may be cached in several blocks (`insert(copy=True)`): vLLM's block pool caches
    every full block a request computes, a second copy of the same tokens beside the first,
    and frees, reuses and counts each block on its own. `held` counts the blocks of each
    hash running sequences hold (set by a simulated engine that keeps it): as in vLLM's
    block pool, a held block is never evicted, and only the cached blocks nobody holds
    count against what `reserve` leaves (`evict`). Copies of one hash are used and evicted
    together in LRU order (vLLM's free queue orders each block on its own)."""

    def __init__(self, block: int, capacity: int) -> None:
        if block < 1 or capacity < 0:
            raise ValueError(f"prefix cache: block {block} must be >= 1, capacity {capacity} >= 0")
        self.block = block
        self.capacity = capacity
        self._blocks: OrderedDict[int, int] = OrderedDict()  # hash -> blocks caching it, LRU first
        self._total = 0  # blocks cached
        self.held: Counter[int] = Counter()
        self._seen: set[int] = set()  # every block hash ever cached (the thesis's SeenBlocks)
        # `ThrashCounter`'s keys; preemptions are the engine's to note (`note`)
        self._counts = dict.fromkeys(("lookups", "hits", "misses", "thrash", "thrash_blocks", "thrash_tokens",
                                      "evictions", "resets", "preemptions"), 0)

    def __len__(self) -> int:
        return self._total

    def __contains__(self, key: int) -> bool:
        return key in self._blocks

    def insert(self, keys: Sequence[int], copy: bool = False) -> None:
        """Cache blocks a sequence has just computed, as vLLM caches a block once it is full
        (held while the sequence runs, so not evicted); no lookup is counted. `copy`: each
        is a block of its own, a second copy where its hash is cached already (a simulated
        engine's blocks); otherwise a cached hash is left as it is."""
        blocks = self._blocks
        for key in keys:
            n = blocks.get(key)
            if n is None:
                blocks[key] = 1
                self._seen.add(key)
            elif copy:
                blocks[key] = n + 1
            else:
                continue
            self._total += 1

    def count_lookup(self, keys: Sequence[int], hit: int) -> None:
        """Count a lookup of a sequence's full blocks (`keys`) that found its first `hit`, as
        vLLM's is counted: hits, one miss at the first block not found, and as thrash the
        blocks after it this cache held before (computed again after an eviction)."""
        if not keys:
            return
        c = self._counts
        thrash = sum(1 for key in keys[hit:] if key in self._seen)
        c["lookups"] += 1
        c["hits"] += hit
        c["misses"] += hit < len(keys)
        c["thrash"] += thrash > 0
        c["thrash_blocks"] += thrash
        c["thrash_tokens"] += thrash * self.block

    def touch(self, keys: Sequence[int]) -> None:
        """Make a sequence's cached blocks the most recently used, its last block evicted
        first and its first last (as vLLM frees them)."""
        blocks = self._blocks
        for key in reversed(keys):
            if key in blocks:
                blocks.move_to_end(key)

    def admit(self, token_ids: Sequence[int], reserve: int = 0, count: bool = True) -> int:
        """The tokens of `token_ids`' leading cached blocks (touched as most recently used);
        its other full blocks are cached from now on. At most `capacity - reserve` blocks
        stay cached (`reserve`: blocks running sequences hold outside the cache). Counted as
        vLLM's lookup is (`count_lookup`); `count=False` caches a finished sequence's blocks
        without counting a lookup."""
        keys = list(block_keys(token_ids, self.block))
        hit = 0
        while hit < len(keys) and keys[hit] in self._blocks:
            hit += 1
        if count:
            self.count_lookup(keys, hit)
        self.insert(keys[hit:])
        self.touch(keys)
        self.evict(reserve)
        return hit * self.block

    def evict(self, reserve: int = 0) -> None:
        """Drop least recently used blocks nobody holds down to `capacity - reserve` of them
        (`reserve`: the blocks running sequences hold, held cached ones among them); each
        block dropped is an eviction."""
        limit = max(0, self.capacity - reserve)
        if self._total <= limit:
            return
        blocks, held = self._blocks, self.held
        excess = self._total - sum(min(blocks.get(key, 0), n) for key, n in held.items()) - limit
        if excess <= 0:
            return
        for key, n in list(blocks.items()):
            drop = min(n - held.get(key, 0), excess)
            if drop <= 0:
                continue
            if drop == n:
                del blocks[key]
            else:
                blocks[key] = n - drop
            self._total -= drop
            self._counts["evictions"] += drop
            excess -= drop
            if not excess:
                break

    def clear(self) -> None:
        """Empty the cache and forget what it held (vLLM's `reset_prefix_cache`)."""
        self._blocks.clear()
        self._total = 0
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
        return min(1.0, self._total / self.capacity) if self.capacity else 0.0


class CacheCounter:
    """A `PrefixCache`'s counts from the moment it is made, with `ThrashCounter`'s
    interface (`counts`, `detach`): what a run's variant records for a fake or replayed
    engine, as `ThrashCounter` gives it for a vLLM engine's block pool."""

    def __init__(self, cache: PrefixCache) -> None:
        self.cache = cache
        self._base = cache.counts()

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
