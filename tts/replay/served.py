"""What a replayed variant was served: how much of it its own recording answered
(`ReplayCounts`), and where it first asked for what its recording does not hold
(`Divergence`).

A variant replayed through the code and options that recorded it sends the requests it
sent when recorded and asks for the scores it asked for, and its own recording answers
every one. The first request it sends that its recording never held (a beam prefix it
never extended, a request sent more often than recorded, a request run past its recorded
tokens), or the first score of a step it never scored, is where the replayed variant left
its recording: from there on its tree is another one, served from other variants'
recordings or drawn (`tts.replay.sampler`). The replay names that first decision once per
variant (problem, search iteration, what was asked and how it was served).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass


@dataclass
class ReplayCounts:
    """How much of a replayed variant the trace answered from its own recording, how much
    it borrowed from another variant's recording of the same request, and how much was
    drawn (`StepSampler`)."""

    requests: int = 0  # generation requests the engine sent
    recorded: int = 0  # ... served the variant's own recorded output of that request, one each
    repeated: int = 0  # ... served an own recorded output an earlier request was served (all were)
    resumed: int = 0  # recorded outputs served from their middle, or chained on where one ran out
    # (resumable sampler: the same context and seed sample the same tokens)
    borrowed_requests: int = 0  # ... served some tokens from another variant's recording
    drawn_requests: int = 0  # ... that needed at least one drawn token
    tokens: int = 0
    borrowed_tokens: int = 0
    drawn_tokens: int = 0
    scores: int = 0
    borrowed_scores: int = 0
    drawn_scores: int = 0

    def to_dict(self) -> dict:
        out = asdict(self)
        out["drawn_token_share"] = self.drawn_tokens / self.tokens if self.tokens else 0.0
        out["borrowed_token_share"] = self.borrowed_tokens / self.tokens if self.tokens else 0.0
        out["drawn_score_share"] = self.drawn_scores / self.scores if self.scores else 0.0
        return out

    def line(self) -> str:
        """What the variant drew and borrowed, in a line."""
        share = self.drawn_tokens / self.tokens if self.tokens else 0.0
        text = (f"drew {self.drawn_tokens} tokens ({share:.1%} of its tokens), borrowed {self.borrowed_tokens} "
                "from another variant's recording")
        if self.drawn_scores or self.borrowed_scores:
            text += f"; scores: drew {self.drawn_scores} of {self.scores}, borrowed {self.borrowed_scores}"
        return text


class Divergence:
    """The first request or score of one replayed variant that its own recording does not
    hold (module docstring), with where it was asked: the problem (its text, until the
    replay names it by id), the search iteration it was in (1 for the first; a beam
    search's step) and, for a generation, its seed, whether it was speculation, and how
    many tokens past the problem's prompt its prefix reaches."""

    def __init__(self, variant: str, recording: str = "") -> None:
        self.variant = variant
        self.recording = recording or variant  # whose recording it is served first (`replay.tree`)
        self.first: dict | None = None
        self.prompts: dict[tuple[int, ...], str] = {}  # each problem's prompt (token ids): the problem
        self.iterations: dict[str, int] = {}  # search iterations done, by problem (the replay's on_iteration)

    def start(self, problem: str, prompt_token_ids: Sequence[int]) -> None:
        """A problem starts (its prompt encoded): no iteration done yet (another seed's pass too)."""
        self.prompts[tuple(prompt_token_ids)] = problem
        self.iterations[problem] = 0

    def request(self, prompt_token_ids: Sequence[int], seed: int, speculative: bool, what: str) -> None:
        """A generation request the recording does not hold (`what`: how, and how it was served)."""
        if self.first is not None:
            return
        ids = tuple(prompt_token_ids)
        problem, past = next(((p, len(ids) - len(pre)) for pre, p in self.prompts.items() if ids[:len(pre)] == pre),
                             ("", len(ids)))
        self._note(problem, {"kind": "generation", "seed": seed, "speculative": speculative,
                             "prefix_tokens": past, "what": what})

    def score(self, problem: str, step: int, what: str) -> None:
        """A score of the path's `step`-th step (from 1) the recording does not hold."""
        if self.first is None:
            self._note(problem, {"kind": "score", "step": step, "what": what})

    def _note(self, problem: str, detail: dict) -> None:
        self.first = {"variant": self.variant, "recording": self.recording, "problem": problem,
                      "iteration": self.iterations.get(problem, 0) + 1, **detail}


def divergence_line(first: dict) -> str:
    """A variant's first divergence in a line."""
    where = f"problem {first.get('problem') or '?'}, iteration {first.get('iteration')}"
    if first.get("kind") == "score":
        asked = f"the score of step {first.get('step')}"
    else:
        spec = "speculative " if first.get("speculative") else ""
        asked = f"a {spec}generation (seed {first.get('seed')}, {first.get('prefix_tokens')} tokens past the prompt)"
    return f"{first.get('variant')} left {recording_of(first)} at {where}: {asked}, {first.get('what')}"


def recording_of(first: dict) -> str:
    """Whose recording a variant left: its own, or the one `replay.tree` served it."""
    whose = first.get("recording")
    return "its recording" if whose in (None, first.get("variant")) else f"{whose}'s recording"
