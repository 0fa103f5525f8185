"""`judge`: a chat model asked whether the last step is correct; score = P(Yes) / (P(Yes) + P(No)).

Layout (chat template of the verifier model; instructions from conf/prompts/judge.txt as
the system turn, the rest as the user turn, then the assistant header):

    <system>{instructions}</system><user>Problem: {problem}

    Step 1: {step 1}

    ...

    Step k: {step k}

    Is step k correct? Answer Yes or No.</user><assistant>

Everything before "\\n\\nIs step k correct?" depends only on the problem and steps 1..k,
and is tokenized piece by piece (frame, problem, each step), so the token ids of the
prompt for step k start with the token ids of the prompt for step j < k minus its question.
Siblings thus share the whole path before their own step, and vLLM's prefix cache serves it.
Templates without a system role get the instructions at the start of the user turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tts.backends.adapters.base import (
    PrmAdapter, PromptSpec, ReadKind, ScoreOutput, check_indices, label_probability,
)

PROMPTS_DIR = Path(__file__).resolve().parents[3] / "conf" / "prompts"
_SENTINEL = "\x00CONTENT\x00"
YES_VARIANTS: tuple[str, ...] = (" Yes", "Yes", " yes", "yes", " YES", "YES")
NO_VARIANTS: tuple[str, ...] = (" No", "No", " no", "no", " NO", "NO")


def load_prompt(name: str) -> str:
    """A prompt file: absolute path, or a name under the repository's conf/prompts/."""
    path = Path(name) if Path(name).is_absolute() else PROMPTS_DIR / name
    if not path.is_file():
        raise ValueError(f"judge_prompt_file: {str(path)!r} does not exist")
    return path.read_text().strip()


class JudgeAdapter(PrmAdapter):
    """Any chat LLM as a step judge: one NEXT_TOKEN request per scored index."""

    name = "judge"
    request_per_index = True
    reads_partial_steps = True  # it asks whether the text so far is correct

    def __init__(self, tokenizer: Any, prompt_file: str = "judge.txt",
                 use_chat_template: bool = True) -> None:
        super().__init__(tokenizer)
        self.instructions = load_prompt(prompt_file)
        self.header, self.footer = self._frame(use_chat_template)
        self.yes_ids = self._variant_ids(YES_VARIANTS)
        self.no_ids = self._variant_ids(NO_VARIANTS)
        if not self.yes_ids or not self.no_ids:
            raise ValueError("judge: the tokenizer has no single-token Yes/No variant")

    def _frame(self, use_chat_template: bool) -> tuple[str, str]:
        """Text before and after the user content (instructions folded in)."""
        if not use_chat_template or not getattr(self.tokenizer, "chat_template", None):
            return self.instructions + "\n\n", "\n\nAnswer:"
        system = [{"role": "system", "content": self.instructions},
                  {"role": "user", "content": _SENTINEL}]
        inline = [{"role": "user", "content": self.instructions + "\n\n" + _SENTINEL}]
        from jinja2 import TemplateError

        last_error: Exception | None = None
        for messages in (system, inline):
            try:
                text = self.tokenizer.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=True)
            except (TemplateError, ValueError) as err:  # e.g. "system role not supported"
                last_error = err
                continue
            header, _, footer = str(text).partition(_SENTINEL)
            return header, footer
        raise ValueError(f"judge: the chat template cannot be rendered: {last_error}")

    def _variant_ids(self, variants: Sequence[str]) -> tuple[int, ...]:
        ids = {tuple(self.encode(v)) for v in variants}
        return tuple(sorted(i[0] for i in ids if len(i) == 1))

    @property
    def label_ids(self) -> tuple[int, ...]:
        return self.yes_ids + self.no_ids

    def prefix_pieces(self, problem: str, steps: Sequence[str]) -> list[list[int]]:
        """Token ids of the shared part: frame + problem, then one piece per step."""
        pieces = [self.encode(self.header + "Problem: " + problem.strip())]
        pieces += [self.encode(f"\n\nStep {i + 1}: {s.strip()}") for i, s in enumerate(steps)]
        return pieces

    def question_ids(self, index: int) -> list[int]:
        """Token ids that end the prompt for step `index` (0-based)."""
        return self.encode(f"\n\nIs step {index + 1} correct? Answer Yes or No." + self.footer)

    def build(self, problem: str, steps: Sequence[str], indices: Sequence[int]) -> list[PromptSpec]:
        check_indices(steps, indices)
        pieces = self.prefix_pieces(problem, steps[: max(indices) + 1])
        specs = []
        for index in indices:
            ids = [t for piece in pieces[: index + 2] for t in piece] + self.question_ids(index)
            specs.append(PromptSpec(tuple(ids), ReadKind.NEXT_TOKEN, label_ids=self.label_ids))
        return specs

    def read(self, outputs: Sequence[ScoreOutput]) -> tuple[float, ...]:
        return tuple(label_probability(o.logprobs[0], self.yes_ids, self.no_ids) for o in outputs)
