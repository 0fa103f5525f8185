"""What a replay serves where the trace holds nothing: steps and scores drawn from the
trace's own distributions.

A variant that asks for tokens the trace does not hold (another engine's speculation, a
step resumed under vLLM's own sampler, a path the recorded run pruned) gets steps whose
lengths are drawn from the trace's step lengths, ending the path (with EOS) as often as the
trace's steps end theirs (at EOS or with an answer), at such a step's length; a score the trace does not hold is drawn from the trace's scores at that
step depth. Draws are seeded by the request (or the scored path), so a replay is
reproducible. Such tokens carry no answer: replayed accuracy is not a result; the counts
of what was drawn are reported with every replay.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator

from tts.engine.step_cutter import BOUNDARY
from tts.trace.format import Trace
from tts.search.tree import has_answer


class StepSampler:
    """Step lengths, path ends and scores fitted on a trace (module docstring)."""

    def __init__(self, trace: Trace, token_text: Callable[[int], str], decode: Callable[[list[int]], str],
                 eos_ids: frozenset[int]) -> None:
        lengths: dict[bool, list[int]] = {False: [], True: []}  # step lengths: (does it end its path)
        counts: Counter = Counter()
        for gen in trace.generations.values():
            step, last = [], ""
            for token in gen.tokens:
                step.append(token)
                if token in eos_ids:
                    lengths[True].append(len(step))
                    break
                counts[token] += 1
                piece = token_text(token)
                if BOUNDARY in last + piece:
                    lengths[has_answer(decode(step))].append(len(step))
                    step = []
                last = piece[-1:] if piece else last
        steps = len(lengths[False]) + len(lengths[True])
        self.lengths = lengths[False] or [32]
        self.end_lengths = lengths[True] or self.lengths
        self.end_share = len(lengths[True]) / steps if steps else 0.0
        self.eos = min(eos_ids)
        plain = [t for t, _ in counts.most_common() if "\n" not in token_text(t) and token_text(t).strip()]
        self.filler = plain[0] if plain else self.eos
        whole = [t for t, _ in counts.most_common() if BOUNDARY in token_text(t)]
        newline = [t for t, _ in counts.most_common() if token_text(t) == "\n"]
        self.boundary = [whole[0]] if whole else [newline[0]] * 2 if newline else []
        self.scores = trace.score_depths
        self._all_scores = sorted(v for values in trace.score_depths.values() for v in values) or [0.5]

    def tokens(self, seed: int) -> Iterator[int]:
        """An endless run of drawn steps for one request: each ends its path (EOS) with the
        trace's share of path-ending steps (an answer, or EOS), at such a step's length."""
        rng = random.Random(seed)
        while True:
            if rng.random() < self.end_share or not self.boundary:
                yield from [self.filler] * (max(1, rng.choice(self.end_lengths)) - 1)
                yield self.eos
                return
            yield from [self.filler] * max(0, rng.choice(self.lengths) - len(self.boundary))
            yield from self.boundary

    def score(self, key: str, depth: int) -> float:
        rng = random.Random(key)
        return rng.choice(self.scores.get(depth) or self._all_scores)
