"""`skywork`: Skywork-o1-Open-PRM (Qwen2.5 1.5B/7B), a value head read at step tokens.

Input (Skywork's reference `prepare_input`, step token "\\n"): the ids of
"{bos_token}{problem}\\n", then for each step the ids of the step text (stripped) followed by
the id of the step token "\\n". Pieces are tokenized separately, exactly as the reference
does, so step i's reward position is the index of the "\\n" appended after it. The reward
is sigmoid(value head) at that position. A step's own internal newlines are kept (the
reference would split there; we read only the appended step tokens).

The checkpoint's architecture (`Qwen2ForPrmModel`) is not in vLLM 0.32: tts registers it
through vLLM's plugin mechanism (`tts/backends/vllm/prm_models.py`), one raw value per
token from a pooling request (`token_classify`, activation off). One request per path,
ending at its last scored step token, so the path before it comes from the prefix cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tts.backends.adapters.base import (
    PrmAdapter, PromptSpec, ReadKind, ScoreOutput, check_indices, sigmoid,
)

STEP_TOKEN = "\n"


class SkyworkAdapter(PrmAdapter):
    """Value-head PRM: one POOLING request per path, one position per scored step."""

    name = "skywork"
    engine_kwargs: dict[str, Any] = {"runner": "pooling"}

    @property
    def step_token_id(self) -> int:
        return self.encode(STEP_TOKEN)[-1]

    def build(self, problem: str, steps: Sequence[str], indices: Sequence[int]) -> list[PromptSpec]:
        check_indices(steps, indices)
        bos = getattr(self.tokenizer, "bos_token", None) or ""
        ids = self.encode(bos + problem.strip() + STEP_TOKEN)
        ends = []
        for step in steps[: max(indices) + 1]:
            ids += self.encode(step.strip()) + [self.step_token_id]
            ends.append(len(ids) - 1)
        return [PromptSpec(tuple(ids), ReadKind.POOLING, positions=tuple(ends[i] for i in indices))]

    def read(self, outputs: Sequence[ScoreOutput]) -> tuple[float, ...]:
        (output,) = outputs
        return tuple(sigmoid(v[0]) for v in output.values)
