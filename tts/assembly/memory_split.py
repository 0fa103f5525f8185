"""M: apply the roofline-guided KV split to the engines of a run.

At start the split sizes each engine's KV budget (vLLM fixes it at engine creation).
While the run goes on, `RuntimeAllocator` re-plans each engine's batch cap within its own
KV whenever the workload changes (live beams, path lengths). Both count a prefix that
paths share once, as vLLM's prefix cache holds it: a tree's siblings share their parent's
path, and sizing each child for its whole context (the paper's rule) halves the batch
under memory pressure (docs/results.md, "Memory pressure").
"""

from __future__ import annotations

import json
from pathlib import Path

from tts.backends.factory import GIB, EngineSpec
from tts.config.schema import Config, OptimConfig
from tts.memory.allocator import Workload, search_caps
from tts.memory.device import DeviceProfile, device_from_dict
from tts.memory.policy import KVSplit, RooflineSplit
from tts.memory.roofline import ModelShape
from tts.search import is_tree

PROMPT_TOKENS = 160  # a typical chat-templated problem prompt; refined at run time


def model_config(model: str) -> dict:
    """A model's config.json: its folder's when it is here, else the registry's
    architecture for a hub model not downloaded (a replay prices it without weights), else
    the folder `resolve_model` fetches."""
    from tts.models.cache import folder_problems, local_path
    from tts.models.registry import find_spec
    from tts.models.resolve import resolve_model

    spec = find_spec(model)
    if spec is not None and spec.architecture and folder_problems(local_path(spec.key)):
        return dict(spec.architecture)
    return json.loads((Path(resolve_model(model)) / "config.json").read_text())


def model_shape(model: str, dtype: str = "auto") -> ModelShape:
    """The roofline shape of a registry model or folder, at the dtype its engine runs in."""
    from tts.backends.vllm.engine import dtype_bytes

    config = model_config(model)
    return ModelShape.from_hf_config(config, dtype_bytes=dtype_bytes(dtype, config))


def device_profile(cfg: Config) -> DeviceProfile:
    from dataclasses import asdict

    return device_from_dict(asdict(cfg.device))


def kv_bytes_per_token(model) -> int:
    """KV bytes per token of a generator or verifier config, at the dtype its engine runs
    in (the fake backend's `KV_BYTES_PER_TOKEN`)."""
    from tts.config.enums import BackendKind

    if model.backend is BackendKind.fake:
        from tts.backends.fake import KV_BYTES_PER_TOKEN
        return KV_BYTES_PER_TOKEN
    from tts.backends.vllm.engine import kv_bytes_per_token as per_token

    return per_token(model_config(model.model), model.dtype, getattr(model, "tensor_parallel_size", 1))


def working_set_bytes(cfg: Config) -> int:
    """The search's KV working set: every live path (`search.n` per problem, `bench.concurrency`
    problems) at its longest (a typical prompt, `PROMPT_TOKENS`, and `generator.max_total_tokens`),
    in the generator's KV and the verifier's. Paths that share a prefix share its blocks in a
    prefix cache, so the distinct working set is smaller: a budget of this size holds the search
    whatever the order; pressure begins well below it (`memory.working_set_fraction`)."""
    tokens = cfg.search.n * cfg.bench.concurrency * (PROMPT_TOKENS + cfg.generator.max_total_tokens)
    return tokens * (kv_bytes_per_token(cfg.generator) + kv_bytes_per_token(cfg.verifier))


