"""Benchmark loaders: MATH-500, AIME 2024, AMC 2023 and the embedded set.

``datasets`` (Hugging Face) is imported only when a hub id is actually loaded.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from eval.problem import Problem
from eval.rows import DatasetLoadError, load_hub_rows, read_jsonl
from eval.subset import select_subset

__all__ = ["DATASETS", "DatasetLoadError", "Problem", "load_problems", "select_subset"]


@dataclass(frozen=True)
class DatasetSpec:
    """Where a benchmark lives on the Hugging Face Hub and how its ids are formed."""

    hf_id: str
    split: str
    has_id: bool


DATASETS: dict[str, DatasetSpec | None] = {
    "embedded": None,
    "math500": DatasetSpec("HuggingFaceH4/MATH-500", "test", has_id=False),
    "aime24": DatasetSpec("HuggingFaceH4/aime_2024", "train", has_id=True),
    "amc23": DatasetSpec("zwhe99/amc23", "test", has_id=True),
}
_LEVEL_RE = re.compile(r"(\d+)")


def answer_to_str(value: Any, where: str) -> str:
    """Return an answer as a string: 27.0 becomes "27", 2.5 stays "2.5"."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{where}: field 'answer' must be a string or a number, got {value!r}")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: field 'answer' must be finite, got {value!r}")
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, str):
        return value.strip()
    raise ValueError(f"{where}: field 'answer' must be a string or a number, got {value!r}")


def _level(value: Any) -> int | None:
    """Parse a MATH level: 3 or "Level 3"; None or "?" give None."""
    if value is None or isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _LEVEL_RE.search(str(value))
    if match is None:
        return None
    return int(match.group(1))


def _problem_id(name: str, index: int, row: dict[str, Any]) -> str:
    """Return "<name>-<id>" ("<name>-<index>" without an id); embedded ids are kept."""
    spec = DATASETS[name]
    raw_id = row.get("id") if spec is None or spec.has_id else None
    if name == "embedded" and raw_id is not None:
        return str(raw_id)
    return f"{name}-{raw_id if raw_id is not None else index}"


def _to_problem(name: str, index: int, row: dict[str, Any], where: str) -> Problem:
    """Build a Problem from one raw row of dataset ``name``."""
    text = row.get("problem", row.get("question"))
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{where}: missing or empty field 'problem' (or 'question')")
    if "answer" not in row:
        raise ValueError(f"{where}: missing field 'answer'")
    answer = answer_to_str(row["answer"], where)
    if not answer:
        raise ValueError(f"{where}: empty field 'answer'")
    subject = row.get("subject")
    return Problem(
        id=_problem_id(name, index, row),
        problem=text,
        answer=answer,
        level=_level(row.get("level")),
        subject=str(subject) if subject is not None else None,
        source=name,
    )


def load_problems(
    name: str, path: str | None = None, hf_id: str | None = None, split: str | None = None
) -> list[Problem]:
    """Load the problems of benchmark ``name``.

    ``name`` is one of "embedded", "math500", "aime24", "amc23". With ``path``, the
    local JSONL file is read (a malformed row raises ValueError naming the file and
    its 1-based line). Without it, the Hugging Face dataset ``hf_id`` (default: the
    benchmark's own id) split ``split`` is loaded; a failure raises DatasetLoadError.
    "embedded" without a path generates the default embedded set (``generate_embedded()``).
    Ids: "math500-<row index>" (0-based), "aime24-<id>", "amc23-<id>"; the embedded
    set keeps its own ids.
    """
    if name not in DATASETS:
        raise ValueError(f"dataset.name must be one of {sorted(DATASETS)}, got {name!r}")
    spec = DATASETS[name]
    if path is not None:
        rows = read_jsonl(path)
        if not rows:
            raise ValueError(f"{path}: no problems in the file (empty, or only blank lines)")
        return [
            _to_problem(name, index, row, f"{path}: line {line}")
            for index, (line, row) in enumerate(rows)
        ]
    if spec is None:
        if hf_id is not None or split is not None:
            raise ValueError("dataset.hf_id and dataset.split do not apply to 'embedded'")
        from eval.embedded import generate_embedded  # imports sympy

        return generate_embedded()
    hub_id, hub_split = hf_id or spec.hf_id, split or spec.split
    rows_from_hub = load_hub_rows(hub_id, hub_split)
    return [
        _to_problem(name, index, row, f"{hub_id} ({hub_split}): row {index}")
        for index, row in enumerate(rows_from_hub)
    ]
