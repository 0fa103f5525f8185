"""Step cost models for a replay, and for a run recorded for a card (`bench.record_for`,
whose speculation guard weighs each step at its price there): the seconds one engine step
of a model takes.

A step decodes one token for each of some sequences (each at its context length) and
prefills chunks of prompts (each some new tokens after some cached ones).

- `FittedCost`: the run's own fitted `t = a + b * decode + c * prefill`
  (`tts.metrics.cost_model`), which knows nothing of context length.
- `RooflineCost`: the FlashTTS roofline (`tts.memory.roofline`, section 4.3 of the
  paper) on a device profile. The weights are read once per step; decode reads each
  sequence's KV context; prefill is compute-bound for any real chunk, and attends to its
  cached context as well. A step of F FLOPs and B bytes on an L-layer model costs

      measured (`replay.step_costs=measured`, the default), where the profile has a
      `StepEfficiency`:   launch + L * layer_us + max(F / (peak * compute), B / (bandwidth * memory))
      datasheet:          launch + max(F / peak, B / bandwidth)

  The efficiencies are fitted to steps timed on that GPU (`tts.profiling.step_fit`); a
  profile without them (the CPU's, whose numbers are measured rates already) is priced at
  its own numbers in either mode, and `describe()` says so. `launch_s` is the per-step
  work outside the kernels (vLLM's scheduler, sampler, input preparation), an assumption
  of the replay (`replay.launch_ms`) in both modes: no measurement here covers it. Under
  `datasheet` it also stands for the kernels' own fixed time, which `measured` prices as
  `layer_us`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tts.memory.device import DeviceProfile, StepEfficiency
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
    measured: bool = False
    """True: price at the device's measured efficiencies where it has them (the replay's
    default, `replay.step_costs=measured`); False: the datasheet roofline."""

    @property
    def efficiency(self) -> StepEfficiency | None:
        """The efficiencies this price uses: None prices at the profile's own numbers."""
        return self.device.efficiency if self.measured else None

    def work(self, decode_ctx: Sequence[int], prefill: Sequence[tuple[int, int]]) -> tuple[float, float]:
        """(FLOPs, bytes) of one step, the weights' bytes included."""
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
        return flops, bytes_ + s.weight_bytes

    def kernel_s(self, flops: float, bytes_: float) -> float:
        """Seconds the kernels of a step of `flops` and `bytes_` take (no launch)."""
        d, eff = self.device, self.efficiency
        if eff is None:
            return max(flops / (d.peak_tflops * 1e12), bytes_ / (d.bandwidth_gbs * 1e9))
        return (self.shape.num_layers * eff.layer_us * 1e-6
                + max(flops / (d.peak_tflops * 1e12 * eff.compute), bytes_ / (d.bandwidth_gbs * 1e9 * eff.memory)))

    def step_s(self, decode_ctx: Sequence[int], prefill: Sequence[tuple[int, int]]) -> float:
        if not decode_ctx and not prefill:
            return 0.0
        return self.launch_s + self.kernel_s(*self.work(decode_ctx, prefill))

    def prices(self) -> str:
        """Which numbers price a step: the measured efficiencies and their source, or the datasheet's."""
        d, eff = self.device, self.efficiency
        if eff is not None:
            return (f"measured step costs (compute {eff.compute:g}, memory {eff.memory:g} of the datasheet, "
                    f"{eff.layer_us:g} us/layer; {eff.source})")
        if self.measured:  # the CPU's; or a GPU profile recorded before its card was measured
            hint = f"; device={d.name} takes conf/device's profile, with them where measured" if d.kind == "gpu" else ""
            return (f"{d.name}'s profile numbers (replay.step_costs=measured; the profile has no measured "
                    f"efficiencies{hint})")
        return "datasheet step costs (replay.step_costs=datasheet)"

    def describe(self) -> str:
        return (f"roofline on {self.device.name} ({self.device.peak_tflops:g} TFLOP/s, "
                f"{self.device.bandwidth_gbs:g} GB/s) at {self.prices()}, launch {self.launch_s * 1e3:g} ms/step, "
                f"{self.shape.num_params / 1e9:.2f} B params x {self.shape.dtype_bytes} bytes")
