"""The verification phase: score what the policy asks for, through the score cache.

With lookahead, a beam whose speculative tokens already hold a whole next step has that
step scored in the same verifier request; its score only enters the cache, so the
current selection never sees speculative work, and the next iteration finds it there.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tts import clock
from tts.backends.base import ScoreBatchStats, ScoreRequest, Verifier
from tts.search.tree import Beam


class ScoreCache:
    """Step scores keyed by (problem, path up to the step); hits and misses counted."""

    def __init__(self) -> None:
        self._scores: dict[tuple[str, tuple[str, ...]], float] = {}
        self.hits = 0
        self.misses = 0
        self.hits_by_problem: Counter[str] = Counter()
        self.lookahead_stored = 0
        self.lookahead_hits = 0  # lookahead scores read back (each once): the lookahead's hits
        self.lookahead_hits_by_problem: Counter[str] = Counter()
        self._lookahead_keys: set[tuple[str, tuple[str, ...]]] = set()

    def get(self, problem_id: str, path: tuple[str, ...]) -> float | None:
        key = (problem_id, path)
        score = self._scores.get(key)
        if score is None:
            self.misses += 1
        else:
            self.hits += 1
            self.hits_by_problem[problem_id] += 1
            if key in self._lookahead_keys:
                self.lookahead_hits += 1
                self.lookahead_hits_by_problem[problem_id] += 1
                self._lookahead_keys.discard(key)
        return score

    def peek(self, problem_id: str, path: tuple[str, ...]) -> float | None:
        """The step's score if known (not counted as a hit or a miss)."""
        return self._scores.get((problem_id, path))

    def fill_last(self, beam: Beam) -> float | None:
        """The beam's last step's score: where the beam has none yet and the cache knows it
        (an earlier call scored that path), the beam takes it (not counted as a hit)."""
        if beam.scores[-1] is None and (score := self.peek(beam.problem_id, beam.step_texts)) is not None:
            beam.set_score(beam.depth - 1, score)
        return beam.scores[-1]

    def has(self, problem_id: str, path: tuple[str, ...]) -> bool:
        """Whether the step's score is known (not counted as a hit or a miss)."""
        return (problem_id, path) in self._scores

    def put(self, problem_id: str, path: tuple[str, ...], score: float, lookahead: bool = False) -> None:
        key = (problem_id, path)
        self._scores[key] = score
        if lookahead:
            self.lookahead_stored += 1
            self._lookahead_keys.add(key)

    def drop_problem(self, problem_id: str) -> None:
        for key in [k for k in self._scores if k[0] == problem_id]:
            del self._scores[key]
            self._lookahead_keys.discard(key)


@dataclass
class ScoreItem:
    """Score `indices` of `beam`. `lookahead_step` is the text of a next step not yet in
    the beam (speculative), scored into the cache only; `partial_step` is the text of a step still decoding,
    scored for `ScoringStats.partial` only (early rejection)."""

    beam: Beam
    problem: str
    indices: tuple[int, ...]
    lookahead_step: str | None = None
    partial_step: str | None = None


@dataclass
class ScoringStats:
    wall_s: float = 0.0
    requested: int = 0  # step scores the policy needed
    computed: int = 0  # step scores the verifier computed (lookahead included)
    lookahead: int = 0
    partial_scored: int = 0  # partial steps scored (early rejection)
    partial: dict[int, float] = field(default_factory=dict)  # their scores, by beam uid
    batches: list[ScoreBatchStats] = field(default_factory=list)
    by_problem: dict[str, Counter] = field(default_factory=dict)  # the counters above, per problem

    def add(self, problem_id: str, **counts: int) -> None:
        mine = self.by_problem.setdefault(problem_id, Counter())
        for key, n in counts.items():
            setattr(self, key, getattr(self, key) + n)
            mine[key] += n

    def merge(self, other: ScoringStats) -> None:
        """Add another call's stats (a second call in the same iteration)."""
        self.wall_s += other.wall_s
        self.batches.extend(other.batches)
        self.partial.update(other.partial)
        for pid, counts in other.by_problem.items():
            self.add(pid, **counts)


class ScoringPhase:
    """Fills `beam.scores` for the requested indices, using the cache when enabled.

    With the cache, a path asked for twice in one call (identical siblings, or a beam's
    path that another beam's lookahead step also reaches) is computed once, and the
    second asker reads it from the cache after the call."""

    def __init__(self, verifier: Verifier | None, cache: ScoreCache | None) -> None:
        self.verifier = verifier
        self.cache = cache

    def run(self, items: Sequence[ScoreItem], order: Callable[[list[ScoreItem]], list[ScoreItem]] = list,
            ) -> ScoringStats:
        stats, start = ScoringStats(), clock.now()
        requests: list[ScoreRequest] = []
        pending: list[tuple[ScoreItem, tuple[int, ...]]] = []
        asked: set[tuple[str, tuple[str, ...]]] = set()  # paths this call computes
        deferred: list[tuple[ScoreItem, int]] = []  # served by another item's request
        for item in order(list(items)):
            texts, pid = item.beam.step_texts, item.beam.problem_id
            stats.add(pid, requested=len(item.indices))
            missing = []
            for i in item.indices:
                if self._from_cache(item, texts, i):
                    continue
                key = (pid, texts[: i + 1])
                if self.cache is not None and key in asked:
                    deferred.append((item, i))
                    continue
                asked.add(key)
                missing.append(i)
            look = item.lookahead_step if self.cache is not None else None
            if look is not None:
                key = (pid, texts + (look,))
                if key in asked or self.cache.has(*key):
                    look = None
                else:
                    asked.add(key)
            look = item.partial_step if item.partial_step is not None else look
            if not missing and look is None:
                continue
            steps = texts + ((look,) if look is not None else ())
            indices = tuple(missing) + ((len(texts),) if look is not None else ())
            requests.append(ScoreRequest(item.problem, steps, indices))
            pending.append((item, indices))
        if requests:
            assert self.verifier is not None, "a policy without a verifier asked for scores"
            results, batch = self.verifier.score(requests)
            stats.batches.append(batch)
            for (item, indices), scores in zip(pending, results):
                self._store(item, indices, scores, stats)
        for item, i in deferred:
            assert self._from_cache(item, item.beam.step_texts, i)
        stats.wall_s = clock.now() - start
        return stats

    def _from_cache(self, item: ScoreItem, texts: tuple[str, ...], i: int) -> bool:
        if self.cache is None:
            return False
        score = self.cache.get(item.beam.problem_id, texts[: i + 1])
        if score is None:
            return False
        item.beam.set_score(i, score)
        return True

    def _store(self, item: ScoreItem, indices: tuple[int, ...], scores: Sequence[float],
               stats: ScoringStats) -> None:
        texts = item.beam.step_texts
        for i, score in zip(indices, scores):
            stats.add(item.beam.problem_id, computed=1)
            if i < len(texts):
                item.beam.set_score(i, score)
                if self.cache is not None:
                    self.cache.put(item.beam.problem_id, texts[: i + 1], score)
            elif item.partial_step is not None:  # a step still decoding: for early rejection only
                stats.add(item.beam.problem_id, partial_scored=1)
                stats.partial[item.beam.uid] = score
            else:  # the lookahead step: cache only
                stats.add(item.beam.problem_id, lookahead=1)
                assert self.cache is not None and item.lookahead_step is not None
                self.cache.put(item.beam.problem_id, texts + (item.lookahead_step,), score, lookahead=True)
