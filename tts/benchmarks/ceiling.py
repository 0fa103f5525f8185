"""`tts bench --config-name=ceiling`: what the engine's generator path costs over raw vLLM.

For each batch size B, the same B requests (the dataset's first problem, chat-templated
with the generator's system prompt; seeds 0..B-1; `ceiling.new_tokens` each; EOS ignored on
every path, so every path decodes exactly B x new_tokens tokens) are timed three ways in
this one process:

- raw: `vllm.LLM.generate` on an engine with nothing of ours installed;
- engine, `vllm` sampler: `VllmGenerator`'s add/step loop (`LLMEngine.add_request` and
  `step`, streamed deltas, our scheduler probe), vLLM's own sampler;
- engine, `position` sampler: the same loop with the position-keyed sampler
  (`tts.backends.vllm.sampling`).

Both engines load the same weights with the same settings; each timed run starts on an
empty prefix cache, after an untimed warm-up at that batch size. The paths alternate within
each repeat (their order rotates), so drift on a shared machine hits them alike; the
reported ratio is the median over repeats of engine / raw from the same repeat.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from tts.config.limits import PROMPT_ROOM, ceiling_length
from tts.markdown import markdown_table

RAW = "raw"


def run_ceiling(cfg_node: DictConfig, progress=None, on_folder=None) -> Path:
    """Run the ceiling benchmark the config describes; returns the results folder."""
    from omegaconf import OmegaConf

    from tts.backends.factory import read_prompt
    from tts.backends.vllm.engine import make_llm, read_hf_config, resolve_dtype
    from tts.backends.vllm.generator import VllmGenerator, sampler_engine_kwargs
    from tts.config.compose import ConfigError, to_yaml, validate
    from tts.config.enums import BackendKind
    from tts.models.resolve import resolve_model
    from tts.results.host import host_info
    from tts.results.store import RunStore
    from tts.problems import load_problems_for

    cfg = validate(cfg_node)
    c, g = cfg.ceiling, cfg.generator
    if g.backend is not BackendKind.vllm:
        raise ConfigError("generator.backend: the ceiling benchmark times vLLM; valid choices: vllm")
    problems = load_problems_for(cfg)
    if not problems:
        raise ConfigError("dataset: the subset selects no problems")
    model = str(resolve_model(g.model))
    hf = read_hf_config(model)
    dtype = resolve_dtype(g.dtype, hf)
    store = RunStore.create(cfg.bench.results_dir, cfg.bench.run_name, False, f"ceiling-{dtype}")
    store.write_config(to_yaml(cfg_node))
    if on_folder:
        on_folder(store.path)
    from tts.backends.vllm.model_runner import pin_for_sampler

    runner = pin_for_sampler("position" in c.samplers)  # before the first engine (model_runner.py)
    host = host_info({"generator": dtype}, model_runner=runner)

    common = _engine_kwargs(cfg, hf, dtype, max(c.batches), c.new_tokens)
    raw_llm = make_llm(model, **common)
    gen = VllmGenerator(make_llm(model, **common, engine_kwargs=sampler_engine_kwargs(True)))
    try:
        prompt = gen.encode_prompt(problems[0].problem, read_prompt(g.system_prompt_file))
        if len(prompt) > PROMPT_ROOM:
            raise ConfigError(f"dataset: the first problem's prompt has {len(prompt)} tokens, over the "
                              f"{PROMPT_ROOM} the engines hold for it")
        timer = _Timer(raw_llm, gen, prompt, c.new_tokens, g.temperature, g.top_p)
        rows = []
        for b in c.batches:
            rows += timer.measure(b, list(c.samplers), c.repeats)
            if progress:
                progress(b)
    finally:
        gen.close()
        from tts.backends.vllm.internals import shutdown_llm
        shutdown_llm(raw_llm)
    summary = {"host": host, "ceiling": rows, "ceiling_table_md": format_ceiling(rows),
               "prompt_tokens": len(prompt), "new_tokens": c.new_tokens, "repeats": c.repeats,
               "config": OmegaConf.to_container(cfg_node.ceiling, resolve=True)}
    store.write_summary(summary)
    return store.path


def _engine_kwargs(cfg, hf: dict, dtype: str, batch: int, new_tokens: int) -> dict:
    """One engine's settings for `batch` requests of `new_tokens` on a shared prompt: one
    whole sequence (the prompt, up to PROMPT_ROOM tokens), plus each request's own tokens with two
    blocks of slack (its prompt's partial last block, its last block). The engine runs in
    the mode the run's engines do (`memory.enforce_eager`), so raw vLLM is timed as the
    search's engines run."""
    from tts.backends.vllm.engine import kv_bytes_per_token

    seq = ceiling_length(new_tokens, cfg.memory.block_size)
    kv_bytes = (seq + batch * (new_tokens + 2 * cfg.memory.block_size)) * kv_bytes_per_token(hf, dtype)
    return dict(kv_cache_bytes=kv_bytes, gpu_memory_utilization=None, block_size=cfg.memory.block_size,
                max_num_seqs=batch, max_num_batched_tokens=max(cfg.memory.max_num_batched_tokens, seq),
                dtype=dtype, seed=cfg.bench.seed, min_tokens_per_seq=seq,
                enforce_eager=cfg.memory.enforce_eager)


def raw_generator(cfg, problem: str) -> dict:
    """Raw vLLM's tok/s at the run's sequences in flight (`bench.raw_generator`): the raw
    path of this benchmark at batch `search.n x bench.concurrency`, `generator.step_max_tokens`
    new tokens each on `problem`'s prompt, after an untimed warm-up, `ceiling.repeats`
    repeats; `tok_s` is their median.

    Also one sequence's decode rate on the same prompt (`single_tok_s`, median of the
    repeats): the tokens after the first over the time they took, i.e. a run of
    `step_max_tokens` tokens less a run of one (prefill and the first token). A path's tokens
    are decoded one engine step after another, so a schedule that samples as the run does
    completes a path at about this rate at best: the reference for precise goodput (mean
    path tokens over mean completion time). Not a strict bound: it is timed with the run's
    seeded sampling (greedy decoding skips it and measured 1.18 of it on a float32 AMD host)
    and moves by ±10% between repeats on a shared host. The engine is shut down before it
    returns."""
    from tts.backends.codec import ChatCodec
    from tts.backends.factory import read_prompt
    from tts.backends.vllm.engine import make_llm, read_hf_config, resolve_dtype
    from tts.backends.vllm.internals import shutdown_llm
    from tts.config.compose import ConfigError
    from tts.models.resolve import resolve_model

    g = cfg.generator
    model = str(resolve_model(g.model))
    hf = read_hf_config(model)
    dtype = resolve_dtype(g.dtype, hf)
    batch, tokens = cfg.search.n * cfg.bench.concurrency, g.step_max_tokens
    llm = make_llm(model, **_engine_kwargs(cfg, hf, dtype, batch, tokens))
    try:
        prompt = ChatCodec(llm.get_tokenizer()).encode_prompt(problem, read_prompt(g.system_prompt_file))
        if len(prompt) > PROMPT_ROOM:
            raise ConfigError(f"bench.raw_generator: the first problem's prompt has {len(prompt)} tokens, over the "
                              f"{PROMPT_ROOM} the engines hold for it")
        timer = _Timer(llm, None, prompt, tokens, g.temperature, g.top_p)
        timer._run(RAW, batch, tokens=8)  # warm-up: kernels for this batch shape
        runs = [batch * tokens / timer._run(RAW, batch, tokens) for _ in range(cfg.ceiling.repeats)]
        timer._run(RAW, 1, tokens=8)  # warm-up: one sequence
        single = [(tokens - 1) / (timer._run(RAW, 1, tokens) - timer._run(RAW, 1, 1))
                  for _ in range(cfg.ceiling.repeats)] if tokens > 1 else []
    finally:
        shutdown_llm(llm)
        del llm  # a frame kept alive by a library must not keep the engine (factory._make_generator)
    out = {"batch": batch, "new_tokens": tokens, "prompt_tokens": len(prompt), "dtype": dtype,
           "repeats": len(runs), "tok_s_runs": runs, "tok_s": statistics.median(runs)}
    if single:
        out.update(single_tok_s_runs=single, single_tok_s=statistics.median(single))
    return out


class _Timer:
    """Times the three paths on the same requests."""

    def __init__(self, raw_llm: Any, gen: Any, prompt: list[int], new_tokens: int,
                 temperature: float, top_p: float) -> None:
        self.raw_llm, self.gen, self.prompt = raw_llm, gen, list(prompt)
        self.new_tokens, self.temperature, self.top_p = new_tokens, temperature, top_p

    def measure(self, batch: int, samplers: list[str], repeats: int) -> list[dict]:
        paths = [RAW] + samplers
        for path in paths:  # warm-up: kernels for this batch shape, untimed
            self._run(path, batch, tokens=8)
        times: dict[str, list[float]] = {p: [] for p in paths}
        for r in range(repeats):
            for path in paths[r % len(paths):] + paths[:r % len(paths)]:
                times[path].append(self._run(path, batch, self.new_tokens))
        work = batch * self.new_tokens
        raw = [work / t for t in times[RAW]]
        rows = []
        for sampler in samplers:
            mine = [work / t for t in times[sampler]]
            rows.append({"batch": batch, "sampler": sampler, "raw_tok_s": statistics.median(raw),
                         "engine_tok_s": statistics.median(mine),
                         "ratio": statistics.median(m / w for m, w in zip(mine, raw))})
        return rows

    def _run(self, path: str, batch: int, tokens: int) -> float:
        """Seconds to generate `tokens` for each of `batch` requests on `path`, from an
        empty prefix cache; checks that every request made exactly that many tokens."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        from tts.backends.base import GenRequest

        if path == RAW:
            self.raw_llm.reset_prefix_cache()
            params = [SamplingParams(max_tokens=tokens, temperature=self.temperature, top_p=self.top_p,
                                     seed=i, ignore_eos=True) for i in range(batch)]
            start = time.perf_counter()
            outs = self.raw_llm.generate([TokensPrompt(prompt_token_ids=self.prompt)] * batch, params,
                                         use_tqdm=False)
            wall = time.perf_counter() - start
            made = [len(o.outputs[0].token_ids) for o in outs]
        else:
            gen = self.gen
            gen.reset_prefix_cache()
            gen.resumable_sampling = path == "position"
            made_by: dict[str, int] = {}
            start = time.perf_counter()
            for i in range(batch):
                gen.add(GenRequest(f"c{i}", tuple(self.prompt), tokens, seed=i, temperature=self.temperature,
                                   top_p=self.top_p, ignore_eos=True))
            while gen.num_unfinished():
                deltas, _ = gen.step()
                for d in deltas:
                    made_by[d.request_id] = made_by.get(d.request_id, 0) + len(d.new_token_ids)
            wall = time.perf_counter() - start
            made = list(made_by.values())
        if made != [tokens] * batch:
            raise RuntimeError(f"ceiling: {path} made {made} tokens, not {tokens} per request")
        return wall


def format_ceiling(rows: list[dict]) -> str:
    """The Markdown table: raw tok/s and each sampler's engine/raw ratio, per batch."""
    samplers = list(dict.fromkeys(r["sampler"] for r in rows))
    head = ["batch", "raw tok/s", *(c for s in samplers for c in (f"engine ({s}) tok/s", f"{s}/raw"))]
    lines = []
    for batch in dict.fromkeys(r["batch"] for r in rows):
        mine = {r["sampler"]: r for r in rows if r["batch"] == batch}
        raw = next(iter(mine.values()))["raw_tok_s"]
        lines.append([batch, f"{raw:.0f}", *(c for s in samplers
                                               for c in (f"{mine[s]['engine_tok_s']:.0f}", f"{mine[s]['ratio']:.2f}"))])
    return markdown_table(head, lines)
