"""The PRM adapter contract: how one reward-model family turns steps into model inputs,
and model outputs back into step scores.

An adapter never touches the model. `build` returns `PromptSpec`s (token ids plus what to
read from the model), the verifier runs them on vLLM and hands back one `ScoreOutput` per
spec, and `read` turns those into one score in [0, 1] per requested step index. So the
formatting and the position logic of every adapter can be tested with a tokenizer alone.
"""

from __future__ import annotations

import enum
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar


class ReadKind(str, enum.Enum):
    """What the verifier must read from the model for one prompt."""

    NEXT_TOKEN = "next_token"  # log-probs of the token after the prompt (max_tokens=1)
    PROMPT_TOKENS = "prompt_tokens"  # next-token log-probs at chosen prompt positions
    POOLING = "pooling"  # raw per-token head outputs at chosen prompt positions


@dataclass(frozen=True)
class PromptSpec:
    """One backend request.

    `positions` (PROMPT_TOKENS, POOLING) are 0-based token positions in `token_ids`, one per
    score this request yields; for PROMPT_TOKENS the verifier returns the distribution of
    the token that follows each position. `label_ids` are the token ids whose log-probs the
    score needs (the verifier asks for exactly these when vLLM can, else for the top-k).
    """

    token_ids: tuple[int, ...]
    kind: ReadKind
    label_ids: tuple[int, ...] = ()
    positions: tuple[int, ...] = ()


@dataclass(frozen=True)
class ScoreOutput:
    """What the backend returned for one `PromptSpec`.

    `logprobs`: NEXT_TOKEN, one dict (token id -> log-prob); PROMPT_TOKENS, one dict per
    position. `values`: POOLING, the head's raw outputs (no activation) per position.
    """

    spec: PromptSpec
    logprobs: tuple[Mapping[int, float], ...] = ()
    values: tuple[tuple[float, ...], ...] = ()
    num_cached_tokens: int = 0


ENCODED_MAX = 1 << 16  # texts `PrmAdapter.encode` remembers


class PrmAdapter(ABC):
    """One PRM family's input format and score read-out.

    Contract: `build(problem, steps, indices)` returns the specs for one scored path;
    `read(outputs)` (the outputs of exactly those specs, in order) returns one score in
    [0, 1] per index, in the order of `indices`. Step texts are taken as the generator
    wrote them (trailing blank lines included) and normalised by the adapter.
    """

    name: ClassVar[str]
    # Extra `vllm.LLM` arguments the family's checkpoint needs (e.g. a pooling runner).
    engine_kwargs: ClassVar[dict[str, Any]] = {}
    # `build` makes one backend request per scored index (a chat judge), not one per path
    request_per_index: ClassVar[bool] = False
    # a step cut off mid-way gets a meaningful score (early rejection): only a family that
    # reads the text as it stands (the judge), not a head trained on whole steps
    reads_partial_steps: ClassVar[bool] = False
    # its requests can be served from the prefix cache: not when they read prompt log-probs,
    # for which vLLM 0.32 computes every position (no prefix-cache hits)
    reads_prefix_cache: ClassVar[bool] = True

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._encoded: dict[str, tuple[int, ...]] = {}  # `encode`'s memo

    @abstractmethod
    def build(self, problem: str, steps: Sequence[str], indices: Sequence[int]) -> list[PromptSpec]:
        """The backend requests that score `steps[i]` for each i in `indices`."""

    @abstractmethod
    def read(self, outputs: Sequence[ScoreOutput]) -> tuple[float, ...]:
        """One score per index, from the outputs of the specs `build` returned."""

    def encode(self, text: str) -> list[int]:
        """The text's token ids, no special tokens added. Memoised: a path's problem and
        earlier steps are encoded again at every iteration, and at n=512 the tokenizer's
        calls were most of a verifier call's host time. The memo holds at most
        `ENCODED_MAX` texts and starts again when full."""
        ids = self._encoded.get(text)
        if ids is None:
            if len(self._encoded) >= ENCODED_MAX:
                self._encoded.clear()
            ids = self._encoded[text] = tuple(self.tokenizer.encode(text, add_special_tokens=False))
        return list(ids)

    def single_token_id(self, text: str) -> int:
        """The id of `text` when it is one token (else ValueError naming it)."""
        ids = self.encode(text)
        if len(ids) != 1:
            raise ValueError(f"{self.name}: {text!r} is {len(ids)} tokens for this tokenizer, "
                             "expected exactly one")
        return ids[0]


def check_indices(steps: Sequence[str], indices: Sequence[int]) -> None:
    """ValueError unless every index names a step of the path."""
    if not indices:
        raise ValueError("indices: empty; name at least one step to score")
    bad = [i for i in indices if not 0 <= i < len(steps)]
    if bad:
        raise ValueError(f"indices: {bad} outside the path's steps 0..{len(steps) - 1}")


def label_probability(logprobs: Mapping[int, float], positive: Sequence[int],
                      negative: Sequence[int]) -> float:
    """P(positive) / (P(positive) + P(negative)) from next-token log-probs.

    The probabilities of every listed variant present are summed per side. When the
    log-probs are a top-k list and one side has no variant in it, that side is bounded
    from above by the smallest listed probability (the k-th: an absent token is less likely
    than every listed one), so the score stays defined and is conservative. When neither
    side is present the score is 0.5.
    """
    pos = sum(math.exp(logprobs[i]) for i in set(positive) if i in logprobs)
    neg = sum(math.exp(logprobs[i]) for i in set(negative) if i in logprobs)
    if pos == 0.0 and neg == 0.0:
        return 0.5
    floor = math.exp(min(logprobs.values()))
    pos = pos or floor
    neg = neg or floor
    return pos / (pos + neg)


def softmax_positive(values: Sequence[float], positive_index: int) -> float:
    """Softmax over raw class scores, the probability of class `positive_index`."""
    top = max(values)
    exps = [math.exp(v - top) for v in values]
    return exps[positive_index] / sum(exps)


def sigmoid(value: float) -> float:
    if value >= 0:
        return 1.0 / (1.0 + math.exp(-value))
    return math.exp(value) / (1.0 + math.exp(value))  # no overflow for very negative values


def token_positions_of_char_ends(tokenizer: Any, text: str, char_ends: Sequence[int],
                                 add_special_tokens: bool) -> tuple[list[int], list[int]]:
    """Tokenize `text` once; for each character offset `end` (one past a marker's last
    character) return the position of the token holding character `end - 1`."""
    enc = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
    positions = []
    for end in char_ends:
        hits = [i for i, (start, stop) in enumerate(offsets) if start <= end - 1 < stop]
        if not hits:
            raise ValueError(f"no token covers character {end - 1} of the scored text")
        positions.append(hits[-1])
    return ids, positions


class PlusMinusLabels:
    """For PRMs that classify a step with the tokens "+" (good) and "-" (bad)."""

    @property
    def plus_id(self) -> int:
        return self.encode("+")[-1]  # type: ignore[attr-defined]

    @property
    def minus_id(self) -> int:
        return self.encode("-")[-1]  # type: ignore[attr-defined]
