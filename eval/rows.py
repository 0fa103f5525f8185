"""Reading benchmark rows: local JSONL files and Hugging Face datasets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class DatasetLoadError(RuntimeError):
    """A dataset could not be loaded from the Hugging Face Hub."""


def read_jsonl(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """Return ``(line_number, row)`` pairs of a JSONL file (1-based, blank lines skipped).

    A line that is not valid JSON, or not a JSON object, raises ValueError naming the
    file and the line number.
    """
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"dataset.path {str(file)!r} is not a file")
    rows: list[tuple[int, dict[str, Any]]] = []
    with file.open("rb") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as error:
                reason = error.msg if isinstance(error, json.JSONDecodeError) else "not UTF-8"
                raise ValueError(f"{file}: line {line_number}: invalid JSON ({reason})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{file}: line {line_number}: expected a JSON object")
            rows.append((line_number, row))
    return rows


def load_hub_rows(hf_id: str, split: str) -> list[dict[str, Any]]:
    """Load a split of a Hugging Face dataset as a list of dicts (imports ``datasets``).

    Raises DatasetLoadError naming the id when it fails (for example offline, with
    ``HF_HUB_OFFLINE=1``, and the dataset not in the local cache).
    """
    import datasets  # heavy: imported only when a hub dataset is really requested

    try:
        dataset = datasets.load_dataset(hf_id, split=split)
    except Exception as error:  # network, hub, cache and split errors have many types
        raise DatasetLoadError(
            f"could not load Hugging Face dataset {hf_id!r} (split {split!r}): "
            f"{type(error).__name__}: {error}. If you are offline or the hub is "
            "unreachable, use a local JSONL file: dataset.path=/path/to/file.jsonl"
        ) from error
    return [dict(row) for row in dataset]
