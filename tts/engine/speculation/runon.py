"""Run-on (`optim.spec_rule=runon`, the default), the paper's speculative extension
(Algorithm 1), as a start rule of the barrier in the mechanism's run-on mode
(`StartRule.runs_on`, `iteration.py`).

A request whose step finished early runs on past its boundary in its own backend request,
in a batch slot real work leaves free; the extra tokens are its beam's speculative tokens
(`Beam.spec_tokens`), up to `spec_max_tokens`. Slots go to the highest priority bins first
(`policy.spec_priorities`), and within a bin to the requests still running (this rule's
`candidates`); a step that finished while none was free waits for one and then restarts
from its path (served from the prefix cache, `SpeculativeSteps.run_on`). After selection
the tokens are handed down (`selected`): in full to the original child, truncated to the
duplicates (`policy.inherit_speculation`), and each kept child's request starts from them
(`SpeculativeSteps.take_over_all`). Memory pressure preempts every running run-on by the
one rule (`memory.py`), counted as every rule's preemptions are
(`SpeculativeSteps.preempt`); it waits for a slot again and resumes from its tokens, or,
where sampling is not resumable, restarts from its committed path.

The child 0 tree is the one without speculation (R = 0, preset `PMS_exact`) only where
sampling is resumable (vLLM with the position-keyed sampler, the default): with vLLM's own
sampler a request that runs past a boundary samples differently from a fresh request with
the same seed.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from operator import attrgetter

from tts.engine.problem import Problem
from tts.engine.speculation.policy import inherit_speculation, held_step_len
from tts.engine.speculation.rule import StartRule
from tts.search.tree import Beam


_PRIORITY = attrgetter("spec_priority")


class RunOn(StartRule):
    """The iteration's run-on requests (module docstring)."""

    name = "runon"
    runs_on = True

    def candidates(self, problems: Sequence[Problem]) -> Iterator[tuple[Problem, Beam, int]]:
        """The finished steps that may run on (`SpeculativeSteps.ready`, then `waiting`),
        the highest priority bins first; within a bin, those still running (they run on in
        place) before those waiting for a slot, each in its dict's order. Both are sorted
        as they stand (the caller may move requests between them while it reads) and
        merged as far as they are read: at n=512 hundreds wait, every step."""
        steps = self.steps
        ready = sorted(steps.ready.values(), key=_PRIORITY, reverse=True)  # stable
        waiting = sorted(steps.waiting.values(), key=_PRIORITY, reverse=True)
        # merge is stable: on a tie, the first iterable's item comes first
        return ((r.problem, r.beam, 0) for r in heapq.merge(ready, waiting, key=_PRIORITY, reverse=True))

    def selected(self, problem: Problem, parents: dict[int, Beam]) -> None:
        """After selection: each child gets its parent's speculative tokens, all for child 0,
        for a duplicate a prefix of the next step they hold (`inherit_speculation`)."""
        search, opts, policy = problem.search, self.parts.opts, self.parts.policy
        step_lens = {uid: held_step_len(self.parts.cut, policy, b, search)
                     for uid, b in parents.items() if b.spec_tokens}
        inherit_speculation(search.frontier, parents, opts.spec_truncate_ratio, opts.spec_truncate_std,
                            problem.rng, step_lens, opts.spec_own_min_tokens)
