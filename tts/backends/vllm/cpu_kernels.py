"""vLLM's fused C++ RMSNorm kernels for its CPU path, run eagerly.

vLLM 0.32 dispatches `rms_norm` and `fused_add_rms_norm` through its IR op registry
(`vllm.ir.ops`), and on CPU it picks the PyTorch-native implementation: five to seven
separate tensor ops per call (casts, add, pow, mean, rsqrt, multiply), which vLLM expects
`torch.compile` to fuse. This project runs vLLM eagerly (`enforce_eager=True`: compiling
costs about a minute per engine at start), so each call pays every op's dispatch, and a
decoder layer makes two such calls. The CPU build of vLLM ships fused kernels for both
(`torch.ops._C.rms_norm`, `torch.ops._C.fused_add_rms_norm`, the ones its CUDA path uses);
vLLM only registers them for GPUs. `register()` adds them as the IR provider `tts_cpu`, and
`engine_kwargs()` puts it first in the engine's op priority (`kernel_config.ir_op_priority`),
native after it for any call it does not take.

Measured on an Intel Xeon with AMX (2 threads, bf16, SmolLM2-135M, raw `LLM.generate`,
greedy, 95 tokens): one sequence 40.6 -> 44.7 tok/s, 16 sequences 520 -> 567 tok/s,
the same tokens. The kernels normalise in float32 as the native path does; outputs agree
to bf16 rounding (`tests/test_backends_vllm.py`).

The op priority is process-wide (vLLM sets it when an engine starts), so every engine of the
process runs the same choice: `TTS_CPU_RMS_NORM=native` keeps vLLM's own. On a GPU nothing
changes (vLLM's CUDA kernels are already first there).
"""

# no `from __future__ import annotations`: vLLM infers each kernel's schema from its annotations
import os
from typing import Any

ENV = "TTS_CPU_RMS_NORM"
CHOICES = ("fused", "native")
PROVIDER = "tts_cpu"
OPS = ("rms_norm", "fused_add_rms_norm")

_registered = False


def choice() -> str:
    """`fused` (the default) or `native`, from `TTS_CPU_RMS_NORM`; anything else is an error."""
    value = os.environ.get(ENV, "fused").strip().lower() or "fused"
    if value not in CHOICES:
        raise ValueError(f"{ENV}: unknown {value!r}; valid choices: {', '.join(CHOICES)}")
    return value


def available() -> bool:
    """Whether this vLLM build has the IR registry and the CPU C++ kernels."""
    try:
        import torch
        import vllm._custom_ops  # noqa: F401  (loads torch.ops._C)
        from vllm import ir
    except ImportError:
        return False
    return all(hasattr(ir.ops, op) for op in OPS) and all(_has_op(torch, op) for op in OPS)


def _has_op(torch, name: str) -> bool:
    try:
        getattr(torch.ops._C, name)
    except (AttributeError, RuntimeError):
        return False
    return True


def _same_dtype(x, weight) -> bool:
    return weight is not None and weight.dtype == x.dtype and x.is_contiguous()


def register() -> bool:
    """Register the fused kernels as the IR provider `tts_cpu` (once per process). False
    where this vLLM build lacks them."""
    global _registered
    if _registered:
        return True
    if not available():
        return False
    import torch
    from vllm import ir

    def takes_norm(x, weight, epsilon, variance_size=None) -> bool:
        return variance_size is None and _same_dtype(x, weight)

    def takes_add_norm(x, x_residual, weight, epsilon, variance_size=None) -> bool:
        return variance_size is None and _same_dtype(x, weight) and x_residual.is_contiguous() \
            and x_residual.dtype == x.dtype

    @ir.ops.rms_norm.register_impl(PROVIDER, supports_args=takes_norm)
    def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, epsilon: float,
                 variance_size: int | None = None) -> torch.Tensor:
        out = torch.empty_like(x)
        torch.ops._C.rms_norm(out, x, weight, epsilon)
        return out

    @ir.ops.fused_add_rms_norm.register_impl(PROVIDER, supports_args=takes_add_norm, inplace=True)
    def fused_add_rms_norm(x: torch.Tensor, x_residual: torch.Tensor, weight: torch.Tensor | None,
                           epsilon: float, variance_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        # in place: x becomes the normalised sum, x_residual the sum
        torch.ops._C.fused_add_rms_norm(x, x_residual, weight, epsilon)
        return x, x_residual

    _registered = True
    return True


def engine_kwargs(on_gpu: bool) -> dict[str, Any]:
    """`vllm.LLM` keyword arguments that put the fused kernels first on CPU; none on a GPU,
    with `TTS_CPU_RMS_NORM=native`, or where the build lacks them."""
    if on_gpu or choice() == "native" or not register():
        return {}
    return {"kernel_config": {"ir_op_priority": {op: [PROVIDER, "native"] for op in OPS}}}
