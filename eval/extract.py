"""Extraction of the final answer from a model's solution text."""

from __future__ import annotations

import re

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_BARE_TOKEN_RE = re.compile(r"[^\s$]+")


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
