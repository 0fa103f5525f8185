"""A prefix cache of full token blocks with LRU eviction, as vLLM's automatic prefix
caching keeps them: a prompt's leading full blocks that are cached are not computed again.

Used by the fake generator (tests) and by the replay backends (`tts.replay`), which
charge only the uncached part of a prompt to the simulated clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    """Block hashes chained from the start of a sequence, at most `capacity` blocks."""

    def __init__(self, block: int, capacity: int) -> None:
        if block < 1 or capacity < 0:
            raise ValueError(f"prefix cache: block {block} must be >= 1, capacity {capacity} >= 0")
        self.block = block
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def admit(self, token_ids: Sequence[int], reserve: int = 0) -> int:
        """The tokens of `token_ids`' leading cached blocks (touched as most recently used);
        its other full blocks are cached from now on. At most `capacity - reserve` blocks
        stay cached (`reserve`: blocks running sequences hold outside the cache)."""
        cached, parent, hit = 0, 0, True
        for end in range(self.block, len(token_ids) + 1, self.block):
            key = hash((parent, tuple(token_ids[end - self.block:end])))
            parent = key
            if hit and key in self._blocks:
                cached = end
                self._blocks.move_to_end(key)
            else:
                hit = False
                self._blocks[key] = None
        self.evict(reserve)
        return cached

    def evict(self, reserve: int = 0) -> None:
        """Drop least recently used blocks down to `capacity - reserve`."""
        while self._blocks and len(self._blocks) > max(0, self.capacity - reserve):
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()

    @property
    def usage(self) -> float:
        return min(1.0, len(self._blocks) / self.capacity) if self.capacity else 0.0
