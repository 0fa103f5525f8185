"""Grading of model answers against gold answers (extraction + math-verify)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from eval._mv_worker import CORRECT, compare
from eval.extract import extract_boxed, extract_statement
from eval.normalize import normalize_answer, quick_equal
from eval.pool import TIMEOUT, run_batch

REASONS: tuple[str, ...] = ("correct", "wrong", "no_answer", "unparsable", "timeout")
MAX_BARE_ANSWER_CHARS = 100  # a column vector of fractions is ~60
_BOX_MARKERS = ("\\boxed", "\\fbox")
_MATH_SPAN_RE = re.compile(r"(?<!\\)\$+([^$]+?)(?<!\\)\$+")


@dataclass(frozen=True)
class Verdict:
    """The outcome of grading one prediction.

    ``reason`` is one of "correct", "wrong", "no_answer", "unparsable", "timeout";
    ``pred`` is the extracted answer (None when there was none); ``gold`` the gold answer.
    """

    correct: bool
    reason: str
    pred: str | None
    gold: str

    def __post_init__(self) -> None:
        if self.reason not in REASONS:
            raise ValueError(f"reason must be one of {list(REASONS)}, got {self.reason!r}")
        if self.correct != (self.reason == "correct"):
            raise ValueError("correct must be True exactly when reason is 'correct'")


def select_answer(pred: str) -> str | None:
    """Return the final answer contained in ``pred``, or None.

    If ``pred`` contains ``\\boxed``/``\\fbox``, the last box's content (None when it is
    unclosed). Otherwise the last "the answer is X" sentence's answer
    (`eval.extract.extract_statement`). Otherwise a short single-line text (at most 100
    characters) is taken as the answer itself (the last ``$...$`` span in it, if any);
    a longer text or one with a newline is a solution without a final answer, so None.
    """
    if any(marker in pred for marker in _BOX_MARKERS):
        return extract_boxed(pred)
    stated = extract_statement(pred)
    if stated is not None:
        return stated
    text = pred.strip()
    if len(text) > MAX_BARE_ANSWER_CHARS or "\n" in text:
        return None
    spans = _MATH_SPAN_RE.findall(text)
    return spans[-1].strip() if spans else text


def _verdict(reason: str, pred: str | None, gold: str) -> Verdict:
    return Verdict(correct=reason == CORRECT, reason=reason, pred=pred, gold=gold)


@dataclass(frozen=True)
class _Pending:
    """A pair that needs math-verify: normalized gold and answer, and the raw answer."""

    gold_norm: str
    pred_norm: str
    answer: str


def _prepare(gold: str, pred: str) -> Verdict | _Pending:
    """Decide a pair without the pool when possible, else return what the pool needs."""
    answer = select_answer(pred)
    pred_norm = "" if answer is None else normalize_answer(answer)
    if not pred_norm:
        return _verdict("no_answer", answer, gold)
    gold_norm = normalize_answer(gold)
    decided = quick_equal(gold_norm, pred_norm)
    if decided is not None:
        return _verdict("correct" if decided else "wrong", answer, gold)
    return _Pending(gold_norm, pred_norm, answer)


def grade_many(pairs: Sequence[tuple[str, str]], timeout_s: int = 5) -> list[Verdict]:
    """Grade ``(gold, pred)`` pairs in parallel in the grading pool.

    Each pair is graded as by ``grade_answer``; trivial pairs (identical strings,
    integer or fraction literals) are decided without the pool.
    """
    prepared = [_prepare(gold, pred) for gold, pred in pairs]
    pending = [(i, item) for i, item in enumerate(prepared) if isinstance(item, _Pending)]
    tasks = [(item.gold_norm, item.pred_norm) for _, item in pending]
    outcomes = run_batch(compare, tasks, timeout_s) if tasks else []
    verdicts = {i: item for i, item in enumerate(prepared) if isinstance(item, Verdict)}
    for (index, item), outcome in zip(pending, outcomes):
        reason = "timeout" if outcome is TIMEOUT else outcome
        verdicts[index] = _verdict(reason, item.answer, pairs[index][0])
    return [verdicts[i] for i in range(len(pairs))]


def grade_answer(gold: str, pred: str, timeout_s: int = 5) -> Verdict:
    """Grade one prediction against a gold answer.

    ``pred`` is a model's full solution or a bare answer (see ``select_answer``).
    Both answers are normalized (``normalize_answer``) and compared with math-verify
    in a worker process; a comparison running longer than ``timeout_s`` whole seconds
    gives reason "timeout" (and the stuck pool is replaced). A prediction from which
    math-verify parses nothing mathematical gives "unparsable".
    """
    return grade_many([(gold, pred)], timeout_s)[0]


def equivalent_many(pairs: Sequence[tuple[str, str]], timeout_s: int = 5) -> list[bool]:
    """Return, for each ``(a, b)`` pair of bare answers, whether they are equivalent.

    Unlike ``grade_many`` no answer extraction takes place: both strings are
    answers. Empty answers are never equivalent; a timeout counts as not equivalent.
    """
    results: list[bool | None] = []
    tasks: list[tuple[str, str]] = []
    for a, b in pairs:
        a_norm, b_norm = normalize_answer(a), normalize_answer(b)
        decided = quick_equal(a_norm, b_norm) if a_norm and b_norm else False
        results.append(decided)
        if decided is None:
            tasks.append((a_norm, b_norm))
    outcomes = iter(run_batch(compare, tasks, timeout_s) if tasks else [])
    return [r if r is not None else next(outcomes) == CORRECT for r in results]
