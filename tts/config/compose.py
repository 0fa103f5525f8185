"""Compose Hydra configs inside Typer commands: overrides, sweeps and clear errors.

`@hydra.main` is not used: it parses sys.argv itself and installs log handlers. We
compose with the Compose API, expand `-m` sweeps with Hydra's own override parser and
the basic sweeper's product rule, and turn every composition or validation failure into
a `ConfigError` that names the field and, where known, the valid choices.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
AUTO_GPU_NOTE = ("memory=auto: the models run on a CUDA GPU, so this run takes memory=gpu's settings "
                 "(conf/memory/gpu.yaml); give memory=cpu or memory=tight to choose another")

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A config key or value is wrong; the message says which and what is valid."""


def compose(config_name: str = "config", overrides: list[str] | None = None,
            on_gpu: Callable[[DictConfig], bool] | None = None) -> DictConfig:
    """Compose `conf/<config_name>.yaml` with Hydra overrides, then validate it, the engine
    length against each model's context included (`tts.config.limits.check_context`: before
    any download).

    `memory: auto` (the default memory choice) composes as `memory=gpu` would, the
    command line's `memory.KEY=VALUE` on top, where `on_gpu(cfg)` says the models run on a
    CUDA GPU (a run's verbs pass `tts.backends.factory.models_on_cuda`), with a line that
    says so; else it is `conf/memory/cpu.yaml`'s. A memory config chosen is kept.

    In a compare run (`bench.compare`) the variants are `conf/optim` presets and the
    top-level `optim` is not run: the command line's `optim.KEY=VALUE` overrides are kept
    in `bench.optim_overrides` and go on top of every variant, each checked here so that
    an error names the variant it breaks."""
    overrides = list(overrides or [])
    cfg, memory = _hydra_compose(config_name, overrides)
    if memory == "auto" and on_gpu is not None and on_gpu(cfg):
        overrides = [o for o in overrides if o.lstrip("+~").partition("=")[0] != "memory"] + ["memory=gpu"]
        cfg, _ = _hydra_compose(config_name, overrides)
        log.warning(AUTO_GPU_NOTE)
    if cfg.bench.compare:
        extra = optim_overrides(overrides)
        if extra:
            cfg, _ = _hydra_compose(config_name, [o for o in overrides if not _optim_key(o)])
            cfg.bench.optim_overrides = list(cfg.bench.optim_overrides) + extra
        preset_optims(list(cfg.bench.compare), list(cfg.bench.optim_overrides))
    from tts.config.limits import check_context

    try:
        check_context(validate(cfg))
    except ValueError as err:
        raise ConfigError(str(err)) from err
    return cfg


