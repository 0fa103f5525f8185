"""The measured generator/verifier KV split sweep of `tts profile-memory` (thesis 5.2, 6.1, 6.2).

For each generator share, both engines are built at that split through the run's own
machinery (`Backends`, `build_engine`), a `ThrashCounter` is attached to each engine's
block pool, a `BackendMeter` wraps the two backends, and the configured search runs over
the first ``profile.num_problems`` problems. Measured per split:

- ``system_tokens_per_s``: generated tokens / wall seconds of the whole run;
- ``generator_tokens_per_s``: generated tokens / seconds spent in generator steps;
- ``verifier_tokens_per_s``: verifier prompt tokens (cached included) / seconds in
  verifier calls;
- ``gen_hit_rate`` / ``ver_hit_rate``: cached prompt tokens / prompt tokens, from vLLM's
  per-request ``num_cached_tokens``;
- thrash, evictions and block hits/misses from the `ThrashCounter`s;
- KV blocks in use after every scheduling step (``kv_usage`` x usable blocks), per model.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from tts.backends.vllm.thrash import BlockUsageTrace, attach_counters, detach_counters

if TYPE_CHECKING:  # pragma: no cover
    from tts.backends.factory import Backends
    from tts.config.schema import Config

# Profile-only workload caps: (profile field, run config key). The profile runs the configured
# search with each limit capped by `ProfileConfig`'s field of that name, so that the default
# finishes in minutes. A cap only ever lowers a limit; null leaves the run config's value.
# `profile.concurrency` and `profile.kv_budget_tokens` set their keys outright (see
# `workload_overrides`).
PROFILE_CAPS: tuple[tuple[str, str], ...] = (
    ("search_n", "search.n"),
    ("step_max_tokens", "generator.step_max_tokens"),
    ("max_total_tokens", "generator.max_total_tokens"),
    ("max_iterations", "search.max_iterations"),
)


def workload_overrides(cfg: DictConfig) -> dict[str, Any]:
    """The run-config values the profile changes (dotted key -> value); see `PROFILE_CAPS`."""
    prof = cfg.get("profile") or {}
    out: dict[str, Any] = {}
    for name, key in PROFILE_CAPS:
        run_value = OmegaConf.select(cfg, key)
        cap = prof.get(name)
        if cap is not None and cap < run_value:
            out[key] = int(cap)
    n = out.get("search.n", cfg.search.n)
    width = int(cfg.search.beam_width)
    if n % width:
        out["search.beam_width"] = math.gcd(n, width)
    concurrency = prof.get("concurrency")
    if concurrency is not None and concurrency != cfg.bench.concurrency:
        out["bench.concurrency"] = int(concurrency)
    tokens = prof.get("kv_budget_tokens")
    per_token = _generator_kv_bytes_per_token(cfg) if tokens is not None else None
    if per_token is not None:
        out["memory.kv_cache_gib"] = round(int(tokens) * per_token / 2**30, 6)
    return out


def _generator_kv_bytes_per_token(cfg: DictConfig) -> int | None:
    """KV bytes per token of the generator at the dtype it runs in; None for the fake
    backend or a model that is not present (then memory.kv_cache_gib stays)."""
    from tts.backends.vllm.engine import kv_bytes_per_token, read_hf_config
    from tts.models.resolve import resolve_model

    if getattr(cfg.generator.backend, "value", cfg.generator.backend) == "fake":
        return None
    try:
        config = read_hf_config(resolve_model(cfg.generator.model))
    except FileNotFoundError:
        return None
    return kv_bytes_per_token(config, cfg.generator.dtype, int(cfg.generator.tensor_parallel_size))


def split_config(cfg: DictConfig, fraction: float, overrides: dict[str, Any]) -> Config:
    """The validated run config at one generator share, static split, profile workload."""
    from tts.config.compose import validate

    node = copy.deepcopy(cfg)
    node.memory.generator_fraction = float(fraction)
    node.optim.roofline_memory = False  # the sweep measures static splits
    for key, value in overrides.items():
        OmegaConf.update(node, key, value)
    return validate(node)


@dataclass
class ModelMeter:
    """What one backend did during a split's run."""

    seconds: float = 0.0
    tokens: int = 0  # generator: generated tokens; verifier: prompt tokens
    prompt_tokens: int = 0
    cached_tokens: int = 0
    calls: int = 0
    kv_usage: list[float] = field(default_factory=list)  # after each scheduling step

    @property
    def hit_rate(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    def rate(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 else None


class BackendMeter:
    """Times and counts the generator's steps and the verifier's calls, through the
    backends' own observer hooks (`Generator.add_step_observer`,
    `Verifier.add_score_observer`); `detach` removes them."""

    def __init__(self, generator: Any, verifier: Any | None) -> None:
        self.gen, self.ver = ModelMeter(), ModelMeter()
        self._removers = [generator.add_step_observer(self._on_step)]
        if verifier is not None:
            self._removers.append(verifier.add_score_observer(self._on_score))

    def _on_step(self, deltas: Any, stats: Any, wall_s: float) -> None:
        m = self.gen
        m.seconds += wall_s
        m.calls += 1
        m.tokens += sum(len(d.new_token_ids) for d in deltas)
        for d in deltas:
            if d.num_prompt_tokens is not None:
                m.prompt_tokens += d.num_prompt_tokens
                m.cached_tokens += d.num_cached_tokens or 0
        if stats.num_running or stats.num_waiting:
            m.kv_usage.append(float(stats.kv_usage))

    def _on_score(self, stats: Any, wall_s: float) -> None:
        m = self.ver
        m.seconds += wall_s
        m.calls += 1
        m.tokens += stats.prompt_tokens
        m.prompt_tokens += stats.prompt_tokens
        m.cached_tokens += stats.cached_tokens
        m.kv_usage.extend(float(s.kv_usage) for s in stats.step_stats if s.num_running or s.num_waiting)

    def detach(self) -> None:
        """Remove the observers."""
        for remove in self._removers:
            remove()
        self._removers.clear()


@dataclass
class SplitRun:
    """One split's measurements."""

    fraction: float
    wall_s: float
    problems: int
    meter: BackendMeter
    thrash: dict[str, dict[str, Any] | None]
    num_blocks: dict[str, int | None]
    kv_bytes: dict[str, int]
    scheduled_blocks: dict[str, list[int]] = field(default_factory=dict)

    def blocks_after_step(self, role: str) -> list[int] | list[float]:
        """KV blocks in use after each step, `StepStats.kv_usage` x usable blocks (usage
        fractions where the block count is unknown: fake backends)."""
        usage = (self.meter.gen if role == "generator" else self.meter.ver).kv_usage
        n = self.num_blocks.get(role)
        return [round(u * (n - 1)) for u in usage] if n else list(usage)

    def blocks_per_step(self, role: str) -> list[int] | list[float]:
        """KV blocks held by the batch of each scheduling step (`BlockUsageTrace`), else
        `blocks_after_step`."""
        return self.scheduled_blocks.get(role) or self.blocks_after_step(role)


def infeasible(cfg: Config) -> str | None:
    """Why this split cannot start (a KV budget below one longest sequence), or None."""
    from tts.backends.factory import static_split
    from tts.backends.vllm.engine import check_kv_budget, read_hf_config
    from tts.config.limits import engine_length
    from tts.config.enums import BackendKind
    from tts.models.resolve import resolve_model

    from tts.search import make_policy

    gen_spec, ver_spec = static_split(cfg)
    g = cfg.generator
    longest = engine_length(g)
    sides = [("generator", gen_spec, g.model, g.dtype, g.backend)]
    if make_policy(cfg.search, g.step_max_tokens, g.max_total_tokens).uses_verifier:
        sides.append(("verifier", ver_spec, cfg.verifier.model, cfg.verifier.dtype, cfg.verifier.backend))
    for role, spec, model, dtype, backend in sides:
        if backend is BackendKind.fake:
            continue
        try:
            check_kv_budget(read_hf_config(resolve_model(model)), kv_cache_bytes=spec.kv_bytes,
                            block_size=cfg.memory.block_size, dtype=dtype, min_tokens_per_seq=longest,
                            tensor_parallel_size=g.tensor_parallel_size)
        except ValueError as err:
            return f"{role}: {err}"
    return None


def run_split(cfg: Config, backends: Backends, problems: list[Any]) -> SplitRun:
    """Build both engines at `cfg`'s split (reusing them if already built), run the problems."""
    from tts.backends.factory import static_split
    from tts.engine.engine import ProblemInput
    from tts.assembly.build import build_engine

    backends.cfg = cfg
    engine = build_engine(cfg, cfg.optim, backends)
    gen, ver = engine.gen, engine.verifier
    meter = BackendMeter(gen, ver)
    counters = attach_counters(generator=gen, verifier=ver)
    traces = {r: BlockUsageTrace.attach(b.llm, strict=False)
              for r, b in (("generator", gen), ("verifier", ver)) if b is not None and b.llm is not None}
    start = time.perf_counter()
    try:
        done = sum(1 for _ in engine.run([ProblemInput(p.id, p.problem) for p in problems]))
    finally:
        wall = time.perf_counter() - start
        meter.detach()
        thrash = {r: (counters[r].snapshot() if r in counters else None) for r in ("generator", "verifier")}
        detach_counters(counters)
        for trace in traces.values():
            trace.detach()
    gen_spec, ver_spec = static_split(cfg)
    return SplitRun(
        fraction=cfg.memory.generator_fraction, wall_s=wall, problems=done, meter=meter, thrash=thrash,
        num_blocks={"generator": _num_blocks(gen), "verifier": _num_blocks(ver)},
        kv_bytes={"generator": _kv_bytes(gen, gen_spec.kv_bytes),
                  "verifier": _kv_bytes(ver, ver_spec.kv_bytes) if ver is not None else 0},
        scheduled_blocks={r: t.blocks for r, t in traces.items()})


def warm_up(generator: Any | None, verifier: Any | None) -> None:
    """One short request through each backend, so that one-off kernel set-up in the process
    is not timed as the first split's work (the sweep resets the prefix caches after)."""
    from tts.backends.base import GenRequest, ScoreRequest

    if generator is not None:
        prompt = tuple(generator.encode_prompt("What is 12 + 30?", ""))
        generator.add(GenRequest("profile-warm-up", prompt, max_tokens=8, seed=0))
        while generator.num_unfinished():
            generator.step()
    if verifier is not None:
        verifier.score([ScoreRequest("What is 12 + 30?", ("12 + 30 = 42.",), (0,))])


def _kv_bytes(backend: Any, requested: int) -> int:
    """The KV bytes the engine allocated (the requested budget for fake backends)."""
    llm = backend.llm
    if llm is None:
        return requested
    from tts.backends.vllm.engine import kv_cache_info

    return kv_cache_info(llm).total_bytes


def _num_blocks(backend: Any | None) -> int | None:
    llm = None if backend is None else backend.llm
    if llm is None:
        return None
    from tts.backends.vllm.engine import kv_cache_info

    return kv_cache_info(llm).num_blocks


def sweep_row(run: SplitRun) -> dict[str, Any]:
    """One `profile.json` sweep row; the first keys are the ones `tts report` plots first."""
    g, v = run.meter.gen, run.meter.ver
    t = {role: run.thrash.get(role) or {} for role in ("generator", "verifier")}
    row: dict[str, Any] = {
        "generator_fraction": run.fraction,
        "system_tokens_per_s": g.tokens / run.wall_s if run.wall_s > 0 else None,
        "generator_tokens_per_s": g.rate(), "verifier_tokens_per_s": v.rate(),
        "gen_thrash": t["generator"].get("thrash"), "ver_thrash": t["verifier"].get("thrash"),
        "gen_hit_rate": g.hit_rate, "ver_hit_rate": v.hit_rate,
        "gen_kv_blocks": run.num_blocks["generator"], "ver_kv_blocks": run.num_blocks["verifier"],
        "gen_kv_bytes": run.kv_bytes["generator"], "ver_kv_bytes": run.kv_bytes["verifier"],
        "wall_s": run.wall_s, "generator_s": g.seconds, "verifier_s": v.seconds,
        "gen_tokens": g.tokens, "ver_prompt_tokens": v.prompt_tokens, "problems": run.problems,
    }
    for role, prefix in (("generator", "gen"), ("verifier", "ver")):
        blocks = run.blocks_per_step(role)
        row[f"{prefix}_kv_blocks_peak"] = max(blocks) if blocks else None
        after = run.blocks_after_step(role)
        row[f"{prefix}_kv_blocks_after_step_mean"] = sum(after) / len(after) if after else None
        for key in ("thrash_blocks", "evictions", "hits", "misses", "lookups", "seen"):
            row[f"{prefix}_{'block_' + key if key in ('hits', 'misses') else key}"] = t[role].get(key)
    return row
