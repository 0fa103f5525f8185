"""GGUF → Hugging Face folder conversion and verification (transformers, offline).

torch and transformers are imported inside the functions so that importing
``tts.models`` stays cheap.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

# SmolLM2-Instruct's own template (ChatML with a default system turn), byte for byte as
# its GGUF carries it. Written into tokenizer_config.json only if a GGUF has no template.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
    "Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CHAT_TEMPLATES: dict[str, str] = {"chatml": SMOLLM2_CHAT_TEMPLATE}

VERIFY_TEXT = "What is 1 + 1? The answer is"


def convert_gguf(src_dir: Path, gguf_name: str, out_dir: Path) -> None:
    """Dequantize ``src_dir/gguf_name`` to a bf16 Hugging Face folder at ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tokenizer = AutoTokenizer.from_pretrained(
        str(src_dir), gguf_file=gguf_name, local_files_only=True
    )
    model = AutoModelForCausalLM.from_pretrained(
        str(src_dir),
        gguf_file=gguf_name,
        dtype=torch.bfloat16,
        # Without dequantize=True, save_pretrained refuses a GGUF-quantized model.
        quantization_config=GgufConfig(dequantize=True),
        local_files_only=True,
    )
    if gguf_adds_bos(src_dir / gguf_name) and hasattr(tokenizer, "add_bos_token"):
        # transformers drops the GGUF's add_bos_token flag (seen with Gemma 3, which
        # degenerates without <bos>); restore it so the saved tokenizer prepends BOS.
        tokenizer.add_bos_token = True  # type: ignore[misc]  # the property has a setter
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    del model, tokenizer
    gc.collect()


def gguf_adds_bos(gguf_path: Path) -> bool:
    """True if the GGUF's metadata says its tokenizer prepends BOS (add_bos_token)."""
    import gguf

    field = gguf.GGUFReader(str(gguf_path)).fields.get("tokenizer.ggml.add_bos_token")
    return bool(field.contents()) if field is not None else False


def has_chat_template(folder: Path) -> bool:
    """True if the saved tokenizer in ``folder`` carries a chat template (either form)."""
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    config_path = folder / "tokenizer_config.json"
    if not config_path.is_file():
        return False
    config = json.loads(config_path.read_text())
    return bool(config.get("chat_template"))


def ensure_chat_template(folder: Path, template_name: str | None) -> bool:
    """Write the named built-in chat template into ``tokenizer_config.json`` if none exists.

    Returns True when a template was written. ``template_name`` None means the model has
    no known template (e.g. a base model): nothing is written.
    """
    if template_name is None or has_chat_template(folder):
        return False
    if template_name not in CHAT_TEMPLATES:
        raise ValueError(
            f"Unknown chat template {template_name!r}; known: {', '.join(CHAT_TEMPLATES)}"
        )
    config_path = folder / "tokenizer_config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} is missing: cannot add a chat template")
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHAT_TEMPLATES[template_name]
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return True


def verify_folder(folder: Path) -> dict[str, Any]:
    """Load config, tokenizer and model from ``folder`` and run a tiny forward pass.

    Returns facts for the completion marker. Raises ``RuntimeError`` naming what is wrong.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    if tokenizer.eos_token_id is None:
        raise RuntimeError(f"Converted tokenizer in {folder} has no eos token")
    ids = tokenizer.encode(VERIFY_TEXT, add_special_tokens=True)
    if not ids:
        raise RuntimeError(f"Converted tokenizer in {folder} encodes text to nothing")
    model = AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.bfloat16, local_files_only=True
    )
    with torch.no_grad():
        logits = model(torch.tensor([ids[:8]])).logits
    if not bool(torch.isfinite(logits).all()):
        raise RuntimeError(f"Converted model in {folder} produces non-finite logits")
    if logits.shape[-1] < len(tokenizer):
        raise RuntimeError(
            f"Converted model in {folder}: logits width {logits.shape[-1]} is smaller than "
            f"the tokenizer's {len(tokenizer)} tokens"
        )
    facts: dict[str, Any] = {
        "model_type": config.model_type,
        "architectures": list(config.architectures or []),
        "num_parameters": int(sum(p.numel() for p in model.parameters())),
        "dtype": "bfloat16",
        "vocab_size": int(logits.shape[-1]),
        "eos_token": tokenizer.eos_token,
        "eos_token_id": int(tokenizer.eos_token_id),
        "bos_token_id": tokenizer.bos_token_id,
        "has_chat_template": bool(getattr(tokenizer, "chat_template", None)),
    }
    del model
    gc.collect()
    return facts


def library_versions() -> dict[str, str]:
    """Versions of the libraries used for a conversion (for the marker)."""
    import torch
    import transformers

    return {"torch": str(torch.__version__), "transformers": str(transformers.__version__)}
