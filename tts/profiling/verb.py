"""``tts profile-memory``: per-model memory breakdown and a measured sweep of the KV split.

What it does, for a composed run config (thesis chapters 5-6):

1. ``--calibrate`` (or ``profile.calibrate``): measure where the models run and print the
   numbers: this CPU, rewriting ``conf/device/cpu.yaml``, or the CUDA card, kept for the
   runs on it (``tts.profiling.gpu``).
2. Breakdown: start the generator, then the verifier, at the configured split
   (``memory.generator_fraction``, else the first feasible one) and read each engine's
   weights, peak activations, non-torch memory, KV cache bytes and blocks, block size and
   bytes per token from the engine itself, with the memory each start took
   (`tts.backends.vllm.memory_breakdown`).
3. Sweep: for each generator share in ``profile.splits`` (plus ``tight_split`` and
   ``loose_split``), rebuild both engines at that split, attach a `ThrashCounter` to each,
   run ``profile.num_problems`` problems with the configured search, and record
   throughputs, prefix-cache hit rates, thrash and KV blocks per scheduling step
   (`profile_sweep`). Splits whose KV share cannot hold one sequence are skipped, with why.
4. Write ``profile.json`` (the ``sweep`` rows are what ``tts report`` plots), the
   resolved ``config.yaml`` and the PNG plots (`profile_plots`) into one run folder
   (`RunStore.create`),
   and print the breakdown and the sweep as tables. The roofline model's view of the same
   splits is kept under ``modelled`` for comparison.

The workload is the run's search with its limits capped (`profile_sweep.PROFILE_CAPS`),
so that the default profile finishes in minutes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tts.markdown import number
from tts.results.store import PROFILE, RunStore

if TYPE_CHECKING:  # pragma: no cover
    from omegaconf import DictConfig
    from rich.console import Console

    from tts.backends.factory import Backends
    from tts.config.schema import Config
    from tts.memory.device import DeviceProfile
    from tts.profiling.sweep import SplitRun

MIB = 2**20


def profile_memory(cfg: DictConfig, calibrate: bool = False, console: Console | None = None) -> Path:
    """Run the memory profile of `cfg` (a composed run config); returns the results folder.

    The breakdown is taken at ``memory.generator_fraction`` or, when one engine cannot
    start there, at the first share in the sweep where both can. Raises ValueError for an
    invalid ``profile`` section, an empty problem subset, or a KV budget where no share
    starts both engines, and FileExistsError for a results folder that holds files.
    """
    from rich.console import Console

    from tts.backends.factory import Backends
    from tts.profiling.sweep import split_config, workload_overrides
    from tts.problems import load_problems_for

    from tts.profiling.host_device import on_this_host

    console = console or Console()
    calibrate = calibrate or bool(cfg.profile.get("calibrate", False))
    if not calibrate:  # another CPU's profile is measured here (calibrate measures anyway)
        cfg = on_this_host(cfg)
    fractions = _fractions(cfg)
    overrides = workload_overrides(cfg)
    share = _breakdown_share(cfg, overrides, fractions)
    run_order = ([share] if share in fractions else []) + [f for f in fractions if f != share]
    store = RunStore.create(cfg.bench.results_dir, cfg.bench.run_name, False, "profile", resumable=False)
    device = _device(cfg, calibrate, console)
    base = split_config(cfg, share, overrides)
    problems = load_problems_for(base)[: int(cfg.profile.num_problems)]
    if not problems:
        raise ValueError("dataset: the subset selects no problems to profile with")
    _print_workload(console, base, overrides, len(problems))
    backends = Backends(base)
    try:
        breakdown = build_breakdown(base, backends)
        if breakdown:
            console.print(breakdown_table(breakdown))
        runs, skipped = _sweep(cfg, overrides, run_order, backends, problems, console)
    finally:
        backends.close()
    profile = assemble(cfg, base, device, overrides, problems, breakdown, runs, skipped, fractions)
    _write(store, cfg, profile)
    console.print(sweep_table(profile["sweep"], profile.get("modelled")))
    console.print(f"profile written to {store.path}")
    return store.path


def _fractions(cfg: DictConfig) -> list[float]:
    """All generator shares to run (sweep, tight and loose), sorted; ValueError if invalid."""
    prof = cfg.profile
    splits = [float(f) for f in prof.splits]
    for name, value in (("profile.tight_split", prof.tight_split), ("profile.loose_split", prof.loose_split)):
        if not 0.0 < float(value) < 1.0:
            raise ValueError(f"{name}: {value} must be in (0, 1)")
    bad = [f for f in splits if not 0.0 < f < 1.0]
    if bad or not splits:
        raise ValueError(f"profile.splits: {list(prof.splits)}: give one or more generator shares in (0, 1)")
    if int(prof.num_problems) < 1:
        raise ValueError(f"profile.num_problems: {prof.num_problems} must be >= 1")
    return sorted({round(f, 6) for f in splits + [float(prof.tight_split), float(prof.loose_split)]})


def _breakdown_share(cfg: DictConfig, overrides: dict[str, Any], shares: list[float]) -> float:
    """The configured share if both engines can start there, else the first share that can."""
    from tts.profiling.sweep import infeasible, split_config

    reasons = []
    for f in dict.fromkeys([round(float(cfg.memory.generator_fraction), 6), *shares]):
        why = infeasible(split_config(cfg, f, overrides))
        if why is None:
            return f
        reasons.append(f"{f:g}: {why}")
    raise ValueError("memory.kv_cache_gib: no generator share can start both engines; " + "; ".join(reasons))


def _device(cfg: DictConfig, calibrate: bool, console: Console) -> DeviceProfile:
    """The run's device profile; with `calibrate`, where the models run measured first: the
    CUDA card (kept for the runs on it, `tts.profiling.gpu`) or this CPU (`conf/device/cpu.yaml`)."""
    from tts.backends.factory import models_on_cuda
    from tts.memory.device import device_from_dict
    from tts.profiling.calibrate import calibrate_and_write

    device = device_from_dict(dict(cfg.device))
    if not calibrate:
        return device
    if models_on_cuda(cfg):
        from tts.profiling.gpu import calibrate_gpu_and_keep

        measured, path = calibrate_gpu_and_keep()
        console.print(f"calibrated {measured.host}: {measured.peak_tflops:.1f} TFLOP/s, {measured.bandwidth_gbs:.0f} "
                      f"GB/s, {measured.memory_gb:.1f} GB -> {path} (what a run on this card takes where no "
                      "datasheet profile describes it)", soft_wrap=True)
    else:
        measured = calibrate_and_write()
        console.print(f"calibrated: {measured.peak_tflops * 1e3:.1f} GFLOP/s, "
                      f"{measured.bandwidth_gbs:.1f} GB/s, {measured.memory_gb:.1f} GB -> conf/device/cpu.yaml")
    return measured if device.kind == "cpu" else device


def _print_workload(console: Console, base: Config, overrides: dict[str, Any], num_problems: int) -> None:
    from tts.search import policy_named

    capped = ", ".join(f"{k}={v}" for k, v in overrides.items()) or "none"
    algorithm = policy_named(base.search.algorithm).name
    console.print(
        f"profile workload: {algorithm} n={base.search.n} M={base.search.beam_width}, "
        f"step<= {base.generator.step_max_tokens} tok, path<= {base.generator.max_total_tokens} tok, "
        f"{num_problems} problem(s), concurrency {base.bench.concurrency}, "
        f"KV budget {base.memory.kv_cache_gib} GiB (caps applied: {capped})")


def build_breakdown(cfg: Config, backends: Backends) -> dict[str, dict[str, Any]]:
    """Start the generator, then the verifier, at `cfg`'s split and read their memory.

    Each engine is measured on its own start (see `tts.backends.vllm.memory_breakdown`), then warmed up; the
    engines stay in `backends`, so the sweep reuses them for this split. Fake backends have
    no breakdown.
    """
    from tts.backends.factory import static_split
    from tts.backends.vllm.engine import has_cuda
    from tts.config.enums import BackendKind
    from tts.backends.vllm.memory_breakdown import engine_breakdown, measure_start
    from tts.profiling.sweep import warm_up
    from tts.search import make_policy

    gen_spec, ver_spec = static_split(cfg)
    uses_verifier = make_policy(cfg.search, cfg.generator.step_max_tokens,
                                cfg.generator.max_total_tokens).uses_verifier
    requested = (None, None) if has_cuda() else (gen_spec.kv_bytes, ver_spec.kv_bytes)
    out: dict[str, dict[str, Any]] = {}
    ver = None
    with measure_start() as start:
        gen, _ = backends.get(gen_spec, None)
    if cfg.generator.backend is BackendKind.vllm:
        out["generator"] = engine_breakdown(gen.llm, start, requested[0])
    if uses_verifier:
        with measure_start() as start:
            _, ver = backends.get(gen_spec, ver_spec)
        if cfg.verifier.backend is BackendKind.vllm:
            out["verifier"] = engine_breakdown(ver.llm, start, requested[1])
    warm_up(gen, ver)
    return out


def _sweep(cfg: DictConfig, overrides: dict[str, Any], order: list[float], backends: Backends,
           problems: list[Any], console: Console) -> tuple[dict[float, SplitRun], list[dict[str, Any]]]:
    from tts.profiling.sweep import infeasible, run_split, split_config

    runs: dict[float, SplitRun] = {}
    skipped: list[dict[str, Any]] = []
    for f in order:
        split_cfg = split_config(cfg, f, overrides)
        why = infeasible(split_cfg)
        if why is not None:
            skipped.append({"generator_fraction": f, "reason": why})
            console.print(f"split {f:.2f}: skipped ({why})")
            continue
        runs[f] = run = run_split(split_cfg, backends, problems)
        g, v = run.meter.gen, run.meter.ver
        console.print(f"split {f:.2f}: {run.problems} problem(s) in {run.wall_s:.1f} s, "
                      f"{g.tokens} generated tokens, {v.prompt_tokens} verifier prompt tokens")
    return runs, skipped


def assemble(cfg: DictConfig, base: Config, device: DeviceProfile, overrides: dict[str, Any],
             problems: list[Any], breakdown: dict[str, Any], runs: dict[float, SplitRun],
             skipped: list[dict[str, Any]], fractions: list[float]) -> dict[str, Any]:
    """The JSON-ready profile (see the module docstring for its parts)."""
    from tts.profiling.modelled import model_for_config
    from tts.profiling.sweep import sweep_row
    from tts.search import policy_named

    rows = [sweep_row(runs[f]) for f in sorted(runs)]
    traces = {}
    for name, f in (("tight", cfg.profile.tight_split), ("loose", cfg.profile.loose_split)):
        run = runs.get(round(float(f), 6))
        if run is None and name == "tight" and runs:  # skipped: the tightest share that ran
            run = runs[min(runs)]
        if run is not None:
            traces[name] = {"generator_fraction": run.fraction,
                            **{role: run.blocks_per_step(role) for role in ("generator", "verifier")},
                            **{f"{role}_after_step": run.blocks_after_step(role)
                               for role in ("generator", "verifier")},
                            **{f"{role}_usable_blocks": (n - 1 if n else None)
                               for role, n in run.num_blocks.items()}}
    return {
        "vllm_version": _vllm_version(base),
        "device": device.to_dict(),
        "workload": {"overrides": overrides, "algorithm": policy_named(base.search.algorithm).name,
                     "n": base.search.n, "beam_width": base.search.beam_width,
                     "step_max_tokens": base.generator.step_max_tokens,
                     "max_total_tokens": base.generator.max_total_tokens,
                     "problem_ids": [p.id for p in problems], "concurrency": base.bench.concurrency,
                     "kv_cache_gib": base.memory.kv_cache_gib, "block_size": base.memory.block_size},
        "breakdown": breakdown,
        "breakdown_generator_fraction": base.memory.generator_fraction,
        "sweep": rows,
        "skipped": skipped,
        "kv_blocks_per_step": traces,
        "thrash": {f"{f:g}": runs[f].thrash for f in sorted(runs)},
        "modelled": model_for_config(base, device, tuple(fractions)),
    }


def _vllm_version(cfg: Config) -> str | None:
    from tts.config.enums import BackendKind

    if BackendKind.vllm not in (cfg.generator.backend, cfg.verifier.backend):
        return None
    import vllm

    return str(vllm.__version__)


def _write(store: RunStore, cfg: DictConfig, profile: dict[str, Any]) -> None:
    from tts.config.compose import to_yaml
    from tts.profiling.plots import write_plots

    store.write_config(to_yaml(cfg))
    profile["plots"] = write_plots(store.path, profile)
    (store.path / PROFILE).write_text(json.dumps(profile, indent=1, default=str))


def _mib(value: Any) -> str:
    return "-" if value is None else f"{value / MIB:.1f}"


def breakdown_table(breakdown: dict[str, dict[str, Any]]) -> Any:
    """The per-model memory components as a rich table (sources in the caption)."""
    from rich.table import Table

    from tts.backends.vllm.memory_breakdown import COMPONENTS

    roles = list(breakdown)
    sources = {f"{b.get('weights_source', '-')}; measured: {b.get('measured_source', '-')}"
               for b in breakdown.values()}
    table = Table(title="memory per model (MiB unless stated)", caption="weights: " + " | ".join(sorted(sources)))
    table.add_column("component")
    for role in roles:
        table.add_column(role, justify="right")
    for key, label in COMPONENTS:
        table.add_row(label, *[_mib(breakdown[r].get(key)) for r in roles])
    for key, label in (("kv_num_blocks", "KV blocks (with null)"), ("block_size", "block size (tokens)"),
                       ("kv_bytes_per_token", "KV bytes / token"), ("kv_tokens", "KV tokens"),
                       ("kv_cache_size_tokens", "KV tokens (vLLM log)"),
                       ("max_model_len", "max model len")):
        table.add_row(label, *[str(breakdown[r].get(key, "-")) for r in roles])
    return table


def _pair(row: dict[str, Any], key: str, spec: str | None = None) -> str:
    """generator/verifier; a count (no `spec`) may be a KV usage fraction where block counts
    are unknown (fake backends)."""
    return f"{number(row.get('gen_' + key), spec)}/{number(row.get('ver_' + key), spec)}"


def sweep_table(rows: list[dict[str, Any]], modelled: dict[str, Any] | None = None) -> Any:
    """The measured split sweep as two rich tables (throughput; prefix cache and thrash),
    with the roofline model's total time where known. Pairs read generator/verifier."""
    from rich.console import Group
    from rich.table import Table

    model_t = {round(r["generator_fraction"], 6): r["model_t_total_s"] for r in (modelled or {}).get("rows", [])}
    speed = Table(title="KV split sweep: throughput (pairs: generator/verifier)")
    cache = Table(title="KV split sweep: prefix cache and thrash (pairs: generator/verifier)")
    for col in ("gen share", "KV blocks", "system tok/s", "gen tok/s", "ver tok/s", "model T s"):
        speed.add_column(col, justify="right")
    for col in ("gen share", "hit rate", "block hits", "misses", "thrash", "evictions", "peak blocks"):
        cache.add_column(col, justify="right")
    for r in rows:
        share = f"{r['generator_fraction']:.2f}"
        speed.add_row(
            share, _pair(r, "kv_blocks"),
            number(r.get("system_tokens_per_s"), "{:.1f}"), number(r.get("generator_tokens_per_s"), "{:.1f}"),
            number(r.get("verifier_tokens_per_s"), "{:.1f}"),
            number(model_t.get(round(r["generator_fraction"], 6)), "{:.3g}"))
        cache.add_row(share, _pair(r, "hit_rate", "{:.2f}"), _pair(r, "block_hits"), _pair(r, "block_misses"),
                      _pair(r, "thrash"), _pair(r, "evictions"), _pair(r, "kv_blocks_peak"))
    return Group(speed, cache)
