"""A generation request: one lifecycle for every step the engine asks the generator for.

A `Request` generates the next step of a beam (or, with `cut_into_steps`, a whole solution). Its
`kind` says why it exists, its `state` where its backend request is:

- `WAITING`: no backend request (queued for a batch slot, awaiting a speculative slot, preempted);
- `RUNNING`: in the backend, generating a step some selection asked for;
- `SPECULATIVE`: in the backend, generating tokens no selection has asked for yet (a
  run-on past the step's end, a branch, a child's step before selection chose the child);
- `FINISHED`: its backend request ended, or was stopped at the step's end;
- `ABORTED`: dropped (its beam was pruned, or the search ended).

Its step ending (`end`, `finished`) is a separate matter from its backend request's
state: a run-on request goes on running past its step's end.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from tts.search.tree import Beam, StepEnd


class RequestState(str, enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SPECULATIVE = "speculative"
    FINISHED = "finished"
    ABORTED = "aborted"

    @property
    def in_backend(self) -> bool:
        return self in (RequestState.RUNNING, RequestState.SPECULATIVE)


class RequestKind(str, enum.Enum):
    """Why a request exists (the decoupled schedule counts its tokens by kind)."""

    EAGER = "eager"  # a first step of a problem taken from the request queue
    FRESH = "fresh"  # a next step after a selection
    SPEC = "spec"  # a step of a child that selection has not chosen yet


@dataclass(eq=False)
class Request:
    """Generate the next step of `beam` within `limit` tokens (adopted speculative
    tokens included); `to_eos` ignores step boundaries (the last iteration, whole
    solutions), `cut_into_steps` cuts the result into steps at boundaries (best-of-N)."""

    beam: Beam
    limit: int
    to_eos: bool = False
    cut_into_steps: bool = False
    spec_priority: int = 0  # speculative branches (or run-on slots) this beam may claim
    kind: RequestKind = RequestKind.FRESH
    state: RequestState = RequestState.WAITING
    problem: Any = None  # the problem in flight it belongs to, where the schedule needs it
    # what generation made of it:
    tokens: list[int] = field(default_factory=list)
    runon_tokens: list[int] = field(default_factory=list)  # run-on: tokens past the step's end
    end: StepEnd | None = None
    request_id: str | None = None
    adopted: int = 0  # speculative tokens reused from before this request
    last_char: str = ""
    generated: int = 0  # backend tokens produced for it (a final EOS included)
    capped: bool = False  # its backend budget is below the step's: LENGTH is not a step end
    stalled: bool = False  # a speculative step that reached its cap before its end
    rejected: bool = False  # early rejection stopped it: its beam leaves the frontier
    # (problem id, speculative, kind): how the model runner counts its tokens, set as it
    # enters the backend or begins to run there as speculation
    counted_as: tuple[str, bool, RequestKind] | None = field(default=None, repr=False)

    @property
    def finished(self) -> bool:
        """Its step has ended (boundary, EOS or a token limit)."""
        return self.end is not None

    @property
    def problem_id(self) -> str:
        return self.beam.problem_id
