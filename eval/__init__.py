"""Evaluation: benchmark loading, answer extraction, grading and accuracy.

Importing ``eval`` is light: the submodules (and sympy, math-verify, ``datasets``)
load only when one of the names below is first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eval.accuracy import (
        Candidate,
        accuracy_curves,
        majority_vote,
        pass_at_n,
        prm_max,
        summarize_accuracy,
        weighted_best_of_n,
    )
    from eval.datasets import load_problems
    from eval.embedded import generate_embedded
    from eval.extract import extract_answer, extract_boxed
    from eval.grader import Verdict, grade_answer, grade_many
    from eval.problem import Problem
    from eval.subset import select_subset

_EXPORTS: dict[str, str] = {
    "Candidate": "eval.accuracy",
    "accuracy_curves": "eval.accuracy",
    "majority_vote": "eval.accuracy",
    "pass_at_n": "eval.accuracy",
    "prm_max": "eval.accuracy",
    "summarize_accuracy": "eval.accuracy",
    "weighted_best_of_n": "eval.accuracy",
    "load_problems": "eval.datasets",
    "generate_embedded": "eval.embedded",
    "extract_answer": "eval.extract",
    "extract_boxed": "eval.extract",
    "Verdict": "eval.grader",
    "grade_answer": "eval.grader",
    "grade_many": "eval.grader",
    "Problem": "eval.problem",
    "select_subset": "eval.subset",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Load exported names lazily from their submodules (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'eval' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
