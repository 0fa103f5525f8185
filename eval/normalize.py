"""String normalization of final answers before symbolic comparison."""

from __future__ import annotations

import re
from fractions import Fraction

from eval.extract import match_braces

_TEXT_CMD_RE = re.compile(r"\\(?:text|textbf|textrm|textit|mathrm|mathbf|mbox|operatorname)\s*(?=\{)")
_UNIT_WORDS_RE = re.compile(r"^\s*[A-Za-z][A-Za-z\s.]*$")
_UNIT_POWER_RE = re.compile(r"\s*\^\s*(?:\d|\{\s*\d\s*\})")
_THOUSANDS_RE = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_INT_RE = re.compile(r"^[+-]?\d+$")
_FRACTION_RE = re.compile(r"^([+-]?)(?:(\d+)/(\d+)|\\frac\{(\d+)\}\{(\d+)\})$")
_THIN_SPACE_COMMA_RE = re.compile(r",\\!\s*")
_SIMPLE_REPLACEMENTS: tuple[tuple[str, str], ...] = (
    ("\\dfrac", "\\frac"),
    ("\\tfrac", "\\frac"),
    ("{,}", ","),
    ("\\$", ""),
    ("\\%", ""),
    ("%", ""),
    ("$", ""),
    ("°", ""),
)
# LaTeX spacing commands (\\! \\, \\; and a control space), but not a matrix row break
# (\\\\) followed by one of those characters.
_SPACING_RE = re.compile(r"(?<!\\)\\([!,; ])")
_DEGREE_RE = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\\degree")
_LEFT_RIGHT_RE = re.compile(r"\\(?:left|right)(?![A-Za-z])")


def _unwrap_text(text: str) -> str:
    """Unwrap ``\\text{...}``-like groups; drop those that look like units.

    A text group made only of words (``\\text{ cm}``, ``\\mbox{ inches}^2``) that
    follows other content is a unit and is removed together with a ``^2`` exponent.
    Any other group is replaced by its content (``\\text{(B)}`` becomes ``(B)``).
    """
    out: list[str] = []
    pos = 0
    while True:
        match = _TEXT_CMD_RE.search(text, pos)
        if match is None:
            out.append(text[pos:])
            return "".join(out)
        close = match_braces(text, match.end())
        if close is None:
            out.append(text[pos:])
            return "".join(out)
        out.append(text[pos : match.start()])
        content = text[match.end() + 1 : close]
        after = close + 1
        is_unit = bool(_UNIT_WORDS_RE.match(content)) and "".join(out).strip() != ""
        if is_unit:
            power = _UNIT_POWER_RE.match(text, after)
            after = power.end() if power else after
        else:
            out.append(content)
        pos = after


def normalize_answer(answer: str) -> str:
    """Return a normalized form of a final answer, for comparison.

    Removes ``\\text{...}`` wrappers (and unit words), ``\\%``, ``\\$``, degree signs,
    ``\\left``/``\\right``, LaTeX thin spaces and a trailing period; maps ``\\dfrac``
    to ``\\frac``; removes thousands separators in a plain number (``1,000`` becomes
    ``1000``, while a tuple such as ``(1,2)`` or a list ``1,2`` is kept); collapses
    whitespace.
    """
    text = _THIN_SPACE_COMMA_RE.sub(",", _unwrap_text(answer))
    for old, new in _SIMPLE_REPLACEMENTS:
        text = text.replace(old, new)
    text = _SPACING_RE.sub(lambda m: " " if m.group(1) == " " else "", text)
    text = _DEGREE_RE.sub("", text)
    text = _LEFT_RIGHT_RE.sub("", text)
    text = " ".join(text.split())
    text = text.rstrip(".").strip()
    if _THOUSANDS_RE.match(text):
        text = text.replace(",", "")
    return text


def canonical_key(answer: str) -> str:
    """Return a cheap canonical key: the normalized answer without any whitespace."""
    return "".join(normalize_answer(answer).split())


def as_rational(answer: str) -> Fraction | None:
    """Parse an already normalized integer or fraction literal, else return None.

    Accepts ``12``, ``-3``, ``025``, ``3/4`` and ``\\frac{3}{4}`` (and their negatives);
    decimals, radicals and anything else return None, so that the symbolic comparison
    decides them.
    """
    text = "".join(answer.split())
    if _INT_RE.match(text):
        return Fraction(int(text))
    match = _FRACTION_RE.match(text)
    if match is None:
        return None
    sign, num_a, den_a, num_b, den_b = match.groups()
    numerator, denominator = int(num_a or num_b), int(den_a or den_b)
    if denominator == 0:
        return None
    value = Fraction(numerator, denominator)
    return -value if sign == "-" else value


def quick_equal(gold: str, pred: str) -> bool | None:
    """Decide equality of two normalized answers without sympy when it is trivial.

    Returns True for identical strings, True/False when both are integer or fraction
    literals, and None when a symbolic comparison is needed.
    """
    if "".join(gold.split()) == "".join(pred.split()):
        return True
    gold_value, pred_value = as_rational(gold), as_rational(pred)
    if gold_value is None or pred_value is None:
        return None
    return gold_value == pred_value
