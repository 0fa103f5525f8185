"""Step cutting: a request's tokens become its step, and a finished request becomes tree steps.

The generator never stops at a step boundary; the engine feeds each request's streamed
tokens to `StepCutter.consume`, which ends the request's step at "\\n\\n", any of the
generator's end-of-sequence ids, or the step's token limit, and returns what lies past
the end (speculative tokens, where a request ran on).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import NamedTuple

from tts.backends.base import FinishReason, GenDelta, Generator
from tts.engine.requests import Request
from tts.search.tree import Step, StepEnd

BOUNDARY = "\n\n"


def completes_path(request: Request) -> bool:
    """The request's finished step ends its path: at EOS, or with a boxed answer. Read once
    the step is committed (`Inflight.complete`): its text is then its beam's last step's,
    decoded there once."""
    return request.end is StepEnd.EOS or request.beam.steps[-1].has_answer


class Ended(NamedTuple):
    """A generator delta ended its request's step or its backend request (`StepCutter.finish`):
    `stop` the request where its step ended before its backend request did; `overflow`, its
    tokens past the step's end."""

    stop: bool
    overflow: list[int]


class StepCutter:
    """The step rule on one generator's tokenizer: where a step ends, and what it is."""

    def __init__(self, generator: Generator) -> None:
        self.gen = generator
        self._texts: dict[int, str] = {}  # each token's text, as `consume` has met it

    @cached_property
    def eos(self) -> frozenset[int]:
        """The generator's end-of-sequence ids."""
        return self.gen.eos_token_ids

    def consume(self, request: Request, new: Sequence[int], finish: FinishReason | None = None) -> list[int]:
        """Append tokens to the request's step until it ends (a step boundary, any of the
        generator's end-of-sequence ids, the step's token limit; `finish`, the request's
        own end, when the tokens run out first); return the tokens past the end. Called
        for every token a request generates: what it reads is held in locals."""
        eos, texts, tokens = self.eos, self._texts, request.tokens
        at_boundary = not (request.to_eos or request.cut_into_steps)
        last = request.last_char
        for i, tok in enumerate(new):
            if tok in eos:
                request.end = StepEnd.EOS
                break
            tokens.append(tok)
            piece = texts.get(tok)
            if piece is None:
                piece = texts[tok] = self.gen.token_text(tok)
            hit = at_boundary and BOUNDARY in last + piece
            last = piece[-1] if piece else last
            if hit:
                request.end = StepEnd.BOUNDARY
                request.last_char = last
                return list(new[i + 1:])
            if len(tokens) >= request.limit:
                request.end = StepEnd.STEP_LIMIT
                request.last_char = last
                return list(new[i + 1:])
        request.last_char = last
        if finish is not None and request.end is None:
            request.end = StepEnd.EOS if finish is FinishReason.EOS else StepEnd.STEP_LIMIT
        return []

    def finish(self, request: Request, d: GenDelta) -> Ended | None:
        """`consume` one generator delta of the request's request: the one way a generator output
        finishes a request. None while its step goes on (most deltas: no object is made for
        them). Where its backend request ended (the model runner has left it FINISHED), so
        has its step; where its step ended first, the caller stops it (`Ended.stop`). A
        request stopped at a speculative cap below its step's limit (`Request.capped`) has
        not ended its step there: it holds part of it."""
        reason = d.finish_reason
        overflow = self.consume(request, d.new_token_ids,
                                None if reason is FinishReason.LENGTH and request.capped else reason)
        if reason is not None:
            return Ended(False, overflow)
        return None if request.end is None else Ended(True, overflow)

    def adopt(self, request: Request) -> None:
        """Start the request from its beam's speculative tokens; they may hold the whole step.
        What lies past the step stays speculative (`request.runon_tokens`)."""
        spec = list(request.beam.spec_tokens)
        request.beam.spec_tokens = ()
        if spec:
            request.runon_tokens = self.consume(request, spec)
            request.adopted = len(request.tokens)

    def steps(self, request: Request, total_left: int) -> list[Step]:
        """Turn a finished request into steps (several when `cut_into_steps`), marking the total limit."""
        end = request.end or StepEnd.STEP_LIMIT
        if end is not StepEnd.EOS and len(request.tokens) >= total_left:
            end = StepEnd.TOTAL_LIMIT  # the path's budget is spent: it completes here
        decode = self.gen.decode
        if not request.cut_into_steps:
            return [Step(tuple(request.tokens), decode(request.tokens), end)]
        steps, cur, last = [], [], ""
        for tok in request.tokens:
            cur.append(tok)
            piece = self.gen.token_text(tok)
            if BOUNDARY in last + piece:
                steps.append(Step(tuple(cur), decode(cur), StepEnd.BOUNDARY))
                cur = []
            last = piece[-1:] if piece else last
        if cur or not steps:
            steps.append(Step(tuple(cur), decode(cur), end))
        else:
            steps[-1] = Step(steps[-1].token_ids, steps[-1].text, end)
        return steps
