"""The units of work of the decoupled engine: generation requests and problems in flight."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from tts.engine.steps import GenJob
from tts.engine.base import _Live
from tts.search.tree import Beam


class Kind(str, enum.Enum):
    """What a generation request is for."""

    EAGER = "eager"  # a first step of a problem taken from the request queue
    FRESH = "fresh"  # a next step after a selection
    SPEC = "spec"  # a speculative next step of a beam still waiting for selection


@dataclass
class _SpecNode:
    """A speculative step: `job` generates one of `parent`'s children's step ahead of selection."""

    parent: Beam
    job: GenJob  # on a fork of `parent` with the child's seed, with the next iteration's limits
    work: _Work | None = None  # the request in flight, if any
    generated: int = 0  # backend tokens produced for it (a final EOS included)
    stalled: bool = False  # reached `spec_max_tokens` (or has no budget) before its step end


@dataclass
class _Work:
    """A generation job, queued or in flight."""

    job: GenJob
    kind: Kind
    live: _DLive
    node: _SpecNode | None = None
    request_id: str | None = None
    capped: bool = False  # max_tokens below the job's budget: LENGTH is not a step end


@dataclass
class _DLive(_Live):
    """A problem in flight."""

    order: int = 0
    waiting: set[int] = field(default_factory=set)  # frontier beams without their step
    to_score: int = 0  # frontier beams with a score still missing
    spec: dict[tuple[int, int], _SpecNode] = field(default_factory=dict)  # by (parent uid, child seed)
    lengths: list[int] = field(default_factory=list)  # new tokens per step, this iteration
