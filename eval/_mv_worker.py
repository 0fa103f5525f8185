"""Functions that run inside the grading worker processes (math-verify calls).

math-verify is imported lazily, so that importing this module (which the parent
process must do to pickle references to these functions) stays cheap.
"""

from __future__ import annotations

import logging
import os
from typing import Any

CORRECT = "correct"
WRONG = "wrong"
UNPARSABLE = "unparsable"


def init_worker() -> None:
    """Pool initializer: import math-verify once and silence its timeout warning.

    The warning says that timeouts are disabled; here the parent process enforces
    them with ``future.result(timeout=...)`` and kills stuck workers.
    """
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    import math_verify  # noqa: F401  (pre-import: the first task must not pay for it)


def ready() -> int:
    """A no-op task used to wait until a worker has started; returns its pid."""
    return os.getpid()


def _has_math(parsed: list[Any]) -> bool:
    """Whether math-verify's parse result holds a sympy object (not only a string)."""
    from sympy import Basic
    from sympy.matrices import MatrixBase

    return any(isinstance(item, (Basic, MatrixBase)) for item in parsed)


def _parse(answer: str) -> list[Any]:
    """Parse a normalized answer as LaTeX math; fall back to a plain-expression parse."""
    from math_verify import parse

    parsed = parse(f"${answer}$", parsing_timeout=None)  # type: ignore[arg-type]
    if _has_math(parsed):
        return parsed
    return parse(answer, parsing_timeout=None) or parsed  # type: ignore[arg-type]


def compare(gold: str, pred: str) -> str:
    """Compare two normalized answers with math-verify; return a reason code.

    Returns "correct" when math-verify finds them equivalent, "unparsable" when the
    prediction yields no mathematical object at all, else "wrong". math-verify's own
    signal-based timeouts are disabled (they break in threads); the caller enforces
    the time limit.
    """
    from math_verify import verify

    gold_parsed = _parse(gold)
    pred_parsed = _parse(pred)
    if gold_parsed and pred_parsed:
        if verify(gold_parsed, pred_parsed, timeout_seconds=None):  # type: ignore[arg-type]
            return CORRECT
    if not _has_math(pred_parsed):
        return UNPARSABLE
    return WRONG
