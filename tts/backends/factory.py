"""Build the generator and verifier a config names, with their KV budgets.

Both vLLM engines live in one process. Engines are kept and reused across the variants
of a comparison run (startup costs seconds); between variants their prefix caches are
reset so that no variant inherits another's warm cache. A variant whose engine differs
(its KV split, with `optim.roofline_memory`) gets a new one, built only once the old one is
closed and its memory freed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tts.backends.base import Generator, Verifier
from tts.config.limits import engine_length
from tts.config.compose import ConfigError
from tts.config.enums import BackendKind, Overlap, Sampler
from tts.config.schema import Config

GIB = 1 << 30
CONF_PROMPTS = Path(__file__).resolve().parents[2] / "conf" / "prompts"


def read_prompt(name: str) -> str:
    path = Path(name) if Path(name).is_absolute() else CONF_PROMPTS / name
    if not path.exists():
        raise ValueError(f"prompt file {path} does not exist (generator.system_prompt_file / "
                         "verifier.judge_prompt_file)")
    return path.read_text().strip()


@dataclass(frozen=True)
class EngineSpec:
    kv_bytes: int
    max_num_seqs: int


def static_split(cfg: Config) -> tuple[EngineSpec, EngineSpec]:
    total = int(cfg.memory.kv_cache_gib * GIB)
    gen = int(total * cfg.memory.generator_fraction)
    return (EngineSpec(gen, cfg.memory.generator_max_num_seqs),
            EngineSpec(total - gen, cfg.memory.verifier_max_num_seqs))


def resolve_sampler(cfg: Config) -> Sampler:
    """The sampler the generator really uses: `generator.sampler`, with `auto` resolved to
    `position` where the generator's logits are exact (float32, or batch-invariant kernels:
    `vllm.engine.exact_logits`) and to vLLM's own sampler where they are not (bf16). The
    fake backend is exact unless run in bf16 or fp16 (`FakeGenerator.batch_dependent`)."""
    g = cfg.generator
    if g.sampler is not Sampler.auto:
        return g.sampler
    if g.backend is BackendKind.fake:
        return Sampler.vllm if fake_inexact(g.dtype) else Sampler.position
    from tts.backends.vllm.engine import exact_logits, read_hf_config
    from tts.models.resolve import resolve_model

    exact = exact_logits(g.dtype, read_hf_config(resolve_model(g.model)))
    return Sampler.position if exact else Sampler.vllm


def resolve_overlap(cfg: Config, role: str) -> bool:
    """Whether `role`'s engine ("generator" or "verifier") runs with overlap (`Overlap`:
    vLLM's asynchronous scheduling). `auto` is on where the models run on CUDA
    (`models_on_cuda`, the test the GPU memory settings follow too), except for a verifier
    with a reward head (vLLM keeps pooling synchronous); `on` where they do not is a
    ConfigError, since vLLM on a CPU switches asynchronous scheduling off
    (`vllm/platforms/cpu.py`). The fake backend lags one step with `on` only."""
    model = getattr(cfg, role)
    if model.backend is BackendKind.fake:
        return model.overlap is Overlap.on
    on_cuda = models_on_cuda(cfg)
    if model.overlap is Overlap.on and not on_cuda:
        raise ConfigError(f"{role}.overlap=on: vLLM overlaps its scheduling with the model (asynchronous "
                          "scheduling) on CUDA only, and no CUDA device runs these models (vLLM on a CPU "
                          f"switches it off); use {role}.overlap=auto or off")
    if model.overlap is Overlap.auto:
        return on_cuda and not (role == "verifier" and _reward_head(cfg))
    return model.overlap is Overlap.on


def _reward_head(cfg: Config) -> bool:
    """The verifier runs on vLLM's pooling runner (a value or classification head)."""
    from tts.backends.adapters import adapter_class

    return adapter_class(cfg.verifier.adapter.value).engine_kwargs.get("runner") == "pooling"


