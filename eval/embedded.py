"""The project's own embedded problem set: seeded, graded arithmetic and algebra.

Answers are strings: integers as "12", other rationals as "p/q" in lowest terms
("3/4", "-5/2"). Grading also accepts LaTeX forms such as ``\\frac{3}{4}``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import sympy

from eval.embedded_templates import TEMPLATES, Template
from eval.problem import Problem

LEVELS: tuple[int, ...] = (1, 2, 3, 4, 5)
SUBJECTS: dict[int, str] = {1: "Arithmetic", 2: "Arithmetic", 3: "Arithmetic", 4: "Algebra", 5: "Algebra"}


@dataclass(frozen=True)
class EmbeddedItem:
    """A generated problem with the template and parameters it came from."""

    problem: Problem
    template: str
    params: tuple[tuple[str, int | str], ...]

    def param(self, key: str) -> int | str:
        """Return the value of parameter ``key``."""
        return dict(self.params)[key]


def format_rational(value: sympy.Rational) -> str:
    """Format a rational: an integer as "12", otherwise "p/q" in lowest terms."""
    rational = sympy.Rational(value)
    if rational.q == 1:
        return str(rational.p)
    return f"{rational.p}/{rational.q}"


def _check_args(num_problems: int, levels: list[int] | None) -> list[int]:
    if isinstance(num_problems, bool) or not isinstance(num_problems, int) or num_problems < 0:
        raise ValueError(f"num_problems must be a non-negative integer, got {num_problems!r}")
    if levels is None:
        return list(LEVELS)
    if not levels or any(level not in LEVELS for level in levels):
        raise ValueError(f"levels must be a non-empty list drawn from {list(LEVELS)}, got {levels!r}")
    return list(dict.fromkeys(levels))


def _make_item(index: int, level: int, seed: int) -> EmbeddedItem:
    """Generate problem ``index``; its randomness depends only on (seed, index)."""
    rng = random.Random(f"tts-embedded:{seed}:{index}")
    choices: list[Template] = [t for t in TEMPLATES if t.level == level]
    template = rng.choice(choices)
    params = template.sample(rng)
    problem = Problem(
        id=f"embedded-{level}-{index}",
        problem=template.text.format(**params),
        answer=format_rational(template.solve(params)),
        level=level,
        subject=SUBJECTS[level],
        source="embedded",
    )
    return EmbeddedItem(problem=problem, template=template.name, params=tuple(params.items()))


def generate_embedded_items(
    num_problems: int = 20, seed: int = 0, levels: list[int] | None = None
) -> list[EmbeddedItem]:
    """Like ``generate_embedded``, but also return each problem's template and parameters."""
    cycle = _check_args(num_problems, levels)
    return [_make_item(i, cycle[i % len(cycle)], seed) for i in range(num_problems)]


def generate_embedded(
    num_problems: int = 20, seed: int = 0, levels: list[int] | None = None
) -> list[Problem]:
    """Generate the embedded problem set.

    Problem ``i`` has level ``levels[i % len(levels)]`` (default levels 1-5), so any
    prefix mixes levels; its template and numbers depend only on ``(seed, i)``, so
    the same seed gives an identical list and a shorter list is a prefix of a longer
    one. Ids are "embedded-<level>-<index>". Levels: 1 addition/subtraction, 2
    multiplication/division, 3 multi-step fractions, 4 a linear equation, 5 two
    linear equations or a quadratic with integer roots. Answers are computed with
    sympy and formatted by ``format_rational``.
    """
    return [item.problem for item in generate_embedded_items(num_problems, seed, levels)]
