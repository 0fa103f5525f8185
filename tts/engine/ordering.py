"""Request ordering policies: the order in which a phase's requests reach the generator.

Order matters once the KV cache cannot hold every live path: the generator admits
requests first come, first served, and a path whose prefix was just evicted must be
recomputed. `prefix_aware` (FlashTTS's P) keeps siblings contiguous and parents in
their previous relative order, the greedy longest-shared-prefix rule.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TypeVar

from tts.search.tree import Beam

T = TypeVar("T")


class Ordering(ABC):
    """Reorders the items of a phase; `key(item)` gives the item's beam."""

    @abstractmethod
    def order(self, items: Sequence[T], beam_of) -> list[T]: ...


class Fifo(Ordering):
    """The frontier's own order (search-and-learn's interleaved refill)."""

    def order(self, items, beam_of):
        return list(items)


class RandomOrder(Ordering):
    """A seeded random order: the reference for measuring prefix-aware ordering."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def order(self, items, beam_of):
        items = list(items)
        self.rng.shuffle(items)
        return items


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class PrefixAware(Ordering):
    """Siblings (same parent) contiguous, groups in the order their parent first
    appears; problems stay together. Within the frontier this is exactly the greedy
    rule: the next item always shares the longest prefix with the previous one, since
    a sibling shares the whole parent path and any other beam shares less."""

    def order(self, items, beam_of):
        groups: dict[tuple, list] = {}
        for item in items:
            beam: Beam = beam_of(item)
            key = (beam.problem_id, beam.parent if beam.parent is not None else -1)
            groups.setdefault(key, []).append(item)
        return [item for group in groups.values() for item in group]


def greedy_order(paths: Sequence[Sequence[int]]) -> list[int]:
    """The literal greedy rule over token paths (quadratic; used to check PrefixAware)."""
    if not paths:
        return []
    left = list(range(1, len(paths)))
    order = [0]
    while left:
        prev = paths[order[-1]]
        best = max(left, key=lambda i: (shared_prefix(prev, paths[i]), -i))
        order.append(best)
        left.remove(best)
    return order


ORDERINGS = {"fifo": Fifo, "random": RandomOrder, "prefix_aware": PrefixAware}


def make_ordering(name: str, seed: int = 0) -> Ordering:
    if name not in ORDERINGS:
        raise ValueError(f"ordering: unknown {name!r}; valid choices: {', '.join(ORDERINGS)}")
    return RandomOrder(seed) if name == "random" else ORDERINGS[name]()