def overlaps(cfg: Config) -> dict[str, bool]:
    """Each engine's overlap (`resolve_overlap`), as a run's host records it."""
    return {role: resolve_overlap(cfg, role) for role in ("generator", "verifier")}


def fake_inexact(dtype: str) -> bool:
    """The fake generator in bf16 or fp16: its tokens depend on the batch, as such logits do."""
    return dtype in ("bfloat16", "float16")


class Backends:
    """Owns the two backends of a run; rebuilds an engine only when its spec, model, dtype
    or sampler changes."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self._gen: tuple[tuple, Generator] | None = None
        self._ver: tuple[tuple, Verifier] | None = None

    def start_variant(self, name: str) -> None:
        """The next engines built serve variant `name` (a replay's backends keep per-variant
        state; vLLM's need none)."""

    def get(self, gen_spec: EngineSpec, ver_spec: EngineSpec | None) -> tuple[Generator, Verifier | None]:
        """The engines for these specs: kept where the spec, model, dtype and sampler (or
        adapter) are the same, with their prefix caches reset (the next variant starts cold,
        like the first); otherwise the old one is closed and dropped, and its memory freed
        (`release_memory`), before any new one is built. The caller must hold no other
        reference to an engine it replaces (the previous variant's `Engine`)."""
        g, v = self.cfg.generator, self.cfg.verifier
        gen_key = (gen_spec, g.model, g.backend, g.dtype, g.sampler, g.overlap)
        ver_key = None if ver_spec is None else (ver_spec, v.model, v.backend, v.dtype, v.adapter, v.overlap)
        stale = [slot for slot, key in (("_gen", gen_key), ("_ver", ver_key))
                 if key is not None and getattr(self, slot) is not None and getattr(self, slot)[0] != key]
        for slot in stale:
            self._drop(slot)
        if stale and self._real():
            release_memory()
        if self._gen is None:
            self._gen = (gen_key, self._make_generator(gen_spec))
        else:
            self._gen[1].reset_prefix_cache()
        if ver_spec is None:
            return self._gen[1], None
        if self._ver is None:
            self._ver = (ver_key, self._make_verifier(ver_spec))
        else:
            self._ver[1].reset_prefix_cache()
        return self._gen[1], self._ver[1]

    def verifier_alone(self) -> Verifier:
        """The verifier by itself, on its share of the static split (scoring recorded paths:
        no generator loads)."""
        ver_spec = static_split(self.cfg)[1]
        if self._ver is None:
            v = self.cfg.verifier
            self._ver = ((ver_spec, v.model, v.backend, v.dtype, v.adapter, v.overlap), self._make_verifier(ver_spec))
        return self._ver[1]

    def _make_generator(self, spec: EngineSpec) -> Generator:
        g = self.cfg.generator
        position = resolve_sampler(self.cfg) is Sampler.position
        overlap = resolve_overlap(self.cfg, "generator")
        if g.backend is BackendKind.fake:
            from tts.backends.fake import FakeGenerator, cache_blocks
            # the fake's two modes are the two samplers' semantics; overlap is its one-step lag
            return FakeGenerator(batch_cap=spec.max_num_seqs, sampling="context" if position else "stream",
                                 batch_dependent=fake_inexact(g.dtype), cache_blocks=cache_blocks(spec.kv_bytes),
                                 lag=overlap)
        from tts.backends.vllm.generator import VllmGenerator, sampler_engine_kwargs
        # no local names the engine: a frame that outlives its call (a library that keeps a
        # traceback of an import done while the engine was built) would keep it alive
        return VllmGenerator(self._llm(g.model, g.dtype, spec, engine_length(g), sampler_engine_kwargs(position),
                                       overlap), resumable_sampling=position)

    def _make_verifier(self, spec: EngineSpec) -> Verifier:
        v = self.cfg.verifier
        if v.backend is BackendKind.fake:
            from tts.backends.fake import FakeVerifier, cache_blocks
            return FakeVerifier(cache_blocks=cache_blocks(spec.kv_bytes))
        from tts.backends.adapters import adapter_class, make_adapter
        from tts.backends.vllm.verifier import VllmVerifier, verifier_engine_kwargs
        name = v.adapter.value
        adapter_class(name)  # an unknown adapter fails before any model loads
        llm = self._llm(v.model, v.dtype, spec, engine_length(self.cfg.generator), verifier_engine_kwargs(name),
                        resolve_overlap(self.cfg, "verifier"))
        options = {"prompt_file": v.judge_prompt_file} if name == "judge" else {}
        verifier = VllmVerifier(llm, make_adapter(name, llm.get_tokenizer(), **options))
        del llm  # as in _make_generator: no local holds the engine once this returns
        return verifier

    def _llm(self, model: str, dtype: str, spec: EngineSpec, longest: int,
             engine_kwargs: dict | None = None, overlap: bool = False):
        """One in-process vLLM engine whose KV cache is exactly `spec.kv_bytes`, on CPU and on
        a GPU alike (vLLM's `kv_cache_memory_bytes`), so the static or roofline split is what
        each engine gets. On a GPU (untested here) vLLM's start-up check is given the
        fraction of the device free at that moment (`make_llm`). `overlap`: vLLM's
        asynchronous scheduling (`resolve_overlap`)."""
        from tts.backends.vllm.engine import make_llm
        from tts.models.resolve import resolve_model

        m = self.cfg.memory
        return make_llm(str(resolve_model(model)), kv_cache_bytes=spec.kv_bytes, gpu_memory_utilization=None,
                        block_size=m.block_size, max_num_seqs=spec.max_num_seqs,
                        max_num_batched_tokens=max(m.max_num_batched_tokens, longest), dtype=dtype,
                        seed=self.cfg.bench.seed, tensor_parallel_size=self.cfg.generator.tensor_parallel_size,
                        min_tokens_per_seq=longest, enforce_eager=m.enforce_eager, engine_kwargs=engine_kwargs,
                        async_scheduling=overlap)

    def _drop(self, slot: str) -> None:
        """Close the engine in `slot` and forget it (forgotten first: a failed close must not
        leave it behind)."""
        pair = getattr(self, slot)
        setattr(self, slot, None)
        if pair is not None:
            pair[1].close()

    def close(self) -> None:
        self._drop("_gen")
        self._drop("_ver")
        if self._real():
            release_memory()

    def _real(self) -> bool:
        """Whether an engine here holds memory worth collecting (a fake one holds none, and
        a full collection costs a fifth of a second in a process that imported torch)."""
        return BackendKind.vllm in (self.cfg.generator.backend, self.cfg.verifier.backend)


def models_on_cuda(cfg) -> bool:
    """Whether the run's models run on a CUDA GPU: a vLLM generator or verifier (the fake
    backend runs no model) on a host where torch sees a CUDA device. The one test a run's
    GPU settings follow (`memory: auto`, the device profile, the KV budget from the card's
    free memory); `cfg` a Config or its DictConfig."""
    kinds = {getattr(model.backend, "value", model.backend) for model in (cfg.generator, cfg.verifier)}
    if BackendKind.vllm.value not in kinds:
        return False
    from tts.backends.vllm.engine import has_cuda

    return has_cuda()


def release_memory() -> None:
    """Free what closed engines held: collect the reference cycles they leave, then, on a
    GPU, hand PyTorch's cached blocks back to the device, so the next engine's start-up
    check sees them free. Engines must be closed and unreferenced first. What a pass froze
    (`tts.bench.record.settle_heap`) is unfrozen first: a frozen cycle is never collected."""
    import gc
    import sys

    gc.unfreeze()
    gc.collect()
    if "torch" in sys.modules:  # a fake-backend run never imports it
        from tts.backends.vllm.engine import has_cuda

        if has_cuda():
            import torch

            torch.cuda.empty_cache()

