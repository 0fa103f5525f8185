"""Step cost models for a replay: the seconds one engine step of a model takes.

A step decodes one token for each of some sequences (each at its context length) and
prefills chunks of prompts (each some new tokens after some cached ones).

- `FittedCost`: the run's own fitted `t = a + b * decode + c * prefill`
  (`tts.metrics.cost_model`), which knows nothing of context length.
- `RooflineCost`: the FlashTTS roofline (`tts.memory.roofline`, section 4.3 of the
  paper) on a device profile: `launch + max(FLOPs / peak, bytes / bandwidth)`. The
  weights are read once per step; decode reads each sequence's KV context; prefill is
  compute-bound for any real chunk, and attends to its cached context as well.
  `launch_s` is the per-step overhead outside the kernels (scheduling, sampling,
  launches), an assumption of the replay (`replay.launch_ms`), not a datasheet figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tts.memory.device import DeviceProfile
from tts.memory.roofline import ModelShape, decode_cost, prefill_cost
from tts.metrics.cost_model import CostModel


class StepCost(Protocol):
    def step_s(self, decode_ctx: Sequence[int], prefill: Sequence[tuple[int, int]]) -> float:
        """Seconds for one step: `decode_ctx` the context of each decoding sequence,
        `prefill` (new tokens, cached context before them) of each prefill chunk."""


@dataclass(frozen=True)
class FittedCost:
    model: CostModel

    def step_s(self, decode_ctx: Sequence[int], prefill: Sequence[tuple[int, int]]) -> float:
        return self.model.time(1, len(decode_ctx), sum(n for n, _ in prefill))

    def describe(self) -> str:
        m = self.model
        return (f"fitted a={m.step_s * 1e3:.2f} ms, b={m.per_decode_seq_s * 1e3:.3f} ms/seq, "
                f"c={m.per_prefill_token_s * 1e3:.4f} ms/token (r2 {m.r2:.2f} on {m.steps} steps)")


@dataclass(frozen=True)
class RooflineCost:
    shape: ModelShape
    device: DeviceProfile
    launch_s: float

    def step_s(self, decode_ctx: Sequence[int], prefill: Sequence[tuple[int, int]]) -> float:
        s = self.shape
        flops = bytes_ = 0.0
        for ctx in decode_ctx:
            c = decode_cost(s, ctx)
            flops += c.flops_per_seq
            bytes_ += c.bytes_per_seq
        for new, cached in prefill:
            c = prefill_cost(s, new)
            # the chunk's queries also attend to the cached context, which is read once
            flops += c.flops_per_seq + 4 * s.num_layers * s.num_heads * s.head_dim * new * cached
            bytes_ += c.bytes_per_seq + s.kv_bytes_per_token * cached
        if not decode_ctx and not prefill:
            return 0.0
        bytes_ += s.weight_bytes
        compute = flops / (self.device.peak_tflops * 1e12)
        memory = bytes_ / (self.device.bandwidth_gbs * 1e9)
        return self.launch_s + max(compute, memory)

    def describe(self) -> str:
        return (f"roofline on {self.device.name} ({self.device.peak_tflops:g} TFLOP/s, "
                f"{self.device.bandwidth_gbs:g} GB/s), launch {self.launch_s * 1e3:g} ms/step, "
                f"{self.shape.num_params / 1e9:.2f} B params x {self.shape.dtype_bytes} bytes")
