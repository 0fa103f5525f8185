"""How long a sequence each engine holds, and whether the models can hold it.

Both vLLM engines of a search run are built for one length, the engine length:
`PROMPT_ROOM` tokens for the chat-templated problem, a whole path
(`generator.max_total_tokens`) and two steps beyond it (`generator.step_max_tokens`: the
step a beam speculates on, and the room a verifier's step tags take). `check_context`
refuses a config whose engine length passes a model's context, before anything is
downloaded or loaded: the context is read from the model folder's config.json where the
folder is here, else from the registry (`ModelSpec.context_length`). A problem whose prompt
is longer than `PROMPT_ROOM` cannot run within that length: `tts.runner` skips it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from tts.config.schema import Config, GeneratorConfig

PROMPT_ROOM = 1024  # tokens reserved for the chat-templated problem prompt


def engine_length(g: GeneratorConfig) -> int:
    """The longest sequence (prompt, path and two steps) either engine of a search run holds."""
    return PROMPT_ROOM + g.max_total_tokens + 2 * g.step_max_tokens


def ceiling_length(new_tokens: int, block_size: int) -> int:
    """The longest sequence of the ceiling benchmark's engines (`tts.benchmarks.ceiling`): the
    prompt, `new_tokens`, and a block of slack."""
    return PROMPT_ROOM + new_tokens + block_size


def model_context(model: str) -> tuple[int, str] | None:
    """(positions the model holds, where that was read) for a model argument (a folder, a
    registry key or hub id, another hub id): its local config.json's
    `max_position_embeddings` where the folder is here, else the registry's
    `context_length`; None when neither says (vLLM checks once the model is here)."""
    from tts.models.registry import find_spec

    config = _local_config(model)
    if config is not None:
        data = json.loads(config.read_text())
        data = data.get("text_config", data) if "max_position_embeddings" not in data else data
        if data.get("max_position_embeddings"):
            return int(data["max_position_embeddings"]), f"max_position_embeddings in {config}"
    from tts.models.tiny import is_tiny, published

    if is_tiny(model):  # built from the published config, whose context it keeps
        facts = published(model.removeprefix("tiny:"))
        return int(facts["config"]["max_position_embeddings"]), f"the published config of {facts['hf_id']}"
    spec = find_spec(model)
    if spec is not None and spec.context_length:
        return spec.context_length, f"registry entry {spec.key!r}"
    return None


def _local_config(model: str) -> Path | None:
    """The config.json of `model`'s local folder, without downloading anything; None when
    there is none."""
    from tts.models.cache import cache_dir, local_path
    from tts.models.registry import find_spec

    from tts.models.tiny import is_tiny, tiny_path

    folder = Path(model).expanduser()
    if is_tiny(model):
        folder = tiny_path(model)
    elif not folder.is_dir():
        spec = find_spec(model)
        if spec is not None:
            folder = local_path(spec.key)
        elif model.count("/") == 1:  # a hub id outside the registry: `tts.models.provision.hub_folder`
            folder = cache_dir() / "hub" / model.replace("/", "--")
    config = folder / "config.json"
    return config if config.is_file() else None


def check_context(cfg: Config) -> None:
    """Raise a ValueError naming the model, its context, the fields and the value to set,
    when an engine of `cfg` would run sequences longer than its model holds (`compose`
    turns it into a ConfigError). The fake backend has no context."""
    from tts.config.enums import BackendKind, BenchMode

    g = cfg.generator
    if cfg.bench.mode is BenchMode.ceiling:  # the generator alone, at its own length
        roles = [("generator", g.model, g.backend)]
        length = ceiling_length(cfg.ceiling.new_tokens, cfg.memory.block_size)
        parts = (f"{PROMPT_ROOM} for the prompt + ceiling.new_tokens ({cfg.ceiling.new_tokens}) + "
                 f"memory.block_size ({cfg.memory.block_size})")
        fix = "lower ceiling.new_tokens"
    else:
        roles = [("generator", g.model, g.backend), ("verifier", cfg.verifier.model, cfg.verifier.backend)]
        length = engine_length(g)
        parts = (f"{PROMPT_ROOM} for the prompt + generator.max_total_tokens ({g.max_total_tokens}) + "
                 f"2 x generator.step_max_tokens ({g.step_max_tokens})")
        fix = ""
    for role, model, backend in roles:
        if backend is BackendKind.fake:
            continue
        known = model_context(model)
        if known is None or length <= known[0]:
            continue
        context, source = known
        raise ValueError(
            f"{role}.model: {model} holds {context} positions ({source}), but the engines are built for "
            f"sequences of {length} tokens: {parts}; {fix or _fix(g.step_max_tokens, context)}")


def _fix(step: int, context: int) -> str:
    """The override that makes a search run's engine length fit `context`."""
    room = context - PROMPT_ROOM
    if room - 2 * step >= step:
        return f"set generator.max_total_tokens={room - 2 * step} (or lower)"
    step = max(1, room // 3)
    return f"set generator.step_max_tokens={step} generator.max_total_tokens={room - 2 * step} (or lower)"
