"""The search-policy contract: what to expand and what survives.

A policy never runs a model and never decides order or timing; the engine does. Each
iteration the engine asks for the frontier, generates one step for every beam in it
(`step_limit` tokens at most), scores the indices `indices_to_score` asks for, and calls
`select`, which returns the next frontier. Completed beams are collected in `completed`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from tts.config.enums import Aggregation
from tts.config.schema import SearchConfig
from tts.search.tree import Beam, BeamState, child_seed


def aggregate(scores: Sequence[float | None], how: Aggregation | str) -> float:
    """A path's score from its step scores (unscored steps are skipped)."""
    vals = [s for s in scores if s is not None]
    if not vals:
        return 0.0
    how = Aggregation(how)
    if how is Aggregation.last:
        return vals[-1]
    if how is Aggregation.min:
        return min(vals)
    if how is Aggregation.prod:
        return math.prod(vals)
    return sum(vals) / len(vals)


@dataclass
class ProblemSearch:
    """One problem's search state, owned by the engine and mutated by the policy."""

    problem_id: str
    problem: str
    prompt_ids: tuple[int, ...]
    seed: int
    frontier: list[Beam] = field(default_factory=list)
    completed: list[Beam] = field(default_factory=list)
    iteration: int = 0
    done: bool = False
    # each ranking selection made: (the candidates' path scores before their newest step,
    # which of them it kept); how well the previous score predicts selection
    # (`eval.verifier_quality.selection_prediction`), the bet speculation makes
    selections: list[tuple[tuple[float, ...], tuple[bool, ...]]] = field(default_factory=list)


