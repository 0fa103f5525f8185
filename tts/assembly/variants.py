"""The variants a run compares: `bench.compare`'s optim presets (else the configured
`optim`), then `bench.search_variants`' search presets on the baseline engine."""

from __future__ import annotations

from tts.config.compose import CONF_DIR, ConfigError, preset_optims
from tts.config.enums import EngineKind
from tts.config.schema import Config, OptimConfig, SearchConfig


def variant_optims(cfg: Config) -> list[tuple[str, OptimConfig]]:
    """(name, optim config) for each variant: the `bench.compare` presets, each with
    `bench.optim_overrides` on top, else the one configured."""
    if not cfg.bench.compare:
        return [(_preset_name(cfg.optim), cfg.optim)]
    return preset_optims(list(cfg.bench.compare), list(cfg.bench.optim_overrides))


def run_variants(cfg: Config) -> list[tuple[str, OptimConfig, SearchConfig]]:
    """Every variant the run compares, in order: (name, optim, search). The optim variants
    (`variant_optims`) search with `cfg.search`; then each `bench.search_variants` preset
    runs on the baseline engine, over `cfg.search` (`preset_searches`)."""
    from tts.config.compose import preset_searches

    out = [(name, optim, cfg.search) for name, optim in variant_optims(cfg)]
    if cfg.bench.search_variants:
        baseline = preset_optims(["baseline"], [])[0][1]
        taken = {name for name, _, _ in out}
        for name, search in preset_searches(list(cfg.bench.search_variants), cfg.search):
            if name in taken:
                raise ConfigError(f"bench.search_variants: {name!r} is also an optim variant's name")
            out.append((name, baseline, search))
    return out


def _preset_name(optim: OptimConfig) -> str:
    """The `conf/optim` preset `optim` is, else a label of its engine and switches."""
    for name in sorted(p.stem for p in (CONF_DIR / "optim").glob("*.yaml")):
        if preset_optims([name], [])[0][1] == optim:
            return name
    if optim.engine is EngineKind.baseline:
        return "baseline"
    if optim.engine is EngineKind.decoupled:
        return f"decoupled-{optim.decoupled_policy.value}"
    flags = "P" * optim.prefix_aware + "M" * optim.roofline_memory + "S" * optim.speculative
    return (flags or "flash") + ("" if optim.spec_rule in ("auto", "runon") else f"_{optim.spec_rule}")
