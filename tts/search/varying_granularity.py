"""Varying granularity: short steps early, long steps later, and verification every k steps."""

from __future__ import annotations

from tts.search.base import ProblemSearch, expand
from tts.search.beam import BeamSearch
from tts.search.tree import Beam


class VaryingGranularity(BeamSearch):
    """Beam search whose step limit depends on depth (`early_step_max_tokens` for the
    first `early_steps` steps), and which verifies and prunes only every `verify_every`
    iterations; in between, every candidate continues with one child."""

    def step_limit(self, beam: Beam, search: ProblemSearch) -> int:
        limit = self.cfg.early_step_max_tokens if beam.depth < self.cfg.early_steps else self.step_max_tokens
        return min(limit, self.max_total_tokens - beam.num_tokens)

    def _verifies(self, search: ProblemSearch) -> bool:
        return (search.iteration + 1) % self.cfg.verify_every == 0 or self.is_last_iteration(search)

    def indices_to_score(self, beam: Beam, search: ProblemSearch) -> tuple[int, ...]:
        return super().indices_to_score(beam, search) if self._verifies(search) else ()

    def select(self, search: ProblemSearch, now: float) -> None:
        if self._verifies(search):
            super().select(search, now)
            return
        active = self.finish_completed(search, now)
        search.frontier = expand(active, len(active))

    def likely_kept(self, search: ProblemSearch) -> list[tuple[Beam, int]]:
        if self._verifies(search):
            return super().likely_kept(search)
        active = [b for b in search.frontier if not b.is_finished_path]
        return [(b, 1) for b in self.ranked(active, len(active))]  # certain: nothing is pruned
