"""`math_shepherd`: peiyi9979/math-shepherd-mistral-7b-prm, token probabilities at step tags.

Input (the model card's format): "{problem} Step 1: {step 1} ки\\nStep 2: {step 2} ки\\n..."
tokenized as one string with the tokenizer's special tokens (BOS for Mistral). The score of
step i is softmax over the logits of "+" and "-" at the position of the i-th "ки" tag,
probability of "+": the distribution of the token *after* the tag. One request per path,
cut after the last scored step (later steps cannot change earlier causal logits); every
requested index is read from its prompt log-probs.

vLLM 0.32 returns prompt log-probs as a top-k list per position (exact label log-probs
need the V2 model runner), so a label missing from the top-k is bounded as in
`label_probability`. Requests with prompt log-probs get no prefix-cache hits.
"""

from __future__ import annotations

from collections.abc import Sequence

from tts.backends.adapters.base import (
    PlusMinusLabels, PrmAdapter, PromptSpec, ReadKind, ScoreOutput, check_indices, label_probability,
    token_positions_of_char_ends,
)

STEP_TAG = "ки"


class MathShepherdAdapter(PlusMinusLabels, PrmAdapter):
    """Step-tag PRM read from prompt log-probs: one PROMPT_TOKENS request per path."""

    name = "math_shepherd"
    reads_prefix_cache = False  # prompt log-probs: vLLM 0.32 gives such requests no cache hits

    def text(self, problem: str, steps: Sequence[str]) -> tuple[str, list[int]]:
        """The scored text, and the character offset just past each step's tag."""
        text = problem.strip() + " "
        tag_ends = []
        for i, step in enumerate(steps):
            text += f"Step {i + 1}: {step.strip()} {STEP_TAG}"
            tag_ends.append(len(text))
            text += "\n"
        return text, tag_ends

    def build(self, problem: str, steps: Sequence[str], indices: Sequence[int]) -> list[PromptSpec]:
        check_indices(steps, indices)
        text, tag_ends = self.text(problem, steps[: max(indices) + 1])
        text = text.removesuffix("\n")
        ids, positions = token_positions_of_char_ends(
            self.tokenizer, text, [tag_ends[i] for i in indices], add_special_tokens=True)
        return [PromptSpec(tuple(ids), ReadKind.PROMPT_TOKENS,
                           label_ids=(self.plus_id, self.minus_id), positions=tuple(positions))]

    def read(self, outputs: Sequence[ScoreOutput]) -> tuple[float, ...]:
        (output,) = outputs
        return tuple(label_probability(lp, [self.plus_id], [self.minus_id])
                     for lp in output.logprobs)
