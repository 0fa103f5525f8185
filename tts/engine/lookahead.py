"""Lookahead verification: a beam's next step, held in its speculative tokens, scored
before its iteration asks for it (the barrier schedule's; the decoupled schedule's PRM
never sees a speculative step).

Lookahead comes in two scopes. `all` is the paper's: every beam whose speculative tokens
hold a whole next step has it scored in the same verifier call as its current step, which
is nearly free where a PRM reads every step of a path in one pass. Where the verifier asks
once per score (an LLM judge), each lookahead score is a request of its own and most of
them belong to beams that selection is about to prune (beam search keeps 1 in M); `kept`
then scores the current steps first and looks ahead only for the beams the policy keeps
on those scores (`likely_kept`, exact for beam search but for duplicate filtering), in a
second, smaller call. `auto` picks `all` for a whole-path PRM and no lookahead at all for a
per-score verifier: there a kept beam's lookahead score is the very request the next
iteration would make (same prompt, same prefix in the cache), so `kept` moves work one
iteration earlier without saving any, and its second call costs a verifier step per
iteration. `kept` stays available by name.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tts.config.enums import LookaheadScope
from tts.engine.model_runner import ModelRunner
from tts.engine.options import EngineOptions, shape_of
from tts.engine.problem import Problem
from tts.engine.scoring import ScoreItem
from tts.engine.speculation.policy import next_runs_to_eos, held_step
from tts.engine.step_cutter import StepCutter
from tts.search.base import ProblemSearch, SearchPolicy
from tts.search.tree import Beam

log = logging.getLogger(__name__)


def lookahead_scope(value: LookaheadScope | str) -> LookaheadScope:
    """The scope by name; a ValueError names the valid choices."""
    try:
        return LookaheadScope(value)
    except ValueError:
        choices = ", ".join(s.value for s in LookaheadScope)
        raise ValueError(f"lookahead_scope: {value!r}; valid choices: {choices}") from None


class Lookahead:
    """Which beams' next steps are scored ahead, and in which call (module docstring):
    `item` is a beam's item in the iteration's call (with its next step where the scope is
    `all`); `ahead` the second call's items where it is `kept`."""

    def __init__(self, opts: EngineOptions, policy: SearchPolicy, runner: ModelRunner, cut: StepCutter) -> None:
        self.opts, self.policy, self.runner, self.cut = opts, policy, runner, cut
        scope = lookahead_scope(opts.lookahead_scope)
        shape = shape_of(opts, runner.verifier)
        per_score = shape is not None and shape.request_per_score
        # auto with a per-score verifier: nothing to gain (module docstring)
        self.on = opts.lookahead and not (scope is LookaheadScope.auto and per_score)
        if opts.lookahead and not self.on:
            log.info("lookahead: off (scope auto, the verifier asks once per score: a lookahead "
                     "score would be the next iteration's own request, one verifier call early)")
        # score ahead only for kept beams, in a second call after the current steps' scores
        self.kept = self.on and scope is LookaheadScope.kept

    def item(self, p: Problem, beam: Beam) -> ScoreItem:
        """The beam's item in the iteration's verifier call."""
        indices = self.policy.indices_to_score(beam, p.search)
        look = None
        if self.on and not self.kept and indices:
            look = self.step(beam, p.search)
        return ScoreItem(beam, p.input.problem, indices, look)

    def ahead(self, live: Sequence[Problem]) -> list[ScoreItem]:
        """Scope `kept`: the next steps of the beams selection keeps on the scores just made
        (all of them where the policy cannot tell), for a second call."""
        out = []
        for p in live:
            kept = self.policy.likely_kept(p.search)
            for beam in (list(p.search.frontier) if kept is None else [b for b, _ in kept]):
                if (look := self.step(beam, p.search)) is not None:
                    out.append(ScoreItem(beam, p.input.problem, (), look))
        return out

    def step(self, beam: Beam, search: ProblemSearch) -> str | None:
        """The text of the whole next step in the beam's speculative tokens, if they hold
        one; none when the next iteration samples to EOS (its step is the rest of the
        path, not the step its tokens hold, so a score made now would never be read)."""
        if not beam.spec_tokens or next_runs_to_eos(self.opts, self.policy, search):
            return None
        probe = held_step(self.cut, self.policy, beam, search)
        if probe.end is None or not probe.tokens:
            return None
        return self.runner.gen.decode(probe.tokens)
