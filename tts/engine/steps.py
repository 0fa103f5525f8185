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
    the step is committed (`Frontier.complete`): its text is then its beam's last step's,
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

    def consume(self, job: Request, new: Sequence[int], finish: FinishReason | None = None) -> list[int]:
        """Append tokens to the job's step until it ends (a step boundary, any of the
        generator's end-of-sequence ids, the step's token limit; `finish`, the request's
        own end, when the tokens run out first); return the tokens past the end. Called
        for every token a request generates: what it reads is held in locals."""
        eos, texts, tokens = self.eos, self._texts, job.tokens
        at_boundary = not (job.to_eos or job.cut_into_steps)
        last = job.last_char
        for i, tok in enumerate(new):
            if tok in eos:
                job.end = StepEnd.EOS
                break
            tokens.append(tok)
            piece = texts.get(tok)
            if piece is None:
                piece = texts[tok] = self.gen.token_text(tok)
            hit = at_boundary and BOUNDARY in last + piece
            last = piece[-1] if piece else last
            if hit:
                job.end = StepEnd.BOUNDARY
                job.last_char = last
                return list(new[i + 1:])
            if len(tokens) >= job.limit:
                job.end = StepEnd.STEP_LIMIT
                job.last_char = last
                return list(new[i + 1:])
        job.last_char = last
        if finish is not None and job.end is None:
            job.end = StepEnd.EOS if finish is FinishReason.EOS else StepEnd.STEP_LIMIT
        return []

    def finish(self, job: Request, d: GenDelta) -> Ended | None:
        """`consume` one generator delta of the job's request: the one way a generator output
        finishes a request. None while its step goes on (most deltas: no object is made for
        them). Where its backend request ended (the model runner has left it FINISHED), so
        has its step; where its step ended first, the caller stops it (`Ended.stop`). A
        request stopped at a speculative cap below its step's limit (`Request.capped`) has
        not ended its step there: it holds part of it."""
        reason = d.finish_reason
        overflow = self.consume(job, d.new_token_ids,
                                None if reason is FinishReason.LENGTH and job.capped else reason)
        if reason is not None:
            return Ended(False, overflow)
        return None if job.end is None else Ended(True, overflow)

    def adopt(self, job: Request) -> None:
        """Start the job from its beam's speculative tokens; they may hold the whole step.
        What lies past the step stays speculative (`job.spec`)."""
        spec = list(job.beam.spec_tokens)
        job.beam.spec_tokens = ()
        if spec:
            job.spec = self.consume(job, spec)
            job.adopted = len(job.tokens)

    def steps(self, job: Request, total_left: int) -> list[Step]:
        """Turn a finished job into steps (several when `cut_into_steps`), marking the total limit."""
        end = job.end or StepEnd.STEP_LIMIT
        if end is not StepEnd.EOS and len(job.tokens) >= total_left:
            end = StepEnd.TOTAL_LIMIT  # the path's budget is spent: it completes here
        decode = self.gen.decode
        if not job.cut_into_steps:
            return [Step(tuple(job.tokens), decode(job.tokens), end)]
        steps, cur, last = [], [], ""
        for tok in job.tokens:
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
