"""PRM adapters by name: how each reward-model family is prompted and read.

| name | model family | read |
|---|---|---|
| `judge` | any chat LLM (default: SmolLM2-135M-Instruct) | P(Yes) vs P(No), next token |
| `math_shepherd` | peiyi9979/math-shepherd-mistral-7b-prm | P(+) vs P(-) at "ки" tags, prompt log-probs |
| `rlhflow` | RLHFlow/Llama3.1-8B-PRM-Deepseek-Data | P(+) vs P(-) after each user turn, next token |
| `skywork` | Skywork-o1-Open-PRM-Qwen-2.5-1.5B/7B | sigmoid(value head) at step tokens, pooling |
| `qwen_prm` | Qwen/Qwen2.5-Math-PRM-7B | softmax(2-class head) at "<extra_0>", pooling |
"""

from __future__ import annotations

from typing import Any

from tts.backends.adapters.base import PrmAdapter, PromptSpec, ReadKind, ScoreOutput
from tts.backends.adapters.judge import JudgeAdapter
from tts.backends.adapters.math_shepherd import MathShepherdAdapter
from tts.backends.adapters.qwen_prm import QwenPrmAdapter
from tts.backends.adapters.rlhflow import RlhflowAdapter
from tts.backends.adapters.skywork import SkyworkAdapter

ADAPTERS: dict[str, type[PrmAdapter]] = {
    cls.name: cls for cls in
    (JudgeAdapter, MathShepherdAdapter, RlhflowAdapter, SkyworkAdapter, QwenPrmAdapter)
}


def adapter_class(name: str) -> type[PrmAdapter]:
    """The adapter class registered as `name`; ValueError listing the valid names."""
    try:
        return ADAPTERS[name]
    except KeyError:
        raise ValueError(
            f"verifier.adapter: unknown {name!r}; valid: {', '.join(ADAPTERS)}") from None


def make_adapter(name: str, tokenizer: Any, **options: Any) -> PrmAdapter:
    """An adapter instance for `tokenizer` (options: e.g. the judge's `prompt_file`)."""
    return adapter_class(name)(tokenizer, **options)


__all__ = ["ADAPTERS", "PrmAdapter", "PromptSpec", "ReadKind", "ScoreOutput", "adapter_class",
           "make_adapter"]
