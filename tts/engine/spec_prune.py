"""Speculation pruning (`optim.spec_prune`): a scoring call the barrier adds in the middle
of generation.

Once per iteration, when the real requests still decoding are down to the beams selection
keeps, the finished steps not scored yet are scored whole (they are committed to their
beams as they finish; the iteration's own scoring reads them back from the score cache,
so no score is computed twice). Then every beam
whose finished step cannot make selection's cut on the scores known stops speculating:
at least `rejection_cut` other finished steps (distinct paths where selection filters
duplicates) score strictly above it. Steps that end their path do not compete, and the
steps still decoding can only push a beam further down, so no beam selection keeps is
ever pruned. Early rejection's calls serve it too: their finished steps' scores are in the
cache as well.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tts.engine.barrier_generation import IterationGeneration
from tts.engine.model_runner import ModelRunner
from tts.engine.requests import Request
from tts.engine.problem import Problem
from tts.engine.scoring import ScoreCache, ScoreItem
from tts.metrics.events import SpeculationPruned
from tts.search.base import SearchPolicy, aggregate


class SpeculationPruning:
    """When the pruning call is due in an iteration, its items, and the pruning itself
    (module docstring). `requests_of(problem)` gives a problem's requests this iteration."""

    def __init__(self, policy: SearchPolicy, runner: ModelRunner, cache: ScoreCache,
                 generation: IterationGeneration, requests_of: Callable[[Problem], list[Request]],
                 emit: Callable) -> None:
        self.policy, self.runner, self.cache = policy, runner, cache
        self.generation, self.requests_of, self.emit = generation, requests_of, emit
        self._at = 0  # due once the real requests decoding are down to this many
        self._done = False

    def begin(self, live: Sequence[Problem]) -> None:
        """A new iteration: due once its real requests decoding are down to the beams kept."""
        self._done = False
        self._at = sum(k for p in live if (k := self.policy.rejection_cut(p.search)) is not None)

    def due(self) -> bool:
        """The call is due now (once an iteration): speculation runs or waits, and the real
        requests decoding are down to the beams selection keeps. Taking it marks it done."""
        if self._done or not self.generation.speculating() or len(self.generation.running()) > self._at:
            return False
        self._done = True
        return True

    def items(self, live: Sequence[Problem]) -> list[ScoreItem]:
        """The finished steps (committed to their beams) not scored yet, whole."""
        return [ScoreItem(r.beam, p.input.problem, (r.beam.depth - 1,))
                for p in live for r in self.requests_of(p)
                if r.finished and not (r.rejected or r.to_eos or r.cut_into_steps) and r.tokens
                and r.beam.scores[-1] is None and not self.cache.has(p.id, r.beam.step_texts)]

    def prune(self, live: Sequence[Problem]) -> None:
        """Stop the speculation of every beam whose finished step cannot make the cut."""
        cache = self.cache
        agg, dedup = self.policy.cfg.aggregation, self.policy.cfg.filter_duplicates
        for p in live:
            keep = self.policy.rejection_cut(p.search)
            if keep is None or self.policy.is_last_iteration(p.search):
                continue
            est: dict[int, tuple[float, tuple[str, ...]]] = {}
            for r in self.requests_of(p):
                # a step that completes its path (EOS, an answer, the path's budget) does not compete
                if not r.finished or r.rejected or r.to_eos or r.cut_into_steps or r.beam.is_finished_path:
                    continue
                if cache.fill_last(r.beam) is not None:
                    est[r.beam.uid] = (aggregate(r.beam.scores, agg), r.beam.step_texts)
            out = set()
            for uid, (mine, path) in est.items():
                above = {other if dedup else o for o, (e, other) in est.items()
                         if o != uid and e > mine and not (dedup and other == path)}
                if len(above) >= keep:
                    out.add(uid)
            if out:
                self.emit(SpeculationPruned(p.id, len(out), self.generation.stop_speculating(out)))
