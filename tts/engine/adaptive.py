"""Adaptive compute (ours, beyond FlashTTS): spend less where the search has decided.

Two policies, each with its own switch, off in every FlashTTS preset:

- **Early exit** (`AnswerSettling`; Dynasor's Certaindex in spirit): a problem's search
  stops once the answers of its best completed candidates agree, by `exit_agree` of the
  `exit_top` best (at most n/2: `top_compared`; answers grouped by our grader's
  equivalence), for `exit_patience`
  consecutive iterations; or, with `exit_plateau` > 0, once its best path score gained
  less than that for as many iterations. The candidates are the paths completed so far.
- **Early rejection** (`EarlyRejection`; Speculative Rejection and early rejection with
  partial PRM scores in spirit): every `reject_interval` generator steps the verifier
  scores the steps still decoding as they stand (partial steps) and the steps already
  finished (whole, into the score cache, so the iteration's own scoring reads them
  back). A beam whose estimated path score, with its partial step, lies more than
  `reject_margin` below `keep` others that selection could keep (`SearchPolicy.
  rejection_cut`: N/M for beam search) is rejected: its request stops, and selection
  runs without it. Only where the verifier reads partial steps (`Verifier.
  reads_partial_steps`: the LLM judge does; the PRM heads are trained on whole steps).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from eval.accuracy import group_answers
from eval.extract import extract_answer
from tts.engine.options import AdaptiveOptions
from tts.engine.requests import Request
from tts.engine.scoring import ScoreItem
from tts.engine.steps import completes_path
from tts.metrics.events import BeamsRejected
from tts.search.base import ProblemSearch, SearchPolicy, aggregate
from tts.search.tree import Beam

if TYPE_CHECKING:
    from tts.engine.model_runner import ModelRunner

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


class EarlyRejection:
    """Early rejection inside a step (the module docstring)."""

    def __init__(self, opts: AdaptiveOptions, policy: SearchPolicy, decode) -> None:
        self.opts = opts
        self.policy = policy
        self.decode = decode
        self.steps_since = 0  # generator steps since the last partial scoring
        self.estimates: dict[int, float] = {}  # beam uid -> estimated path score, at the last call
        self._gone: dict[str, list[tuple[Request, float]]] = {}  # rejected this iteration, by problem

    def begin(self) -> None:
        self.steps_since = 0
        self.estimates = {}

    def stepped(self) -> None:
        """One more generator step ran."""
        self.steps_since += 1

    def due(self, running: Sequence[Request]) -> bool:
        """A partial scoring is due: `reject_interval` steps passed and a running step
        is ripe for one (`ripe`)."""
        return self.steps_since >= self.opts.reject_interval and any(self.ripe(r) for r in running)

    def ripe(self, r: Request) -> bool:
        """A step still decoding that selection could prune, grown by `reject_interval`
        tokens since it began or was last scored as it stood. A step a few tokens old says
        little beyond its path's score: on the decoupled schedule, where steps start at
        any time, scoring those would cost more verifier calls than rejection saves (on
        the barrier every step starts with its iteration, so all are ripe together)."""
        return (not (r.to_eos or r.rejected or r.finished or r.beam.is_finished_path)
                and len(r.tokens) - r.partial_at >= self.opts.reject_interval)

    def items(self, problem: str, search: ProblemSearch, requests: Sequence[Request]) -> list[ScoreItem]:
        """The partial call's items for one problem: ripe running steps as they stand,
        finished ones whole (scored into the cache, as lookahead steps are)."""
        self.steps_since = 0
        out = []
        for r in requests:
            if r.to_eos or r.rejected or not r.tokens or r.beam.is_finished_path:
                continue
            text = self.decode(r.tokens)
            if r.finished:
                out.append(ScoreItem(r.beam, problem, (), lookahead_step=text, early=True))
            elif self.ripe(r):
                r.partial_at = len(r.tokens)
                out.append(ScoreItem(r.beam, problem, (), partial_step=text))
        return out

    def rejected(self, search: ProblemSearch, requests: Sequence[Request], partial: dict[int, float],
                 cached: dict[int, float], settled: dict[int, float] | None = None) -> list[Request]:
        """The running requests whose beams cannot make the cut: at least `keep` others
        that selection could keep estimate above theirs by more than the margin.
        `partial` and `cached` hold the new step's score by beam uid (partial steps,
        finished steps not yet committed); `settled` the path scores of beams whose new
        step is committed and scored already (the decoupled schedule's)."""
        keep = self.policy.rejection_cut(search)
        if keep is None:
            return []
        agg = self.policy.cfg.aggregation
        est: dict[int, float] = dict(settled or {})
        for r in requests:
            score = partial.get(r.beam.uid, cached.get(r.beam.uid))
            if r.rejected or score is None or (r.finished and completes_path(r, self.decode)):
                continue
            est[r.beam.uid] = aggregate(list(r.beam.scores) + [score], agg)
        self.estimates = est
        out = []
        for r in requests:
            mine = est.get(r.beam.uid)
            if r.finished or r.rejected or r.to_eos or mine is None or r.beam.uid not in partial:
                continue
            above = sum(1 for uid, e in est.items() if uid != r.beam.uid and e > mine + self.opts.reject_margin)
            if above >= keep:
                out.append(r)
        return out

    def note(self, problem_id: str, gone: Sequence[Request]) -> None:
        """Requests just rejected, with their estimates, counted at the selection (`settle`)."""
        self._gone.setdefault(problem_id, []).extend((r, self.estimates.get(r.beam.uid, -1.0)) for r in gone)

    def settle(self, problem_id: str, lengths: Sequence[int], kept: Sequence[Beam]) -> BeamsRejected | None:
        """The iteration's rejections, at its selection: how many; the tokens their steps
        would still have taken, estimated from `lengths` (the iteration's steps: the mean of
        those longer than a rejected step had, else its step's token limit); and how many
        ended above selection's cut (the lowest path score of the `kept` parents)."""
        gone = self._gone.pop(problem_id, [])
        if not gone:
            return None
        saved = 0
        for request, _ in gone:
            longer = [n for n in lengths if n > len(request.tokens)]
            total = sum(longer) / len(longer) if longer else request.limit
            saved += max(0, round(total) - len(request.tokens))
        cut = min((self.policy.path_score(b) for b in kept), default=None)
        above = sum(1 for _, estimate in gone if cut is not None and estimate >= cut)
        return BeamsRejected(problem_id, len(gone), saved, above)


def early_rejection(opts: AdaptiveOptions, policy: SearchPolicy, runner: ModelRunner) -> EarlyRejection | None:
    """The run's early rejection: None when `optim.early_reject` is off, or (with a
    warning) when the verifier cannot read a partial step."""
    verifier = runner.verifier
    if not opts.early_reject:
        return None
    if verifier is None or not verifier.reads_partial_steps:
        log.warning("optim.early_reject: off, the verifier does not read partial steps")
        return None
    return EarlyRejection(opts, policy, runner.gen.decode)
