"""Early rejection on the decoupled schedule (`optim.early_reject`): the barrier's rule
(`adaptive.EarlyRejection`), at the decoupled schedule's times.

Every `reject_interval` generator steps (counted across LLM rounds) while a real request
decodes a step that selection could prune, the LLM round ends. The PRM scores its queue
first (steps already committed), then one call scores the steps still decoding as they
stand (partial steps), each once it has grown by `reject_interval` tokens since it began
or was last so scored (`EarlyRejection.ripe`). A decoding step is rejected when at least `keep` others of its
problem that selection could keep (`SearchPolicy.rejection_cut`) estimate above it by more
than `reject_margin`: beams whose new step is committed and scored (their path score) and
other decoding steps (their path with the partial step's score). Its request stops, its
beam leaves the frontier, and the problem's selection runs without it once the rest are
ready. Only where the verifier reads partial steps (the LLM judge does).
"""

from __future__ import annotations

from collections.abc import Sequence

from tts.engine.adaptive import EarlyRejection
from tts.engine.model_runner import ModelRunner
from tts.engine.requests import Request, RequestKind, RequestState
from tts.engine.schedule import Problem, Purpose, Score, next_unscored
from tts.search.base import SearchPolicy
from tts.search.tree import BeamState


class DecoupledRejection:
    """Early rejection's calls and cuts for the decoupled schedule (module docstring)."""

    def __init__(self, rejection: EarlyRejection, runner: ModelRunner, policy: SearchPolicy) -> None:
        self.rule = rejection
        self.runner = runner
        self.policy = policy

    def decoding(self, problem: Problem | None = None) -> list[Request]:
        """The real requests still decoding their step (of `problem`, or all)."""
        return [r for r in self.runner.requests.values()
                if r.kind is not RequestKind.SPEC and not r.finished and (problem is None or r.problem is problem)]

    def due(self) -> bool:
        """A partial scoring is due (`EarlyRejection.due`)."""
        return self.rule.due(self.decoding())

    def call(self, live: Sequence[Problem]) -> Score | None:
        """The partial call: every decoding step as it stands; None when none has tokens
        (the interval starts again either way)."""
        self.rule.steps_since = 0
        items = [i for p in live for i in self.rule.items(p.input.problem, p.search, self.decoding(p))]
        charge = tuple(dict.fromkeys(i.beam.problem_id for i in items))
        return Score(items, charge, Purpose.REJECT) if items else None

    def reject(self, live: Sequence[Problem], partial: dict[int, float]) -> bool:
        """Stop the decoding steps that cannot make the cut on the scores just made; their
        beams leave the frontier. True when one was rejected."""
        any_gone = False
        for p in live:
            mine = self.decoding(p)
            settled = {b.uid: self.policy.path_score(b) for b in p.search.frontier
                       if b.uid not in p.waiting and not b.is_finished_path
                       and next_unscored(self.policy, p.search, b) is None}
            gone = self.rule.rejected(p.search, mine, partial, {}, settled) if mine else []
            if not gone:
                continue
            any_gone = True
            self.rule.note(p.id, gone)
            self.runner.stop(gone, RequestState.ABORTED)
            uids = {r.beam.uid for r in gone}
            p.search.frontier = [b for b in p.search.frontier if b.uid not in uids]
            p.waiting -= uids
            for r in gone:
                r.rejected = True
                r.beam.state = BeamState.PRUNED
        return any_gone
