"""Beam search with search-and-learn's semantics."""

from __future__ import annotations

from tts.search.base import ProblemSearch, SearchPolicy, expand, expand_counts
from tts.search.tree import Beam


class BeamSearch(SearchPolicy):
    """N candidates per iteration; keep the top N/M; each kept beam gets M children."""

    tree = True

    def select(self, search: ProblemSearch, now: float) -> None:
        active = self.dedup(self.finish_completed(search, now))
        kept = self.top_k(active, self.cfg.n // self.cfg.beam_width, search)
        search.frontier = expand(kept, self.cfg.n)

    def rejection_cut(self, search: ProblemSearch) -> int:
        return self.cfg.n // self.cfg.beam_width

    def likely_kept(self, search: ProblemSearch) -> list[tuple[Beam, int]]:
        if self.is_last_iteration(search):
            return []
        best, in_order = self.top_active(search, self.cfg.n // self.cfg.beam_width)
        counts = {id(b): c for b, c in zip(in_order, expand_counts(len(in_order), self.cfg.n))}
        return [(b, counts[id(b)]) for b in best]
