"""Diverse verifier tree search: N/M independent subtrees, each keeps its best child."""

from __future__ import annotations

from tts.search.base import ProblemSearch, SearchPolicy
from tts.search.tree import Beam, BeamState, child_seed


class DVTS(SearchPolicy):
    """Each subtree expands its beam into M children and keeps only the best one.

    A subtree completes when its best child finishes the path; the final candidates are
    the subtrees' beams (N/M of them, padded to N by `finalize`).
    """

    tree = True

    def start(self, search: ProblemSearch) -> None:
        m, subtrees = self.cfg.beam_width, self.cfg.n // self.cfg.beam_width
        search.frontier = [
            Beam(search.problem_id, search.prompt_ids, child_seed(search.seed, 1 + g * m + k, 0), group=g)
            for g in range(subtrees) for k in range(m)
        ]

    def select(self, search: ProblemSearch, now: float) -> None:
        last = self.is_last_iteration(search)
        groups: dict[int, list[Beam]] = {}
        for beam in search.frontier:
            groups.setdefault(beam.group, []).append(beam)
        frontier = []
        for group in groups.values():
            best = self.top_k(group, 1, search)[0]
            if best.is_finished_path or last:
                best.state = BeamState.COMPLETE
                best.completed_at = now
                search.completed.append(best)
            else:
                frontier += [best.fork(best.seed_of_child(k)) for k in range(self.cfg.beam_width)]
        search.frontier = frontier

    def likely_kept(self, search: ProblemSearch) -> list[tuple[Beam, int]]:
        if self.is_last_iteration(search):
            return []
        groups: dict[int, list[Beam]] = {}
        for beam in search.frontier:
            groups.setdefault(beam.group, []).append(beam)
        best = [self.ranked(group, 1)[0] for group in groups.values()]
        best = self.ranked([b for b in best if not b.is_finished_path], len(best))
        return [(b, self.cfg.beam_width) for b in best]
