"""Where converted models live, and turning a model name or path into a folder."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tts.models.registry import get_spec

MARKER_FILE = ".tts-model-complete.json"
"""Written last, after conversion and verification: its presence means the folder is done."""

WEIGHT_PATTERNS: tuple[str, ...] = ("*.safetensors", "pytorch_model*.bin")
TOKENIZER_FILES: tuple[str, ...] = ("tokenizer.json", "tokenizer.model")


class ModelNotPresentError(FileNotFoundError):
    """A model name or path does not lead to a usable local folder."""


def cache_dir() -> Path:
    """Return the model cache folder (not created).

    ``$TTS_MODEL_DIR`` if set, else ``platformdirs.user_cache_dir("tts")/models``, else
    ``~/.cache/tts/models`` when platformdirs is not installed.
    """
    env = os.environ.get("TTS_MODEL_DIR")
    if env:
        return Path(env).expanduser()
    try:
        import platformdirs
    except ImportError:
        return Path.home() / ".cache" / "tts" / "models"
    return Path(platformdirs.user_cache_dir("tts")) / "models"


def local_path(key: str) -> Path:
    """Return the cache folder for registry model ``key`` (ValueError if the key is unknown)."""
    return cache_dir() / get_spec(key).key


def folder_problems(path: Path, require_marker: bool = True) -> list[str]:
    """List what a model folder lacks (empty list: complete)."""
    if not path.is_dir():
        return [f"folder {path}"]
    problems: list[str] = []
    if not (path / "config.json").is_file():
        problems.append("config.json")
    if not any(any(path.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        problems.append("weights (*.safetensors or pytorch_model*.bin)")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        problems.append("tokenizer (tokenizer.json or tokenizer.model)")
    if require_marker and not (path / MARKER_FILE).is_file():
        problems.append(f"completion marker {MARKER_FILE}")
    return problems


def is_present(key: str) -> bool:
    """True when ``key``'s cache folder is complete: config, weights, tokenizer and marker."""
    return not folder_problems(local_path(key))


def read_marker(path: Path) -> dict[str, Any] | None:
    """Return the completion marker's content for a model folder, or None if absent/invalid."""
    marker = path / MARKER_FILE
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def hub_download_hint(hf_id: str) -> str:
    """The command a user runs to fetch a hub-only model, plus how to use the result."""
    folder = hf_id.split("/")[-1]
    return (
        f"`hf download {hf_id} --local-dir ./models/{folder}` (older huggingface_hub: "
        f"`huggingface-cli download {hf_id} --local-dir ./models/{folder}`), "
        f"then pass the folder path ./models/{folder} instead of the key"
    )
