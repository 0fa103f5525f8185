"""Independent samples: best-of-N (verifier-scored) and self-consistency (majority vote).

With `search.sample_wave` = k > 0 the N samples come k at a time, one iteration each,
sample i with the seed it has in one wave of N: with early exit (`optim.early_exit`)
that is adaptive sampling, which stops drawing once the answers agree; without it, the
same N samples.
"""

from __future__ import annotations

from tts.search.base import ProblemSearch, SearchPolicy
from tts.search.tree import Beam, BeamState, child_seed


class BestOfN(SearchPolicy):
    """N full solutions in one generation each; every step is scored at the end."""

    stops_at_boundary = False

    def start(self, search: ProblemSearch) -> None:
        search.frontier = self._wave(search, 0)

    def _wave(self, search: ProblemSearch, drawn: int) -> list[Beam]:
        """The next wave of samples after `drawn` of them (all N without waves)."""
        k = self.cfg.sample_wave or self.cfg.n
        return [Beam(search.problem_id, search.prompt_ids, child_seed(search.seed, i + 1, 0), group=i)
                for i in range(drawn, min(self.cfg.n, drawn + k))]

    def step_limit(self, beam: Beam, search: ProblemSearch) -> int:
        return self.max_total_tokens - beam.num_tokens

    def select(self, search: ProblemSearch, now: float) -> None:
        for beam in search.frontier:
            beam.state = BeamState.COMPLETE
            beam.completed_at = now
            search.completed.append(beam)
        search.frontier = self._wave(search, len(search.completed)) if self.cfg.sample_wave else []


class SelfConsistency(BestOfN):
    """N full solutions, no verifier: the answer is the majority vote."""

    uses_verifier = False
