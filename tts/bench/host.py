"""This run's host (`run_host`): its models' dtypes, the generator's sampler, vLLM's model
runner and each engine's overlap, as a run's records and summary carry it."""

from __future__ import annotations

from tts.config.enums import BackendKind
from tts.config.schema import Config


def resolved_dtypes(cfg: Config) -> dict[str, str]:
    """The dtype each model runs in (`dtype: auto` resolved for this host)."""
    from tts.backends.vllm.engine import read_hf_config, resolve_dtype
    from tts.models.resolve import resolve_model

    out = {}
    for role, model in (("generator", cfg.generator), ("verifier", cfg.verifier)):
        if model.backend is BackendKind.fake:
            out[role] = "fake"
        else:
            out[role] = resolve_dtype(model.dtype, read_hf_config(resolve_model(model.model)))
    return out


def run_host(cfg: Config) -> dict:
    """This run's host, with its models' dtypes, the generator's sampler, vLLM's model
    runner and each engine's overlap (`resolve_overlap`: a ConfigError here, before any
    engine starts, for `overlap=on` where vLLM cannot)."""
    from tts.backends.factory import overlaps, resolve_sampler
    from tts.results.host import host_info

    return {**host_info(resolved_dtypes(cfg), resolve_sampler(cfg).value, model_runner(cfg)), "overlap": overlaps(cfg)}


def model_runner(cfg: Config) -> str | None:
    """The vLLM model runner the run's engines get, pinned to V1 before any engine starts
    where the generator installs the position sampler (`tts.backends.vllm.model_runner`);
    None without a vLLM model."""
    if BackendKind.vllm not in (cfg.generator.backend, cfg.verifier.backend):
        return None
    from tts.backends.factory import resolve_sampler
    from tts.backends.vllm.model_runner import pin_for_sampler
    from tts.config.enums import Sampler

    position = cfg.generator.backend is BackendKind.vllm and resolve_sampler(cfg) is Sampler.position
    return pin_for_sampler(position)