def planned_context_blocks(cfg: Config, path_tokens: int) -> float:
    """Full KV blocks of context each live path holds on its own account in a prefix cache,
    planned before the tree exists: a problem's `search.n` paths share its prompt, and a
    tree search's `search.beam_width` siblings their parent's path (independent samples
    share only the prompt)."""
    block, n = cfg.memory.block_size, cfg.search.n
    siblings = cfg.search.beam_width if is_tree(cfg.search.algorithm) else 1
    prompt = PROMPT_TOKENS // block
    return prompt / n + ((PROMPT_TOKENS + path_tokens) // block - prompt) / siblings


def context_blocks(beams, block_size: int) -> float:
    """Full KV blocks of context each beam holds on its own account: the distinct full
    blocks of all the beams' token sequences (a prefix cache holds a shared prefix once)
    over the number of beams. Blocks are keyed by their whole prefix, as vLLM hashes them."""
    seen: set[int] = set()
    for beam in beams:
        ids, key = beam.token_ids, 0
        for start in range(0, len(ids) - block_size + 1, block_size):
            key = hash((key, ids[start:start + block_size]))
            seen.add(key)
    return len(seen) / max(1, len(beams))


def workload_for(cfg: Config, beams: int, path_tokens: int, prompt_tokens: int = PROMPT_TOKENS,
                 shared_blocks: float | None = None, step: int = 0) -> Workload:
    """The next step's workload for `beams` paths of `path_tokens` after a prompt, each
    decoding `step` tokens (0: `generator.step_max_tokens`); with `shared_blocks` (full
    context blocks each holds on its own account, `context_blocks`), the KV sizing counts a
    shared prefix once."""
    step = step or cfg.generator.step_max_tokens
    context = prompt_tokens + path_tokens
    return Workload(num_requests=max(1, beams), verifier_seq_len=context + step, decode_len=step,
                    gen_context_len=context, block_size=cfg.memory.block_size, context_blocks=shared_blocks)


def _shapes(cfg: Config) -> tuple[ModelShape, ModelShape]:
    return model_shape(cfg.generator.model, cfg.generator.dtype), model_shape(cfg.verifier.model, cfg.verifier.dtype)


def _peak(cfg: Config) -> Workload:
    """The run's peak workload: every path of every problem in flight, half way to its
    longest, sharing prefixes as the search shares them (`planned_context_blocks`)."""
    path = cfg.generator.max_total_tokens // 2
    return workload_for(cfg, cfg.search.n * cfg.bench.concurrency, path,
                        shared_blocks=planned_context_blocks(cfg, path))


def _split(cfg: Config, workload: Workload) -> KVSplit | None:
    policy = RooflineSplit(*_shapes(cfg), device=device_profile(cfg))
    return policy.split(int(cfg.memory.kv_cache_gib * GIB), workload)


def caps_within(cfg: Config, workload: Workload, gen_kv: int, ver_kv: int) -> tuple[int, int]:
    """The (generator, verifier) batch caps for `workload` within each engine's KV bytes,
    fixed when the engines start (`search_caps`); (1, 1) when one request does not fit."""
    alloc = search_caps(*_shapes(cfg), device_profile(cfg), workload, gen_kv, ver_kv)
    return (1, 1) if alloc is None else (alloc.b_dec, alloc.b_pre)


def plan_memory(cfg: Config, optim: OptimConfig) -> tuple[EngineSpec, EngineSpec]:
    """Engine KV budgets from the roofline split for the run's peak workload."""
    if cfg.memory.offload_idle_model:
        # The allocator prices the offload option (search_allocation's extended mode),
        # but putting the idle engine to sleep needs vLLM's sleep mode, which is GPU-only,
        # and the engine does not drive it yet.
        raise ValueError("memory.offload_idle_model: offloading the idle model at run time is not "
                         "implemented (vLLM sleep mode is GPU-only); set it to false")
    beams = cfg.search.n * cfg.bench.concurrency
    split = _split(cfg, _peak(cfg))
    if split is None:
        raise ValueError(f"memory.kv_cache_gib={cfg.memory.kv_cache_gib}: too small to hold one generator "
                         "and one verifier sequence; raise it")
    gen_kv, ver_kv = _with_floors(cfg, split.generator_kv_bytes, split.verifier_kv_bytes)
    # The engines' slots (vLLM's max_num_seqs, fixed at start) must hold every batch cap a
    # re-plan can choose (`RuntimeAllocator`: at most one per beam in flight); the cap the
    # split chose for the peak workload is set when the engine is built (`initial_caps`).
    return (EngineSpec(gen_kv, max(split.generator_max_seqs, beams, 1)),
            EngineSpec(ver_kv, max(split.verifier_max_seqs, beams, 1)))


def _with_floors(cfg: Config, gen_kv: int, ver_kv: int) -> tuple[int, int]:
    """The split, with each engine raised to the KV vLLM needs to start at all (one longest
    sequence, plus its null block and a sliding window's extra block), taken from the other's
    share: a small workload's split can give an engine less than that. ValueError when the
    budget cannot hold both."""
    from tts.backends.vllm.engine import blocks_to_start, kv_bytes_per_token
    from tts.config.limits import engine_length

    g = cfg.generator
    longest = engine_length(g)
    block = cfg.memory.block_size

    def floor(model: str, dtype: str) -> int:
        config = model_config(model)
        return blocks_to_start(config, longest, block) * block * kv_bytes_per_token(config, dtype)

    gen_floor, ver_floor = floor(g.model, g.dtype), floor(cfg.verifier.model, cfg.verifier.dtype)
    total = gen_kv + ver_kv
    if total < gen_floor + ver_floor:
        raise ValueError(f"memory.kv_cache_gib={cfg.memory.kv_cache_gib}: {total} bytes cannot hold one "
                         f"sequence of {longest} tokens in each engine ({gen_floor} + {ver_floor} bytes); raise it")
    if gen_kv < gen_floor:
        gen_kv, ver_kv = gen_floor, total - gen_floor
    if ver_kv < ver_floor:
        gen_kv, ver_kv = total - ver_floor, ver_floor
    return gen_kv, ver_kv


ENGINE_RESERVE = 1 << 30  # per engine on a GPU: CUDA graphs, cuBLAS and attention workspaces


def engine_overhead_bytes(shape: ModelShape, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    """What one engine holds on a GPU besides its weights and KV cache (an estimate): the
    peak activations of vLLM's start-up profiling pass (`max_num_batched_tokens` tokens
    through one layer: q, k, v, the MLP's gate and up projections, the residual), float32
    logits for `max_num_seqs` rows with the sampler's copies of them (four), and
    `ENGINE_RESERVE`."""
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    per_token = q + 2 * kv + 2 * shape.intermediate_size + 2 * shape.hidden_size
    activations = max_num_batched_tokens * per_token * shape.dtype_bytes
    logits = 4 * max_num_seqs * shape.vocab_size * 4
    return activations + logits + ENGINE_RESERVE


def gpu_kv_budget(cfg: Config, free_bytes: int) -> int:
    """The run's total KV budget on a GPU with `free_bytes` free (`memory.gpu_free_fraction`):
    that share of it, less the weights and `engine_overhead_bytes` of each vLLM engine the
    run starts. ValueError naming the numbers when nothing is left for the KV cache."""
    from tts.config.limits import engine_length
    from tts.config.enums import BackendKind

    m, g = cfg.memory, cfg.generator
    batched = max(m.max_num_batched_tokens, engine_length(g))
    weights = overhead = 0
    for model, seqs in ((g, m.generator_max_num_seqs), (cfg.verifier, m.verifier_max_num_seqs)):
        if model.backend is BackendKind.vllm:
            shape = model_shape(model.model, model.dtype)
            weights += shape.weight_bytes
            overhead += engine_overhead_bytes(shape, batched, seqs)
    share = int(free_bytes * m.gpu_free_fraction)
    budget = share - weights - overhead
    if budget <= 0:
        raise ValueError(f"memory.gpu_free_fraction={m.gpu_free_fraction}: {share / GIB:.2f} GiB of the GPU's "
                         f"{free_bytes / GIB:.2f} GiB free leave no KV cache after the models' weights "
                         f"({weights / GIB:.2f} GiB) and activations ({overhead / GIB:.2f} GiB); free the GPU, "
                         "raise the share, or choose smaller models")
    return budget


def initial_caps(cfg: Config, gen_kv: int, ver_kv: int) -> tuple[int, int]:
    """The (generator, verifier) batch caps of the run's peak workload within the engines'
    KV bytes (`plan_memory`'s)."""
    return caps_within(cfg, _peak(cfg), gen_kv, ver_kv)


class RuntimeAllocator:
    """Re-plans the batch caps as the workload changes (live beams, their lengths, how much
    of their context they share), each within its engine's KV bytes: vLLM fixed those when
    the engines started, so a cap the split of the whole budget would choose (the paper's
    rule) can ask an engine for KV it does not have, or leave idle KV it does."""

    def __init__(self, cfg: Config, generator, verifier, gen_kv: int, ver_kv: int) -> None:
        self.cfg = cfg
        self.gen = generator
        self.ver = verifier
        self.kv = (gen_kv, ver_kv)
        self._last: tuple[int, int] | None = None
        self.history: list[dict] = []

    def __call__(self, beams) -> None:
        n = len(beams)
        if n == 0:
            return
        block = self.cfg.memory.block_size
        context = sum(len(b.token_ids) for b in beams) // n
        own = context_blocks(beams, block)
        step = last_step_tokens(beams, self.cfg.generator.step_max_tokens)
        workload = workload_for(self.cfg, n, context, prompt_tokens=0, shared_blocks=own, step=step)
        caps = caps_within(self.cfg, workload, *self.kv)
        if caps == self._last:
            return
        self._last = caps
        self.gen.set_limits(batch_cap=caps[0])
        if self.ver is not None:
            self.ver.set_limits(batch_cap=caps[1])
        self.history.append({"beams": n, "context_tokens": context, "own_context_blocks": round(own, 2),
                             "step_tokens": step, "b_dec": caps[0], "b_pre": caps[1]})

    def summary(self) -> dict:
        """The re-plans for the run's step logs (`memory_split`): how many, and the last
        `KEPT_REPLANS` (live beams, their mean context, the full context blocks each holds
        on its own, the step it was sized for, the caps set)."""
        return {"replans": len(self.history), "kv_bytes": list(self.kv), "history": self.history[-KEPT_REPLANS:]}


KEPT_REPLANS = 200


def last_step_tokens(beams, step_max: int) -> int:
    """What a step will decode (S_dec): the mean length of the steps the beams' last
    iteration drew, rounded up (a step stops at its delimiter, far short of
    `generator.step_max_tokens` as a rule); the limit itself before the first step. Sized by
    the longest step instead, the caps left a third of the generator's KV idle under
    pressure (docs/results.md); a step longer than the mean finds its KV as vLLM finds it
    for any request, blocks as it decodes and preemption when none are left."""
    drawn = [b.steps[-1].num_tokens for b in beams if getattr(b, "steps", ())]
    return min(step_max, max(1, -(-sum(drawn) // len(drawn)))) if drawn else step_max
