"""Per-engine memory breakdown, read from a running vLLM engine (thesis section 5.1).

Components, per model:

- ``weights_bytes``: on GPU, vLLM's own ``model_runner.model_memory_usage`` (device memory
  taken while the weights loaded). On CPU vLLM does not measure it; the bytes are summed
  over the loaded model's tensors, and the linear layers that vLLM's CPU backend repacks
  into oneDNN buffers (their ``weight`` parameter is left empty) are counted at their
  logical size (output x input partition x dtype bytes).
- ``peak_activation_bytes``: vLLM's ``worker.peak_activation_memory`` (the transient
  torch peak of its profiling forward pass). ``None`` on CPU: with an explicit KV size and
  eager mode vLLM skips the profiling pass there.
- ``non_torch_bytes``: vLLM's view, ``worker.total_consumed - weights`` (memory its
  instance took outside the weights: non-torch allocations and persistent buffers). GPU only.
- ``kv_cache_bytes`` / ``kv_num_blocks`` / ``block_size`` / ``kv_bytes_per_token``: the
  engine's ``KVCacheConfig`` (the tensors vLLM allocated) and ``kv_cache_info``.
  ``kv_tokens`` is blocks x block size (the null block included);
  ``kv_cache_size_tokens`` and ``max_concurrency`` are vLLM's own figures, the ones it logs
  as "KV cache size: N tokens, Maximum concurrency for L tokens per request: Cx"
  (N = C x L, C = blocks / blocks of one max-length request).
- ``measured_start_bytes``: memory the process (CPU: RSS) or the device (GPU: used memory
  from ``torch.cuda.mem_get_info``) gained while this engine started; ``other_bytes`` is
  that minus weights and KV: the engine's runtime, non-torch and allocator overhead as
  actually observed. The first engine in a process also carries one-off library set-up;
  an engine started after others were closed can reuse their freed memory, so RSS then
  under-counts (``other_bytes`` may even be negative). `tts profile-memory` starts the two
  measured engines first in its process.

The multi-model profiling pitfall (thesis 5.1): when two engines share a GPU, the one
started second profiles against a device the first already fills, and vLLM versions that
read the other engine's memory as their own non-torch overhead under-size the second KV
cache and report a wrong breakdown. The correction implemented here: measure the device's
used memory right before and right after each engine starts and attribute exactly that
difference to the engine (``measured_start_bytes``), then derive the non-KV, non-weight
part from it (``other_bytes``) instead of trusting the second engine's ``non_torch_bytes``.
``non_torch_corrected_bytes`` holds that value on GPU. It cannot run on this project's CPU
machines; on CPU the same attribution is done with the process RSS.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tts.backends.vllm.engine import has_cuda, kv_cache_info
from tts.backends.vllm.internals import configure_vllm_logging, driver_worker, kv_cache_tensor_bytes

_LOG_WORDS = ("KV cache", "Checkpoint size", "Model loading took", "memory", "GiB")


@dataclass
class EngineStart:
    """Memory in use before and after one engine started, and vLLM's log lines meanwhile."""

    before: int = 0
    after: int = 0
    source: str = ""
    log: list[str] = field(default_factory=list)

    @property
    def delta(self) -> int:
        return self.after - self.before


