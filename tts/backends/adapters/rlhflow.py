"""`rlhflow`: RLHFlow/Llama3.1-8B-PRM-Deepseek-Data, a multi-turn "+"/"-" classifier.

Input (the model card's format), rendered with the model's chat template:
user "{problem} {step 1}", assistant "+", user "{step 2}", assistant "+", ...,
user "{step k}", then the assistant header (generation prompt). The earlier assistant
turns are filled with "+", as in the reference code. The score of step k is P("+") against
P("-") for the next token: exactly the logits the reference reads at position -3 of the
conversation that ends with "+<|eot_id|>". One NEXT_TOKEN request per scored index; the
requests of one path share their first turns, so the prefix cache serves them.
"""

from __future__ import annotations

from collections.abc import Sequence

from tts.backends.adapters.base import (
    PlusMinusLabels, PrmAdapter, PromptSpec, ReadKind, ScoreOutput, check_indices, label_probability,
)


class RlhflowAdapter(PlusMinusLabels, PrmAdapter):
    """Chat PRM: one NEXT_TOKEN request per index, label tokens "+" and "-"."""

    name = "rlhflow"
    request_per_index = True

    def conversation(self, problem: str, steps: Sequence[str], index: int) -> list[dict[str, str]]:
        """The turns that score step `index` (0-based), before the generation prompt."""
        messages: list[dict[str, str]] = []
        for i, step in enumerate(steps[: index + 1]):
            text = f"{problem.strip()} {step.strip()}" if i == 0 else step.strip()
            messages.append({"role": "user", "content": text})
            if i < index:
                messages.append({"role": "assistant", "content": "+"})
        return messages

    def build(self, problem: str, steps: Sequence[str], indices: Sequence[int]) -> list[PromptSpec]:
        check_indices(steps, indices)
        labels = (self.plus_id, self.minus_id)
        specs = []
        for index in indices:
            text = self.tokenizer.apply_chat_template(
                self.conversation(problem, steps, index), tokenize=False,
                add_generation_prompt=True)
            specs.append(PromptSpec(tuple(self.encode(str(text))), ReadKind.NEXT_TOKEN,
                                    label_ids=labels))
        return specs

    def read(self, outputs: Sequence[ScoreOutput]) -> tuple[float, ...]:
        return tuple(label_probability(o.logprobs[0], [self.plus_id], [self.minus_id])
                     for o in outputs)
