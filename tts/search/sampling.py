"""Independent samples: best-of-N (verifier-scored) and self-consistency (majority vote)."""

from __future__ import annotations

from tts.search.base import ProblemSearch, SearchPolicy
from tts.search.tree import Beam, BeamState


class BestOfN(SearchPolicy):
    """N full solutions in one generation each; every step is scored at the end."""

    stops_at_boundary = False

    def step_limit(self, beam: Beam, search: ProblemSearch) -> int:
        return self.max_total_tokens - beam.num_tokens

    def select(self, search: ProblemSearch, now: float) -> None:
        for beam in search.frontier:
            beam.state = BeamState.COMPLETE
            beam.completed_at = now
            search.completed.append(beam)
        search.frontier = []


class SelfConsistency(BestOfN):
    """N full solutions, no verifier: the answer is the majority vote."""

    uses_verifier = False
