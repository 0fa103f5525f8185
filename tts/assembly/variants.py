"""The variants a run compares: `bench.compare`'s optim presets (else the configured
`optim`), then `bench.search_variants`' search presets on the baseline engine."""

from __future__ import annotations

from tts.config.compose import CONF_DIR, ConfigError, preset_optims
from tts.config.enums import EngineKind
from tts.config.schema import Config, OptimConfig, SearchConfig
from tts.engine.speculation.registry import AUTO, DEFAULTS, rule_named


def variant_optims(cfg: Config) -> list[tuple[str, OptimConfig]]:
    """(name, optim config) for each variant: the `bench.compare` presets, each with
    `bench.optim_overrides` on top, else the one configured. Each variant's start rule is
    found here, before any model loads (a user's own is imported): a ConfigError names
    one that is not there."""
    if not cfg.bench.compare:
        return [(_preset_name(cfg.optim), cfg.optim)]
    variants = preset_optims(list(cfg.bench.compare), list(cfg.bench.optim_overrides))
    for name, optim in variants:
        _rule(optim, f"bench.compare: variant {name!r}: ")
    return variants


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
    rule = _rule(optim)
    if optim.engine is EngineKind.decoupled:
        return f"decoupled-{optim.decoupled_policy.value}" + _rule_suffix(rule, "decoupled")
    flags = "P" * optim.prefix_aware + "M" * optim.roofline_memory + "S" * optim.speculative
    return (flags or "flash") + _rule_suffix(rule, "barrier")


def _rule(optim: OptimConfig, where: str = "") -> str:
    """The plain name of the start rule `optim.spec_rule` names (`auto` as it is), never a
    `module:attribute`; a ConfigError, after `where`, names one that is not there."""
    if optim.spec_rule == AUTO:
        return AUTO
    try:
        return rule_named(optim.spec_rule).name
    except ValueError as err:
        raise ConfigError(f"{where}{err}") from err


def _rule_suffix(rule: str, discipline: str) -> str:
    """A label's ending for a rule other than the discipline's own: `_NAME`."""
    return "" if rule in (AUTO, DEFAULTS[discipline]) else f"_{rule}"
