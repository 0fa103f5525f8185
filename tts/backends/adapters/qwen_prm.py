"""`qwen_prm`: Qwen/Qwen2.5-Math-PRM-7B, a 2-class head read at "<extra_0>" separators.

Input (the model card's format), rendered with the model's chat template and no generation
prompt: system "Please reason step by step, and put your final answer within \\boxed{}.",
user "{problem}", assistant "{step 1}<extra_0>{step 2}<extra_0>...{step k}<extra_0>".
The score of step i is softmax over the head's two outputs at the i-th "<extra_0>",
probability of class 1 (correct). vLLM serves the checkpoint as
`Qwen2ForProcessRewardModel` (pooling runner); the verifier asks for the raw per-token
outputs (activation off, ALL pooling, the prefix cache read: see the verifier) and this
adapter applies the softmax. One request per path, ending at its last scored "<extra_0>".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tts.backends.adapters.base import (
    PrmAdapter, PromptSpec, ReadKind, ScoreOutput, check_indices, softmax_positive,
    token_positions_of_char_ends,
)

SEPARATOR = "<extra_0>"
SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."


class QwenPrmAdapter(PrmAdapter):
    """Reward-model pooling PRM: one POOLING request per path."""

    name = "qwen_prm"
    engine_kwargs: dict[str, Any] = {"runner": "pooling"}

    def build(self, problem: str, steps: Sequence[str], indices: Sequence[int]) -> list[PromptSpec]:
        check_indices(steps, indices)
        parts = [s.strip() + SEPARATOR for s in steps[: max(indices) + 1]]
        answer = "".join(parts)
        messages = [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": problem.strip()},
                    {"role": "assistant", "content": answer}]
        text = str(self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=False))
        sep_ends, cursor = [], text.rindex(answer)
        for part in parts:
            cursor += len(part)
            sep_ends.append(cursor)
        ids, positions = token_positions_of_char_ends(
            self.tokenizer, text, [sep_ends[i] for i in indices], add_special_tokens=False)
        # cut after the last scored "<extra_0>": later tokens cannot change a causal model's
        # earlier rows, and a last token is never served from the prefix cache
        return [PromptSpec(tuple(ids[: max(positions) + 1]), ReadKind.POOLING, positions=tuple(positions))]

    def read(self, outputs: Sequence[ScoreOutput]) -> tuple[float, ...]:
        (output,) = outputs
        return tuple(softmax_positive(v, 1) for v in output.values)
