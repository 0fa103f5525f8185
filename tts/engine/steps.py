"""Step cutting: a job's tokens become its step, and a finished job becomes tree steps.

The generator never stops at a step boundary; both engines feed each request's streamed
tokens to `StepCutter.consume`, which ends the job's step at "\\n\\n", any of the
generator's end-of-sequence ids, or the step's token limit, and returns what lies past
the end (speculative tokens, where a request ran on).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tts.backends.base import FinishReason, Generator
from tts.search.tree import Beam, Step, StepEnd

BOUNDARY = "\n\n"


@dataclass
class GenJob:
    """Generate the next step of `beam` (or, with `split`, a whole solution)."""

    beam: Beam
    limit: int  # token limit of this step, adopted speculative tokens included
    to_eos: bool = False  # ignore step boundaries (last iteration / whole solutions)
    split: bool = False  # split the result into steps at boundaries (best-of-N)
    spec_priority: int = 0  # speculative branches this beam may claim; 0 = none
    # filled by the phase:
    tokens: list[int] = field(default_factory=list)
    spec: list[int] = field(default_factory=list)
    end: StepEnd | None = None
    request_id: str | None = None
    adopted: int = 0  # speculative tokens reused from the previous iteration
    last_char: str = ""
    # branches mode: the speculative branches of this job, and for a branch its parent job
    branches: list[GenJob] = field(default_factory=list)
    branch_of: GenJob | None = None

    @property
    def finished(self) -> bool:
        return self.end is not None


class StepCutter:
    """The step rule on one generator's tokenizer: where a step ends, and what it is."""

    def __init__(self, generator: Generator) -> None:
        self.gen = generator

    def consume(self, job: GenJob, new: Sequence[int], finish: FinishReason | None = None) -> list[int]:
        """Append tokens to the job's step until it ends (a step boundary, any of the
        generator's end-of-sequence ids, the step's token limit; `finish`, the request's
        own end, when the tokens run out first); return the tokens past the end."""
        eos = self.gen.eos_token_ids
        for i, tok in enumerate(new):
            if tok in eos:
                job.end = StepEnd.EOS
                return []
            job.tokens.append(tok)
            piece = self.gen.token_text(tok)
            hit = not job.to_eos and not job.split and BOUNDARY in job.last_char + piece
            job.last_char = piece[-1:] if piece else job.last_char
            if hit:
                job.end = StepEnd.BOUNDARY
                return list(new[i + 1:])
            if len(job.tokens) >= job.limit:
                job.end = StepEnd.STEP_LIMIT
                return list(new[i + 1:])
        if finish is not None and job.end is None:
            job.end = StepEnd.EOS if finish is FinishReason.EOS else StepEnd.STEP_LIMIT
        return []

    def adopt(self, job: GenJob) -> None:
        """Start the job from its beam's speculative tokens; they may hold the whole step.
        What lies past the step stays speculative (`job.spec`)."""
        spec = list(job.beam.spec_tokens)
        job.beam.spec_tokens = ()
        if spec:
            job.spec = self.consume(job, spec)
            job.adopted = len(job.tokens)

    def steps(self, job: GenJob, total_left: int) -> list[Step]:
        """Turn a finished job into steps (several when `split`), marking the total limit."""
        end = job.end or StepEnd.STEP_LIMIT
        if end is not StepEnd.EOS and len(job.tokens) >= total_left:
            end = StepEnd.TOTAL_LIMIT  # the path's budget is spent: it completes here
        decode = self.gen.decode
        if not job.split:
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
