"""Extraction of the final answer from a model's solution text."""

from __future__ import annotations

import re

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_BARE_TOKEN_RE = re.compile(r"[^\s$]+")
# The prompt's closing sentence, "The answer is $\boxed{N}$". Small models (SmolLM2-135M)
# often keep the sentence and drop the box: "The answer is 7." The same fallback is in
# Qwen2.5-Math's and Minerva's evaluation code ("The final answer is ...").
_STATEMENT_RE = re.compile(
    r"\b(?:the\s+)?(?:final\s+)?answer\s+is\s*:?\s*"
    r"(?:(?:indeed|therefore|thus|simply|just|now|then)\b[\s,:]*)?", re.IGNORECASE)
_NUM = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
# A number first (units and words after it are left out): 7, -3, 1,000, 2.5, 3/8.
_NUMBER_RE = re.compile(rf"{_NUM}(?:\s*/\s*\d+)?(?![\d.]\d)")
# "7 * 10 = 70": arithmetic written out after the number; its result is the answer.
_WORKED_RE = re.compile(rf"{_NUM}(?:\s*[-+*/×x]\s*{_NUM})+\s*=\s*({_NUM}(?:\s*/\s*\d+)?)")
_MATH_RE = re.compile(r"\$+([^$]+?)\$+")
# Otherwise LaTeX or a bracketed expression, up to the end of the sentence.
_EXPR_RE = re.compile(r"[-+\\(\[{][^\n]*?(?=[.;,]?\s*(?:\n|$)|[.;]\s)")


def match_braces(text: str, open_pos: int) -> int | None:
    """Return the index of the brace closing the one at ``text[open_pos]``, or None.

    Escaped braces (``\\{`` and ``\\}``) are skipped, so ``\\boxed{\\{1,2\\}}`` works.
    """
    depth = 0
    i = open_pos
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _content_after(text: str, end: int) -> str | None:
    """Read the argument of a box command whose name ends at ``end``."""
    rest = text[end:]
    stripped = rest.lstrip()
    if stripped.startswith("{"):
        open_pos = end + (len(rest) - len(stripped))
        close_pos = match_braces(text, open_pos)
        if close_pos is None:
            return None
        return text[open_pos + 1 : close_pos].strip()
    if stripped == rest:
        # ``\boxed5`` is not valid LaTeX for a box; only ``\boxed 5`` is.
        return None
    token = _BARE_TOKEN_RE.match(stripped)
    return token.group(0) if token else None


def extract_boxed(text: str) -> str | None:
    """Return the content of the LAST ``\\boxed{...}`` or ``\\fbox{...}`` in ``text``.

    Braces are matched (nested and escaped braces are handled). ``\\boxed 5`` (a space
    and a single token, no brace) yields ``"5"``. The result is stripped of surrounding
    whitespace; ``\\boxed{}`` yields ``""``. Returns None when there is no box, or when
    the last box is unclosed (``\\boxed{12`` at the end of a truncated generation).
    """
    matches = list(_BOX_RE.finditer(text))
    if not matches:
        return None
    return _content_after(text, matches[-1].end())


def extract_statement(text: str) -> str | None:
    """Return the answer of the LAST "the answer is X" sentence in ``text``, or None.

    X is a ``$...$`` span, a number (words after it, such as units, are left out:
    "15 marbles." yields "15"; "8 * 10 = 80" yields "80"), or LaTeX or a bracketed expression up to the end of the
    sentence. "The answer is five." or "the answer is to add them" give None: a word
    is not taken for an answer. Filler such as "indeed" or "therefore" is skipped.
    """
    # Most texts (a step of a path, at every step of a search) hold no "answer" at all: the
    # word, case-folded as re.IGNORECASE matches it ("ANSWER", "anſwer"), is looked for
    # first, in one pass, before the statement's pattern is tried at every position.
    if "answer" not in text.casefold():
        return None
    for match in reversed(list(_STATEMENT_RE.finditer(text))):
        rest = text[match.end():]
        for pattern, group in ((_MATH_RE, 1), (_WORKED_RE, 1), (_NUMBER_RE, 0), (_EXPR_RE, 0)):
            value = pattern.match(rest)
            if value is not None and value.group(group).strip():
                return value.group(group).strip()
    return None


def extract_answer(text: str) -> str | None:
    """The final answer of a solution: the last box when there is one (None when it is
    unclosed: a truncated box is no answer), else the last "the answer is X" sentence."""
    if _BOX_RE.search(text):
        return extract_boxed(text)
    return extract_statement(text)


def has_final_answer(text: str) -> bool:
    """The text states a final answer: a box (closed or not: it is being written) or an
    answer sentence. A step with one completes its path."""
    return _BOX_RE.search(text) is not None or extract_statement(text) is not None