class SearchPolicy(ABC):
    """A search algorithm as a policy over the shared engine."""

    uses_verifier: bool = True
    stops_at_boundary: bool = True  # False: a whole solution is generated in one go
    # kept beams branch into `search.beam_width` children that share their parent's path:
    # `search.n` must be a multiple of it, and a planned KV working set counts the siblings
    # as sharing (`tts.assembly.memory_split`); False: the paths share only the prompt
    tree: ClassVar[bool] = False

    def __init__(self, cfg: SearchConfig, step_max_tokens: int, max_total_tokens: int) -> None:
        self.cfg = cfg
        self.step_max_tokens = step_max_tokens
        self.max_total_tokens = max_total_tokens

    def start(self, search: ProblemSearch) -> None:
        """Create the first frontier."""
        search.frontier = [
            Beam(search.problem_id, search.prompt_ids, child_seed(search.seed, i + 1, 0), group=i)
            for i in range(self.cfg.n)
        ]

    def is_last_iteration(self, search: ProblemSearch, ahead: int = 0) -> bool:
        """This iteration (or the one `ahead` iterations on) is the search's last."""
        return search.iteration + ahead >= self.cfg.max_iterations - 1

    def step_limit(self, beam: Beam, search: ProblemSearch) -> int:
        """The token limit of this beam's next step."""
        return min(self.step_max_tokens, self.max_total_tokens - beam.num_tokens)

    def indices_to_score(self, beam: Beam, search: ProblemSearch) -> tuple[int, ...]:
        """Which steps must carry a score before `select` (the score cache dedups)."""
        if not self.uses_verifier:
            return ()
        return tuple(range(beam.depth))

    def path_score(self, beam: Beam) -> float:
        return aggregate(beam.scores, self.cfg.aggregation)

    def finish_completed(self, search: ProblemSearch, now: float) -> list[Beam]:
        """Move finished paths out of the frontier; return those still active."""
        last = self.is_last_iteration(search)
        active = []
        for beam in search.frontier:
            if beam.is_finished_path or last:
                beam.state = BeamState.COMPLETE
                beam.completed_at = now
                search.completed.append(beam)
            else:
                active.append(beam)
        return active

    @abstractmethod
    def select(self, search: ProblemSearch, now: float) -> None:
        """Given a generated and scored frontier, set the next one (empty when done)."""

    def likely_kept(self, search: ProblemSearch) -> list[tuple[Beam, int]] | None:
        """A guess at what `select` would keep if it ran on the scores known now: the
        frontier beams it would keep, best first, each with its number of children. A
        beam whose new step is not scored yet ranks by the scores of its path so far;
        duplicate filtering is not guessed. Changes nothing; speculation uses it to
        choose what to generate ahead. None: the policy cannot tell (the default)."""
        return None

    def rejection_cut(self, search: ProblemSearch) -> int | None:
        """How many of the frontier's beams selection keeps in one ranking, for early
        rejection: a beam that at least this many others outrank cannot be kept. None:
        the policy's selection is not one ranking of the frontier (no early rejection)."""
        return None

    def ranked(self, beams: list[Beam], k: int) -> list[Beam]:
        """The k best by path score, best first (ties: earlier beam); marks nothing."""
        order = sorted(range(len(beams)), key=lambda i: (-self.path_score(beams[i]), i))
        return [beams[i] for i in order[:k]]

    def top_active(self, search: ProblemSearch, k: int) -> tuple[list[Beam], list[Beam]]:
        """The k beams `top_k` would keep of the frontier's unfinished ones on the scores
        known now: best first, and in frontier order (the order children are handed out)."""
        active = [b for b in search.frontier if not b.is_finished_path]
        best = self.ranked(active, k)
        chosen = {id(b) for b in best}
        return best, [b for b in active if id(b) in chosen]

    def finalize(self, search: ProblemSearch) -> list[Beam]:
        """The final candidates: top-N completed by score (or first N), padded to N."""
        beams = list(search.completed)
        if self.cfg.sort_completed and self.uses_verifier:
            beams.sort(key=self.path_score, reverse=True)
        beams = beams[: self.cfg.n]
        if beams and len(beams) < self.cfg.n:
            beams = (beams * (self.cfg.n // len(beams) + 1))[: self.cfg.n]
        return beams

    def top_k(self, beams: list[Beam], k: int, search: ProblemSearch | None = None) -> list[Beam]:
        """The k best by path score, in their order; ties keep the earlier beam. The rest
        are marked pruned. With `search`, the selection is noted in `search.selections`
        when it kept some and not all, and every candidate has a previous step."""
        keep = {id(b) for b in self.ranked(beams, k)}
        for beam in beams:
            if id(beam) not in keep:
                beam.state = BeamState.PRUNED
        if search is not None and 0 < len(keep) < len(beams) and all(b.depth >= 2 for b in beams):
            search.selections.append((tuple(aggregate(b.scores[:-1], self.cfg.aggregation) for b in beams),
                                      tuple(id(b) in keep for b in beams)))
        return [b for b in beams if id(b) in keep]

    def dedup(self, beams: list[Beam]) -> list[Beam]:
        if not self.cfg.filter_duplicates:
            return beams
        seen, out = set(), []
        for beam in beams:
            if beam.text in seen:
                beam.state = BeamState.PRUNED
                continue
            seen.add(beam.text)
            out.append(beam)
        return out


def expand_counts(kept: int, n: int) -> list[int]:
    """How many children each of `kept` beams gets from `expand` (in their order)."""
    if not kept:
        return []
    return [n // kept + (1 if i < n % kept else 0) for i in range(kept)]


def expand(kept: list[Beam], n: int) -> list[Beam]:
    """search-and-learn's refill: repeat the kept beams in order up to n.

    The k-th occurrence of a beam is its child k; child 0 keeps the parent's seed.
    """
    if not kept:
        return []
    repeated = (kept * (n // len(kept) + 1))[:n]
    seen: dict[int, int] = {}
    out = []
    for beam in repeated:
        k = seen.get(beam.uid, 0)
        seen[beam.uid] = k + 1
        out.append(beam.fork(beam.seed_of_child(k)))
    return out