def _hydra_compose(config_name: str, overrides: list[str]) -> tuple[DictConfig, str | None]:
    """The composed config, and the memory group's choice (`auto`, `cpu`, ...)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict

    from tts.config.schema import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = hydra_compose(config_name=config_name, overrides=overrides, return_hydra_config=True)
    except Exception as err:  # Hydra raises several unrelated types; all mean bad config
        raise ConfigError(explain(err)) from err
    memory = cfg.hydra.runtime.choices.get("memory")
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, memory


def _optim_key(override: str) -> str | None:
    """`KEY` of an `optim.KEY=VALUE` override (also with `+`/`++`); None for anything else,
    a group choice (`optim=NAME`) included."""
    key, eq, _ = override.lstrip("+").partition("=")
    return key[len("optim."):] if eq and key.startswith("optim.") else None


def optim_overrides(overrides: list[str]) -> list[str]:
    """The `optim.KEY=VALUE` overrides (also with `+`/`++`), as `KEY=VALUE`; a group
    choice (`optim=NAME`) is not one."""
    return [o.lstrip("+")[len("optim."):] for o in overrides if _optim_key(o)]


def preset_optims(names: list[str], overrides: list[str]) -> list:
    """(name, OptimConfig) of each `conf/optim` preset in `names` with `overrides`
    (`KEY=VALUE`) on top; a ConfigError names an unknown preset (with the choices) or the
    variant an override breaks. `NAME@COPY` is preset NAME run again as variant
    `NAME@COPY`: listed beside NAME, an A/A control whose ratio to it shows what the run's
    timing alone (drift, order, noise) puts on a ratio."""
    from tts.config.schema import OptimConfig

    out = []
    if len(set(names)) < len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ConfigError(f"bench.compare: {', '.join(twice)} listed twice; to run a preset again (an A/A "
                          f"control) give the copy its own name: {twice[0].partition('@')[0]}@copy")
    for name in names:
        preset, at, label = name.partition("@")
        if at and not label.replace("_", "").isalnum():
            raise ConfigError(f"bench.compare: {name!r}: after @ comes the copy's name (letters, digits, _)")
        path = CONF_DIR / "optim" / f"{preset}.yaml"
        if not path.exists():
            valid = sorted(p.stem for p in (CONF_DIR / "optim").glob("*.yaml"))
            raise ConfigError(f"bench.compare: unknown optim preset {preset!r}; valid choices: {', '.join(valid)} "
                              "(NAME@COPY runs NAME again under its own name, an A/A control)")
        try:
            merged = OmegaConf.merge(OmegaConf.structured(OptimConfig), OmegaConf.load(path),
                                     OmegaConf.from_dotlist(overrides))
            out.append((name, OmegaConf.to_object(merged)))
        except Exception as err:  # an unknown key, a bad value, or a rule __post_init__ checks
            raise ConfigError(f"bench.compare: variant {name!r} with {overrides}: {explain(err)}") from err
    return out


def preset_searches(names: list[str], base) -> list:
    """(name, SearchConfig) of each `conf/search` preset in `names` over the run's own search
    settings `base` (a SearchConfig): what the preset sets replaces the run's, the rest stays
    the run's (`beam_dedup`, which sets only the algorithm and `filter_duplicates`, is the
    run's beam search with duplicates filtered); at the run's n paths, or at the paths a
    `NAME@K` entry gives (`self_consistency@1`: one sample, the single-sample reference;
    `greedy`: one path at temperature 0). A ConfigError names an unknown preset with the
    choices."""
    from tts.search import check_search

    n = base.n
    out = []
    for entry in names:
        name, _, k = entry.partition("@")
        path = CONF_DIR / "search" / f"{name}.yaml"
        if not path.exists():
            valid = sorted(p.stem for p in (CONF_DIR / "search").glob("*.yaml"))
            raise ConfigError(f"bench.search_variants: unknown search preset {name!r}; valid choices: "
                              f"{', '.join(valid)} (optionally NAME@N for N paths)")
        if k and not k.isdigit():
            raise ConfigError(f"bench.search_variants: {entry!r}: after @ comes the number of paths")
        preset = OmegaConf.load(path)
        greedy = preset.get("temperature") == 0  # greedy is one path, whatever the run's n
        try:
            merged = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(base), preset,
                                                         {"n": int(k) if k else 1 if greedy else n}))
            check_search(merged)
            out.append((entry, merged))
        except Exception as err:
            raise ConfigError(f"bench.search_variants: {entry!r} at n={k or n}: {explain(err)}") from err
    return out


def validate(cfg: DictConfig):
    """Instantiate the dataclass schemas (running each `__post_init__`), and check the search
    algorithm against its registry (`tts.search.check_search`: a user's own is imported)."""
    from tts.search import check_search

    try:
        out = OmegaConf.to_object(cfg)
        check_search(out.search)
        return out
    except ValueError as err:
        raise ConfigError(str(err)) from err
    except Exception as err:
        raise ConfigError(explain(err)) from err


def explain(err: Exception) -> str:
    from omegaconf.errors import ConfigKeyError, ValidationError

    from tts.config.replaced import REPLACED_OPTIM_KEYS

    cause = err
    while cause.__cause__ is not None and not isinstance(cause, (ConfigKeyError, ValidationError)):
        cause = cause.__cause__
    if not isinstance(cause, (ConfigKeyError, ValidationError)) and "Could not override" in str(err):
        return _unknown_key(str(err).split("'")[1])
    if isinstance(cause, ConfigKeyError):
        key = getattr(cause, "full_key", None) or getattr(cause, "key", "?")
        if (new := REPLACED_OPTIM_KEYS.get(str(key).rpartition(".")[2])) is not None:
            return f"'{key}' is no longer a config key: use {new}"
        obj = getattr(cause, "object_type", None)
        valid = ""
        if obj is not None and dataclasses.is_dataclass(obj):
            valid = "; valid keys: " + ", ".join(f.name for f in dataclasses.fields(obj))
        return f"unknown config key '{key}'{valid}"
    if isinstance(cause, ValidationError):
        key = getattr(cause, "full_key", "")
        msg = str(cause).splitlines()[0]
        return f"{key}: {msg}" if key else msg
    return str(err).split("\nConfig search path")[0].strip()


def _unknown_key(dotted: str) -> str:
    from tts.config.replaced import REPLACED_OPTIM_KEYS
    from tts.config.schema import Config

    if dotted.startswith("optim.") and (new := REPLACED_OPTIM_KEYS.get(dotted.partition(".")[2])) is not None:
        return f"'{dotted}' is no longer a config key: use {new}"
    node, parts = Config, dotted.split(".")
    for part in parts[:-1]:
        fields = {f.name: f for f in dataclasses.fields(node)} if dataclasses.is_dataclass(node) else {}
        factory = fields[part].default_factory if part in fields else None
        if not callable(factory) or not dataclasses.is_dataclass(factory()):
            break
        node = type(factory())
    valid = ", ".join(f.name for f in dataclasses.fields(node)) if dataclasses.is_dataclass(node) else ""
    return f"unknown config key '{dotted}'" + (f"; valid keys: {valid}" if valid else "")


def config_sweep(config_name: str, overrides: list[str]) -> list[str]:
    """The sweep `conf/<config_name>.yaml` declares under `hydra.sweeper.params` (Hydra's
    basic sweeper's own key, so Hydra's launchers run it too), as `KEY=VALUES` overrides
    placed before `overrides`; a key the command line sets is taken from there instead."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from tts.config.schema import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            params = hydra_compose(config_name=config_name, return_hydra_config=True).hydra.sweeper.get("params") or {}
    except Exception as err:
        raise ConfigError(explain(err)) from err
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    return [f"{key}={value}" for key, value in params.items() if key not in given] + list(overrides)


def expand_sweep(overrides: list[str]) -> list[list[str]]:
    """All combinations of comma-separated sweep values (Hydra's basic sweeper rule)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides=list(overrides))
    except Exception as err:
        raise ConfigError(explain(err)) from err
    batches = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    return [list(combo) for batch in batches for combo in batch]


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)


def command_line(overrides: list[str], resume: bool = False) -> list[str]:
    """A run's overrides as the command line means them: `--resume` is `bench.resume=true`, and
    an engine chosen there (`optim=...`) runs alone (`bench.compare=[]`) unless the command
    line sets `bench.compare` too."""
    overrides = overrides + ["bench.resume=true"] if resume else list(overrides)
    if any(override_key(o) == "optim" for o in overrides) and not any(override_key(o) == "bench.compare"
                                                                     for o in overrides):
        overrides.append("bench.compare=[]")
    return overrides


def override_key(override: str) -> str:
    """The config key an override sets (`optim` for `optim=PMS`, `+x`/`~x` without the sign)."""
    return override.split("=", 1)[0].lstrip("+~")


def refuse_sweep(overrides: list[str]) -> None:
    """A ConfigError for comma-separated values (a sweep) given without `-m`."""
    swept = [o for o in overrides if _is_sweep(o)]
    if swept:
        raise ConfigError(f"{swept}: comma-separated values sweep; add -m")


def _is_sweep(override: str) -> bool:
    value = override.split("=", 1)[-1]
    return "," in value and not value.startswith("[") and "(" not in value


def job_names(combos: list[list[str]]) -> list[str]:
    """The folder name of each job of a sweep: its number and the overrides whose values differ
    between the jobs (`3_search.n=16`; `job` where none do), in characters a path keeps."""
    values: dict[str, set[str]] = {}
    for combo in combos:
        for override in combo:
            key, _, value = override.partition("=")
            values.setdefault(key, set()).add(value)
    swept = {key for key, seen in values.items() if len(seen) > 1 or any(
        key not in {o.partition("=")[0] for o in combo} for combo in combos)}
    labels = [",".join(o for o in combo if o.split("=", 1)[0] in swept) or "job" for combo in combos]
    return [f"{i}_{re.sub(r'[^A-Za-z0-9_.=-]+', '_', label)[:80]}" for i, label in enumerate(labels)]
