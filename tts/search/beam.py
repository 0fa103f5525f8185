"""Beam search with search-and-learn's semantics."""

from __future__ import annotations

from tts.search.base import ProblemSearch, SearchPolicy, expand


class BeamSearch(SearchPolicy):
    """N candidates per iteration; keep the top N/M; each kept beam gets M children."""

    def select(self, search: ProblemSearch, now: float) -> None:
        active = self.dedup(self.finish_completed(search, now))
        kept = self.top_k(active, self.cfg.n // self.cfg.beam_width)
        search.frontier = expand(kept, self.cfg.n)
