"""Adaptive compute (ours, beyond FlashTTS): spend less where the search has decided.

Two policies, each with its own switch, off in every FlashTTS preset:

- **Early exit** (`AnswerSettling`; Dynasor's Certaindex in spirit): a problem's search
  stops once the answers of its best completed candidates agree, by `exit_agree` of the
  `exit_top` best (at most n/2: `top_compared`; answers grouped by our grader's
  equivalence), for `exit_patience`
  consecutive iterations; or, with `exit_plateau` > 0, once its best path score gained
  less than that for as many iterations. The candidates are the paths completed so far.
- **Early rejection** (`tts.engine.rejection`): steps still decoding are scored as they
  stand, and a beam that cannot make selection's cut stops before its step ends.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

from eval.accuracy import group_answers
from eval.extract import extract_answer
from tts.engine.options import AdaptiveOptions
from tts.search.base import ProblemSearch, SearchPolicy
from tts.search.tree import Beam

log = logging.getLogger(__name__)


def top_compared(exit_top: int, n: int) -> int:
    """How many of the best completed candidates early exit compares: `exit_top`, at most
    half the search's `n` (at least 1). A search ends once n candidates have completed (or
    n samples are drawn), so a larger `exit_top` could never agree before the end and the
    switch would do nothing: the presets' 4 is meant for N=16, and compares 2 at N=4."""
    top = min(exit_top, max(1, n // 2))
    if top < exit_top:
        log.warning("optim.exit_top=%d with search.n=%d: early exit compares the best %d completed candidates "
                    "(at most n/2: the search ends once n have completed)", exit_top, n, top)
    return top


class AnswerSettling:
    """Early exit: whether a problem's answer has settled (the module docstring)."""

    def __init__(self, opts: AdaptiveOptions, policy: SearchPolicy, equiv=None) -> None:
        self.opts = opts
        self.policy = policy
        self.equiv = equiv  # answer equivalence; default: the grader's
        self.top = top_compared(opts.exit_top, policy.cfg.n)
        self._streak: dict[str, int] = {}
        self._best: dict[str, float] = {}

    def settled(self, search: ProblemSearch) -> bool:
        """Call once per iteration, after selection: True when the search may stop."""
        pid, o = search.problem_id, self.opts
        agree = self._agreement(search.completed) >= o.exit_agree
        plateau = False
        if o.exit_plateau > 0:
            best = max((self.policy.path_score(b) for b in search.frontier + search.completed), default=0.0)
            prev = self._best.get(pid)
            plateau = prev is not None and best - prev < o.exit_plateau
            self._best[pid] = best if prev is None else max(prev, best)
        self._streak[pid] = self._streak.get(pid, 0) + 1 if agree or plateau else 0
        return self._streak[pid] >= o.exit_patience

    def _agreement(self, completed: Sequence[Beam]) -> float:
        """The share of the `exit_top` best answered candidates in the largest group of
        equivalent answers (0 while fewer have an answer). Without a verifier to rank them
        (self-consistency) every answered candidate counts: adaptive self-consistency."""
        if self.policy.uses_verifier:
            ranked = sorted(completed, key=lambda b: -self.policy.path_score(b))
            answers = [a for b in ranked if (a := extract_answer(b.text))][: self.top]
        else:
            answers = [a for b in completed if (a := extract_answer(b.text))]
        if len(answers) < self.top:
            return 0.0
        labels = group_answers(answers, self.equiv)
        return max(Counter(labels).values()) / len(answers)

    def forget(self, problem_id: str) -> None:
        self._streak.pop(problem_id, None)
        self._best.pop(problem_id, None)
