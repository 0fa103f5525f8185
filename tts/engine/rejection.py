"""Early rejection (`optim.early_reject`; Speculative Rejection and early rejection with
partial PRM scores in spirit): one mechanism, which each discipline calls at its own times.

Every `reject_interval` generator steps, while a real request decodes a step that
selection could prune (`ripe`), the verifier scores the steps still decoding as they stand
(partial steps), each once it has grown by `reject_interval` tokens since it began or was
last so scored. A decoding step is rejected when at least `keep` others of its problem that
selection could keep (`SearchPolicy.rejection_cut`: N/M for beam search) estimate above it
by more than `reject_margin`; its request stops, its beam leaves the frontier, and the
problem's selection runs without it (`cut`). Only where the verifier reads partial steps
(`Verifier.reads_partial_steps`: the LLM judge does; the PRM heads are trained on whole
steps).

The disciplines differ only in when the call comes and where the other beams' estimates
come from (`cut`'s `others`):

- barrier (`barrier.py`): every step starts with its iteration, so all are ripe together;
  the call also scores the iteration's finished steps whole (committed to their beams as
  they finish; the iteration's own scoring reads them back from the score cache);
- decoupled (`decoupled.py`): the LLM round ends when a call is due, the PRM scores its
  queue first (steps already committed: their path scores), then the partial call.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Sequence

from tts.engine.messages import Purpose, Score
from tts.engine.model_runner import ModelRunner
from tts.engine.options import AdaptiveOptions, EngineOptions, shape_of
from tts.engine.problem import Problem
from tts.engine.requests import Request
from tts.engine.scoring import ScoreItem
from tts.metrics.events import BeamsRejected
from tts.search.base import ProblemSearch, SearchPolicy, aggregate
from tts.search.tree import Beam, BeamState

log = logging.getLogger(__name__)


class EarlyRejection:
    """Early rejection inside a step (the module docstring)."""

    def __init__(self, opts: AdaptiveOptions, policy: SearchPolicy, decode) -> None:
        self.opts = opts
        self.policy = policy
        self.decode = decode
        self.steps_since = 0  # generator steps since the last partial scoring
        self.estimates: dict[int, float] = {}  # beam uid -> estimated path score, at the last call
        self._gone: dict[str, list[tuple[Request, float]]] = {}  # rejected this iteration, by problem
        # a request's tokens when its step was last scored as it stood (it dies with the request)
        self._scored_at: weakref.WeakKeyDictionary[Request, int] = weakref.WeakKeyDictionary()

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
                and len(r.tokens) - self._scored_at.get(r, 0) >= self.opts.reject_interval)

    def call(self, problems: Sequence[Problem], requests_of: Callable[[Problem], Sequence[Request]],
             charge: tuple[str, ...] | None = None) -> Score | None:
        """The partial call over `problems` (`items` of each one's `requests_of`), charged to
        `charge` (default: the problems it scores); None when it has nothing to score. The
        interval starts again either way."""
        self.steps_since = 0
        items = [i for p in problems for i in self.items(p.input.problem, p.search, requests_of(p))]
        if not items:
            return None
        return Score(items, charge or tuple(dict.fromkeys(i.beam.problem_id for i in items)), Purpose.REJECT)

    def items(self, problem: str, search: ProblemSearch, requests: Sequence[Request]) -> list[ScoreItem]:
        """The partial call's items for one problem: ripe running steps as they stand,
        finished ones (committed) whole, where their score is still missing."""
        self.steps_since = 0
        out = []
        for r in requests:
            if r.to_eos or r.rejected or not r.tokens or r.beam.is_finished_path:
                continue  # (a finished request's beam holds its step: this skips one that completes its path)
            if r.finished:
                if r.beam.scores[-1] is None:
                    out.append(ScoreItem(r.beam, problem, (r.beam.depth - 1,)))
            elif self.ripe(r):
                self._scored_at[r] = len(r.tokens)
                out.append(ScoreItem(r.beam, problem, (), partial_step=self.decode(r.tokens)))
        return out

    def cut(self, problem: Problem, decoding: Sequence[Request], partial: dict[int, float],
            others: dict[int, float], stop: Callable[[list[Request]], None]) -> list[Request]:
        """Reject the decoding steps of `problem` that cannot make the cut (`rejected`) on
        the partial scores just made and the `others`' estimates; `stop` stops their
        requests; their beams leave the frontier (counted at the selection). Returns them."""
        gone = self.rejected(problem.search, decoding, partial, others)
        if not gone:
            return gone
        self.note(problem.id, gone)
        stop(gone)
        uids = {r.beam.uid for r in gone}
        problem.search.frontier = [b for b in problem.search.frontier if b.uid not in uids]
        problem.waiting -= uids
        for r in gone:
            r.rejected = True
            r.beam.state = BeamState.PRUNED
        return gone

    def rejected(self, search: ProblemSearch, decoding: Sequence[Request], partial: dict[int, float],
                 others: dict[int, float]) -> list[Request]:
        """The decoding requests whose beams cannot make the cut: at least `keep` others
        that selection could keep estimate above theirs by more than the margin. `partial`
        holds the partial steps' scores by beam uid; `others` the estimated path scores of
        the problem's other beams whose step is whole (scored, committed or not)."""
        keep = self.policy.rejection_cut(search)
        if keep is None:
            return []
        agg = self.policy.cfg.aggregation
        est: dict[int, float] = dict(others)
        for r in decoding:
            score = partial.get(r.beam.uid)
            if not r.rejected and score is not None:
                est[r.beam.uid] = aggregate(list(r.beam.scores) + [score], agg)
        self.estimates = est
        out = []
        for r in decoding:
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


def early_rejection(opts: EngineOptions, policy: SearchPolicy, runner: ModelRunner) -> EarlyRejection | None:
    """The run's early rejection: None when `optim.early_reject` is off, or (with a
    warning) when the verifier (the one the engine decides for, `shape_of`) cannot read a
    partial step."""
    if not opts.adaptive.early_reject:
        return None
    shape = shape_of(opts, runner.verifier)
    if shape is None or not shape.reads_partial_steps:
        log.warning("optim.early_reject: off, the verifier does not read partial steps")
        return None
    return EarlyRejection(opts.adaptive, policy, runner.gen.decode)
