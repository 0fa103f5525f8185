"""A problem in flight, as every part of the engine sees it: the bottom of `tts/engine/`
(it imports no other engine module but the request it holds).

A `Problem` is its input, its search, its metrics, its own random draws, and its
frontier as a schedule tracks it: the beams still without their step, the scores still
missing, its table of speculative steps (`Table`), the new tokens of each step this
iteration.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from tts.engine.requests import Request
from tts.metrics.measures import ProblemMetrics
from tts.search.base import ProblemSearch, SearchPolicy
from tts.search.tree import Beam

class Table:
    """The speculative steps held until selection: (parent uid, child seed) -> the step's
    request, whose beam is forked from the parent with the child's seed; in the order they
    were made, and by parent (`of_beam`, read for every finished step: a scan of the whole
    table there made an iteration's cost grow as the square of n)."""

    __slots__ = ("_nodes", "_by_beam")

    def __init__(self) -> None:
        self._nodes: dict[tuple[int, int], Request] = {}
        self._by_beam: dict[int, dict[int, Request]] = {}

    def get(self, key: tuple[int, int], default: Request | None = None) -> Request | None:
        return self._nodes.get(key, default)

    def __setitem__(self, key: tuple[int, int], spec_step: Request) -> None:
        self._nodes[key] = spec_step
        self._by_beam.setdefault(key[0], {})[key[1]] = spec_step

    def __delitem__(self, key: tuple[int, int]) -> None:
        del self._nodes[key]
        children = self._by_beam[key[0]]
        del children[key[1]]
        if not children:
            del self._by_beam[key[0]]

    def pop(self, key: tuple[int, int], default: Request | None = None) -> Request | None:
        if key not in self._nodes:
            return default
        spec_step = self._nodes[key]
        del self[key]
        return spec_step

    def of_beam(self, uid: int) -> list[Request]:
        """The steps held for the children of beam `uid`, in the order they were made."""
        return list(self._by_beam.get(uid, {}).values())

    def items(self):
        return self._nodes.items()

    def values(self):
        return self._nodes.values()

    def __contains__(self, key: object) -> bool:
        return key in self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def __iter__(self):
        return iter(self._nodes)


@dataclass(frozen=True)
class ProblemInput:
    id: str
    problem: str


@dataclass(eq=False)
class Problem:
    """A problem in flight: its search, its metrics (written by the collector only), its
    own random draws (truncation), the same whatever runs beside it, and its frontier as
    a schedule tracks it: the beams still without their step, the scores still missing,
    its table of speculative steps (both disciplines keep theirs here), the new tokens of
    each step this iteration."""

    input: ProblemInput
    search: ProblemSearch
    metrics: ProblemMetrics
    rng: random.Random
    waiting: set[int] = field(default_factory=set)
    to_score: int = 0
    spec_table: Table = field(default_factory=Table)
    lengths: list[int] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.input.id


def next_unscored(policy: SearchPolicy, search: ProblemSearch, beam: Beam) -> int | None:
    """The shallowest step of `beam` the policy needs scored that has no score yet; None
    when every step it needs is scored."""
    return next((i for i in policy.indices_to_score(beam, search) if beam.scores[i] is None), None)


def hash_id(problem_id: str) -> int:
    """A stable (process-independent) integer for a problem id."""
    h = 0
    for ch in problem_id:
        h = (h * 131 + ord(ch)) % (2**31 - 1)
    return h
