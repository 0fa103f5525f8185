"""Dynamic branching: a kept beam's number of children is proportional to its score."""

from __future__ import annotations

from tts.search.base import ProblemSearch, SearchPolicy
from tts.search.tree import Beam, BeamState


def branch_counts(scores: list[float], total: int) -> list[int]:
    """Split `total` children proportionally to scores (largest remainder, ties to earlier)."""
    weights = [max(s, 0.0) for s in scores]
    mass = sum(weights)
    if mass <= 0:
        weights, mass = [1.0] * len(scores), float(len(scores))
    exact = [w * total / mass for w in weights]
    counts = [int(e) for e in exact]
    order = sorted(range(len(scores)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


class DynamicBranching(SearchPolicy):
    """Keep the top N/M like beam search, then give each survivor children in
    proportion to its path score, N in total; a survivor given none is pruned."""

    tree = True

    def select(self, search: ProblemSearch, now: float) -> None:
        active = self.dedup(self.finish_completed(search, now))
        kept = self.top_k(active, self.cfg.n // self.cfg.beam_width, search)
        counts = branch_counts([self.path_score(b) for b in kept], self.cfg.n)
        frontier: list[Beam] = []
        for beam, count in zip(kept, counts):
            if count == 0:
                beam.state = BeamState.PRUNED
            frontier += [beam.fork(beam.seed_of_child(k)) for k in range(count)]
        search.frontier = frontier

    def likely_kept(self, search: ProblemSearch) -> list[tuple[Beam, int]]:
        if self.is_last_iteration(search):
            return []
        best, in_order = self.top_active(search, self.cfg.n // self.cfg.beam_width)
        counts = {id(b): c for b, c in zip(in_order, branch_counts([self.path_score(b) for b in in_order],
                                                                     self.cfg.n))}
        return [(b, counts[id(b)]) for b in best if counts[id(b)] > 0]
