"""Each generator family's step and path limits: what its conf/generator yaml sets.

Each is sized so that the engine length (`tts.config.limits.engine_length`: 1024 for the
prompt + the path + 2 steps) fits the model's context and that of every registry verifier
(4096, Qwen2.5-Math's and its PRMs', the smallest), so that any registry pair composes, and
so that the step stays at or under the shortest path a run config sets for every generator
(accuracy.yaml's 384), so that every config composes with every generator.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GenerationLimits:
    """A generator family's `generator.step_max_tokens` and `generator.max_total_tokens`."""

    step_max_tokens: int
    max_total_tokens: int


# The paper's generators (Qwen2.5-Math, Llama-3.2): 1024 + 2048 + 2 x 256 = 3584 <= 4096.
# search-and-learn lets a step run to 2048 tokens; "\n\n"-separated steps rarely pass 256,
# and a longer one is cut there while its path goes on.
PAPER_LIMITS = GenerationLimits(step_max_tokens=256, max_total_tokens=2048)
# SmolLM2-135M on CPU: short steps and paths keep a run to minutes (1984 <= 8192).
SMOLLM2_LIMITS = GenerationLimits(step_max_tokens=96, max_total_tokens=768)
# Qwen2.5-Coder (context 32768) on CPU: 1024 + 1024 + 2 x 256 = 2560.
CODER_LIMITS = GenerationLimits(step_max_tokens=256, max_total_tokens=1024)
