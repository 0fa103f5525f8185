"""The search tree's state: steps, beams, and one problem's search.

A beam is a path: the problem's prompt plus the steps generated so far. Children are
created by `fork`, which shares the parent's steps (tuples are immutable), so a tree of
thousands of beams costs little memory.
"""

from __future__ import annotations

import enum
import hashlib
import itertools
from dataclasses import dataclass, field, replace
from functools import cached_property

from eval.extract import has_final_answer
from tts.token_hash import extend_hash



class StepEnd(str, enum.Enum):
    """Why a step ended."""

    BOUNDARY = "boundary"  # the step text reached "\n\n"
    EOS = "eos"
    STEP_LIMIT = "step_limit"  # the step's token limit
    TOTAL_LIMIT = "total_limit"  # the path's total token limit


class BeamState(str, enum.Enum):
    ACTIVE = "active"
    PRUNED = "pruned"
    COMPLETE = "complete"


def has_answer(text: str) -> bool:
    """The text states a final answer (a box, or "The answer is X" as the prompt asks):
    a step with one completes its path. See `eval.extract.has_final_answer`."""
    return has_final_answer(text)


@dataclass(frozen=True)
class Step:
    """One reasoning step: its tokens, text and how it ended."""

    token_ids: tuple[int, ...]
    text: str
    end: StepEnd

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @cached_property
    def has_answer(self) -> bool:
        """Its text states a final answer (read once: a finished path is asked at every
        generator step while its children wait to speculate)."""
        return has_answer(self.text)


_beam_ids = itertools.count()


@dataclass
class Beam:
    """A path in the search tree.

    `scores[i]` is the verifier's score of step i (None until scored). `spec_tokens`
    holds speculative tokens generated past the last step; they are never scored and
    never part of `steps` until a later step adopts them.
    """

    problem_id: str
    prompt_ids: tuple[int, ...]
    seed: int
    steps: tuple[Step, ...] = ()
    scores: tuple[float | None, ...] = ()
    state: BeamState = BeamState.ACTIVE
    parent: int | None = None
    group: int = 0  # subtree id (DVTS) or sample index
    uid: int = field(default_factory=lambda: next(_beam_ids))
    spec_tokens: tuple[int, ...] = ()
    completed_at: float | None = None  # seconds since the problem started
    _ids: tuple[int, ...] | None = field(default=None, init=False, repr=False, compare=False)  # `token_ids`
    _key: int | None = field(default=None, init=False, repr=False, compare=False)  # `path_key`

    @property
    def depth(self) -> int:
        return len(self.steps)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.steps)

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The prompt and every step's tokens (kept until a step is appended)."""
        if self._ids is None:
            self._ids = self.prompt_ids + tuple(t for s in self.steps for t in s.token_ids)
        return self._ids

    @property
    def path_key(self) -> int:
        """`extend_hash(0, token_ids)`, the path's key in a run's trace: hashed once, then
        extended by each step appended (`tts.token_hash`)."""
        if self._key is None:
            self._key = extend_hash(0, self.token_ids)
        return self._key

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.steps)

    @property
    def step_texts(self) -> tuple[str, ...]:
        return tuple(s.text for s in self.steps)

    @property
    def last_scored(self) -> int:
        """Index of the deepest scored step with all earlier ones scored; -1 if none."""
        n = 0
        while n < len(self.scores) and self.scores[n] is not None:
            n += 1
        return n - 1

    @property
    def is_finished_path(self) -> bool:
        """The last step ended the path (EOS, a boxed answer, or the token budget)."""
        if not self.steps:
            return False
        last = self.steps[-1]
        return last.end in (StepEnd.EOS, StepEnd.TOTAL_LIMIT) or last.has_answer

    def append(self, step: Step) -> None:
        self.steps = self.steps + (step,)
        self._ids = None
        if self._key is not None:
            self._key = extend_hash(self._key, step.token_ids)
        self.scores = self.scores + (None,)

    def set_score(self, index: int, score: float) -> None:
        scores = list(self.scores)
        scores[index] = score
        self.scores = tuple(scores)

    def seed_of_child(self, k: int) -> int:
        """Child k's sampling seed (`child_seed`, at this beam's depth)."""
        return child_seed(self.seed, k, self.depth)

    def fork(self, seed: int, spec_tokens: tuple[int, ...] = ()) -> Beam:
        """A child sharing this beam's path, with its own sampling seed."""
        child = replace(self, seed=seed, state=BeamState.ACTIVE, parent=self.uid,
                        uid=next(_beam_ids), spec_tokens=spec_tokens, completed_at=None)
        child._ids, child._key = self._ids, self._key  # the same path
        return child


def child_seed(parent_seed: int, child_index: int, depth: int) -> int:
    """A deterministic seed for child `child_index` of a beam (or of the problem's root, at
    depth 0) whose path has `depth` steps, independent of scheduling order.

    Child 0 keeps the parent's seed: it is the parent's own continuation, which is what
    speculative extension generates ahead of time. Every other child's seed is hashed from
    the parent's seed, its index and the depth, so a frontier's seeds stay distinct. A hash
    of the seed and index alone does not: two siblings whose steps came out the same (the
    same path) would hand one seed on twice, one as its child 0 and the other as its child
    1, and the two identical requests would grow identical subtrees, the search's budget
    spent twice on one path where search-and-learn samples the two independently.
    """
    if child_index == 0:
        return parent_seed
    digest = hashlib.blake2b(f"{parent_seed}:{depth}:{child_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (2**31 - 1)
