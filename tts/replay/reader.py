"""What a replayed variant is served from a run's trace (`tts.trace.format`).

Each request and score is recorded with its variant and each request with its place in
the order requests were sent. A replay serves each variant its own recorded outputs, the
n-th request of a (seed, prompt) the n-th recorded one (`VariantReader`): in bf16 the
same request gives other tokens in another variant (the batch moves the logits), so a
variant served another's outputs grows another tree. Only where a variant's own are
exhausted are another variant's borrowed, and only then are tokens drawn. With
`replay.tree=VARIANT` every variant is served that variant's recording first, as if its
own: each variant's schedule on that one tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum

from tts.replay.served import Divergence
from tts.trace.format import Generation, Trace, best_output


class Whose(IntEnum):
    """Where a served token or score came from."""

    OWN = 0  # the variant's own recording
    BORROWED = 1  # another variant's recording of the same request
    DRAWN = 2  # neither: drawn (`tts.replay.sampler`)


class VariantReader:
    """What one replayed variant is served from a trace (module docstring): a request gets
    the variant's own recorded outputs of its (seed, prompt) in the order they were sent,
    one each (one sent as speculation preferring one recorded as such, and the same for a
    plain request); once they are all served, another variant's (the best: finished, then
    longest); then its own again (the best). A score likewise: the variant's own in order,
    then another's, then its own last. Where the variant first asks for what its own
    recording does not hold, the backends note it in `divergence`. `tree`: another recorded
    variant, whose recording serves this one as its own (`replay.tree`)."""

    def __init__(self, trace: Trace, variant: str, tree: str = "") -> None:
        self.trace = trace
        self.variant = tree or variant  # whose recording is served as the variant's own
        self.divergence = Divergence(variant, self.variant)
        self._served: set[int] = set()  # id() of own recorded outputs already served
        self._scored: dict[str, int] = {}  # own scores of a key served so far

    def take(self, seed: int, prompt_hash: int, speculative: bool) -> tuple[Generation, Whose, bool] | None:
        """The recorded output a request sent now gets, whose it is, and whether it was
        already served to an earlier request of this variant (all its own were)."""
        gens = self.trace.outputs(seed, prompt_hash)
        own = [g for g in gens if g.variant == self.variant]
        fresh = [g for g in own if id(g) not in self._served]
        if fresh:
            gen = next((g for g in fresh if g.speculative == speculative), fresh[0])
            self._served.add(id(gen))
            return gen, Whose.OWN, False
        other = best_output([g for g in gens if g.variant != self.variant])
        if other is not None:
            return other, Whose.BORROWED, False
        gen = best_output(own)
        return (gen, Whose.OWN, True) if gen is not None else None

    def resumed(self, seed: int, prompt_hash: int, own_only: bool = False) -> tuple[Generation, int, Whose] | None:
        """A recorded output for a request (seed, prompt) under a resumable sampler, without
        taking it: a request's continuation where its output ran out, or one that resumes a
        recorded step part-way (`Trace.generation`). The variant's own first (only, with
        `own_only`)."""
        found = self.trace.generation(seed, prompt_hash, True, self.variant, own_only)
        if found is None:
            return None
        return found[0], found[1], self._whose(found[0])

    def extending(self, seed: int, prompt_hash: int, served: Sequence[int],
                  own_only: bool = False) -> tuple[Generation, int, Whose] | None:
        """A recorded output of the request (seed, prompt) that begins with the tokens
        `served` and goes on (the best: finished, then longest), and where it goes on; the
        variant's own first (only, with `own_only`)."""
        n = len(served)
        longer = [g for g in self.trace.outputs(seed, prompt_hash) if len(g.tokens) > n and list(g.tokens[:n]) == served]
        gen = best_output([g for g in longer if g.variant == self.variant])
        if gen is None and not own_only:
            gen = best_output(longer)
        return (gen, n, self._whose(gen)) if gen is not None else None

    def _whose(self, gen: Generation) -> Whose:
        return Whose.OWN if gen.variant == self.variant else Whose.BORROWED

    def owns_score(self, key: str) -> bool:
        """Whether the variant's own recording holds a score of `key` not yet served."""
        return self._scored.get(key, 0) < sum(w == self.variant for w, _ in self.trace.scored.get(key) or [])

    def score(self, key: str) -> tuple[float, Whose] | None:
        values = self.trace.scored.get(key) or []
        own = [v for w, v in values if w == self.variant]
        n = self._scored.get(key, 0)
        if n < len(own):
            self._scored[key] = n + 1
            return own[n], Whose.OWN
        other = [v for w, v in values if w != self.variant]
        if other:
            return other[-1], Whose.BORROWED
        return (own[-1], Whose.OWN) if own else None
