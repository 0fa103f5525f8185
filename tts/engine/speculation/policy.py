"""Speculative beam extension policy: who may speculate, and who inherits what.

Priority comes from the previous step's verifier score: the frontier's scores are cut
into B bins (B = the branching factor), bin 1 the highest, and a beam in bin j may claim
up to B - j + 1 speculative branches. After selection the original child (child 0, same
seed) keeps all of its parent's run-on tokens; each duplicate keeps a prefix of the
speculative *next step* (`held_step`, cut by the rule its real step follows) whose length
is a fraction drawn around R of that step, so duplicates start ahead yet diverge within
it; a duplicate always samples at least `spec_own_min_tokens` of its own step, or a draw
near 1 would make it child 0's clone. (Run-on may run past the next step while stragglers
finish; a fraction of all those tokens would often hold child 0's whole next step, and the
duplicates would start as copies of child 0.) With branches (`branches.py`) each child
adopts its own step instead (`steps.py`): exactly the step it would have generated.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from tts.engine.options import EngineOptions
from tts.engine.requests import Request
from tts.engine.step_cutter import StepCutter
from tts.search.base import ProblemSearch, SearchPolicy
from tts.search.tree import Beam, StepEnd


def spec_priorities(prev_scores: Sequence[float | None], bins: int) -> list[int]:
    """Speculative potential M_i = B - j + 1 for each beam, from its bin j (1 = best).

    Beams without a previous score (the first iteration) get the middle bin.
    """
    known = sorted((s for s in prev_scores if s is not None), reverse=True)
    out = []
    for s in prev_scores:
        if s is None or not known:
            j = (bins + 1) // 2
        else:
            rank = known.index(s)  # 0 = best; ties share the better bin
            j = 1 + (rank * bins) // len(known)
        out.append(bins - j + 1)
    return out


def truncate_len(n: int, ratio: float, std: float, rng: random.Random, own_min: int = 0) -> int:
    """How many of a step's n speculative tokens a duplicate keeps: round(n * clip(N(R, std),
    0, 1)), and at most n - own_min, so that it samples at least `own_min` tokens of its own
    (0: the paper's rule, which can keep the whole step and make the duplicate a clone)."""
    frac = min(1.0, max(0.0, rng.gauss(ratio, std) if std > 0 else ratio))
    return min(int(round(n * frac)), max(0, n - own_min))


def inherit_speculation(children: Sequence[Beam], parents: dict[int, Beam], ratio: float, std: float,
              rng: random.Random, step_lens: dict[int, int] | None = None, own_min: int = 0) -> tuple[int, int]:
    """Give each child its parent's speculative tokens (all for child 0, a prefix for
    duplicates). `step_lens[parent uid]` is how many of the parent's speculative tokens
    make its next step (its end token included; absent: all of them); a duplicate keeps
    `truncate_len` of that many, sampling at least `own_min` of its own. Returns (tokens
    handed down in full, tokens handed down truncated). (Speculative branches are not
    handed down: each kept child adopts its own, `steps.adopt`.)"""
    full = trunc = 0
    for child in children:
        parent = parents.get(child.parent) if child.parent is not None else None
        if parent is None or not parent.spec_tokens:
            continue
        spec = parent.spec_tokens
        if child.seed == parent.seed:
            child.spec_tokens = spec
            full += len(spec)
        else:
            step = min(len(spec), (step_lens or {}).get(parent.uid, len(spec)))
            k = truncate_len(step, ratio, std, rng, own_min)
            child.spec_tokens = spec[:k]
            trunc += k
    return full, trunc


def next_runs_to_eos(opts: EngineOptions, policy: SearchPolicy, search: ProblemSearch) -> bool:
    """The next iteration is the last and samples to EOS."""
    return opts.eos_at_depth_limit and policy.is_last_iteration(search, ahead=1)


def held_step(cut: StepCutter, policy: SearchPolicy, beam: Beam, search: ProblemSearch) -> Request:
    """The next step held in the beam's speculative tokens, cut by the rule its real step
    follows (boundary, EOS, the step's token limit); `end` is None when the tokens stop
    inside it."""
    probe = Request(beam.fork(beam.seed), limit=policy.step_limit(beam, search))
    cut.consume(probe, beam.spec_tokens)
    return probe


def held_step_len(cut: StepCutter, policy: SearchPolicy, beam: Beam, search: ProblemSearch) -> int:
    """How many of the beam's speculative tokens its next step takes (EOS included)."""
    probe = held_step(cut, policy, beam, search)
    if probe.end is None:
        return len(beam.spec_tokens)
    return len(probe.tokens) + (probe.end is StepEnd.EOS)