class _Capture(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
        except Exception:  # a malformed third-party record must not break the profile
            return
        if any(w in msg for w in _LOG_WORDS):
            self.lines.append(msg)


def memory_in_use() -> tuple[int, str]:
    """Bytes in use now: the GPU's used memory when CUDA is present, else this process's RSS."""
    if has_cuda():
        import torch

        free, total = torch.cuda.mem_get_info()
        return int(total - free), "cuda mem_get_info (device used)"
    import psutil

    return int(psutil.Process().memory_info().rss), "process RSS"


@contextmanager
def measure_start() -> Iterator[EngineStart]:
    """Measure memory around an engine start and capture vLLM's memory-related log lines."""
    import vllm  # noqa: F401  -- import cost must not count as the engine's memory

    configure_vllm_logging()  # a handler added now keeps receiving vLLM's lines
    start = EngineStart()
    handler = _Capture(start.log)
    vllm_logger = logging.getLogger("vllm")
    vllm_logger.addHandler(handler)
    start.before, start.source = memory_in_use()
    try:
        yield start
    finally:
        start.after, _ = memory_in_use()
        vllm_logger.removeHandler(handler)


def weights_bytes(worker: Any) -> tuple[int | None, str]:
    """The engine's weight bytes and where the number comes from (see the module docstring)."""
    runner = getattr(worker, "model_runner", None)
    measured = getattr(runner, "model_memory_usage", None)
    if measured:
        return int(measured), "vLLM model_memory_usage"
    model = getattr(runner, "model", None)
    if model is None:
        return None, "unavailable"
    total, counted = 0, set()
    for module in model.modules():
        for t in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            key = (t.data_ptr(), t.numel())
            if key not in counted:  # tied weights (embedding = LM head) count once
                counted.add(key)
                total += t.numel() * t.element_size()
        total += _repacked_bytes(module)
    return total, "loaded tensors (CPU-repacked linears at logical size)"


def _repacked_bytes(module: Any) -> int:
    weight = getattr(module, "weight", None)
    if not hasattr(module, "cpu_linear") or weight is None or weight.numel() != 0:
        return 0
    rows = getattr(module, "output_size_per_partition", None)
    cols = getattr(module, "input_size_per_partition", None)
    if rows is None or cols is None:
        return 0
    dtype = getattr(module, "params_dtype", None) or weight.dtype
    return int(rows) * int(cols) * int(getattr(dtype, "itemsize", 2))


def engine_breakdown(llm: Any, start: EngineStart | None = None,
                     requested_kv_bytes: int | None = None) -> dict[str, Any]:
    """The memory components of one running engine (see the module docstring)."""
    info = kv_cache_info(llm)
    kv_bytes = kv_cache_tensor_bytes(llm)
    kv_bytes = info.total_bytes if kv_bytes is None else kv_bytes
    worker = driver_worker(llm)
    weights, weights_source = weights_bytes(worker)
    consumed = getattr(worker, "total_consumed", None)
    cache = llm.llm_engine.vllm_config.cache_config
    out: dict[str, Any] = {
        "model": str(llm.llm_engine.model_config.model),
        "weights_bytes": weights, "weights_source": weights_source,
        "peak_activation_bytes": _int_or_none(getattr(worker, "peak_activation_memory", None)),
        "non_torch_bytes": None if consumed is None or weights is None else int(consumed) - weights,
        "kv_cache_bytes": kv_bytes, "kv_num_blocks": info.num_blocks,
        "kv_usable_blocks": max(0, info.num_blocks - 1), "block_size": info.block_size,
        "kv_bytes_per_token": info.bytes_per_token,
        "kv_bytes_per_block": info.bytes_per_token * info.block_size,
        "kv_tokens": info.num_tokens,
        "kv_cache_size_tokens": _int_or_none(getattr(cache, "kv_cache_size_tokens", None)),
        "max_concurrency": _float_or_none(getattr(cache, "kv_cache_max_concurrency", None)),
        "max_model_len": int(llm.llm_engine.model_config.max_model_len),
        "requested_kv_bytes": requested_kv_bytes,
    }
    if start is not None:
        other = start.delta - (weights or 0) - kv_bytes
        out.update(measured_start_bytes=start.delta, measured_source=start.source,
                   other_bytes=other, vllm_log=list(start.log))
        if has_cuda():
            out["non_torch_corrected_bytes"] = max(0, other)
    return out


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


COMPONENTS: tuple[tuple[str, str], ...] = (
    ("weights_bytes", "weights"),
    ("peak_activation_bytes", "peak activations"),
    ("non_torch_bytes", "non-torch (vLLM)"),
    ("other_bytes", "other (measured)"),
    ("kv_cache_bytes", "KV cache"),
    ("measured_start_bytes", "measured at start"),
)
