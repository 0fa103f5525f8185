"""Tests of eval.embedded: answers recomputed independently, determinism, level mix."""

from __future__ import annotations

import re
from collections import Counter
from fractions import Fraction

import pytest
import sympy

from eval import Problem, generate_embedded, grade_answer
from eval.embedded import EmbeddedItem, format_rational, generate_embedded_items
from eval.embedded_templates import TEMPLATES

x, y = sympy.symbols("x y")


def _positive(solutions: list[dict[sympy.Symbol, sympy.Expr]], unknown: sympy.Symbol) -> Fraction:
    values = [s[unknown] for s in solutions if s[unknown] > 0]
    assert len(values) == 1
    return Fraction(str(values[0]))


def recompute(item: EmbeddedItem) -> Fraction:
    """The answer of ``item`` from its parameters, written independently of the templates."""
    p = {k: v for k, v in item.params if isinstance(v, int)}
    name = item.template
    if name in ("gain", "pages"):
        return Fraction(p["a"] + p["b"])
    if name in ("birds", "spend"):
        return Fraction(p["a"] - p["b"])
    if name in ("bags", "rows"):
        return Fraction(p["a"] * p["b"])
    if name in ("share", "packs"):
        return Fraction(p["total"], p["k"])
    if name == "pizza":
        return Fraction(p["n"] - p["a"] - p["b"], p["n"])
    if name == "money":
        return p["m"] * (1 - Fraction(p["p"], p["q"])) - p["r"]
    if name == "recipe":
        return Fraction(p["a"], p["b"]) * p["k"]
    if name == "tank":
        return p["c"] * (1 - Fraction(p["p"], p["q"])) - p["r"]
    if name == "think":
        return Fraction(p["c"] - p["b"], p["a"])
    if name == "ages":  # k*x + n + x + n = s
        return Fraction(p["s"] - 2 * p["n"], p["k"] + 1)
    if name == "taxi":
        return Fraction(p["c"] - p["f"], p["r"])
    if name == "consecutive":
        return Fraction(p["s"] - 3, 3)
    if name == "shop":
        system = [p["a1"] * x + p["b1"] * y - p["c1"], p["a2"] * x + p["b2"] * y - p["c2"]]
        return _positive(sympy.solve(system, [x, y], dict=True), y)
    if name == "sum_diff":
        return Fraction(p["s"] + p["d"], 2)
    if name == "rectangle":
        return _positive(sympy.solve(x**2 + p["d"] * x - p["area"], [x], dict=True), x)
    if name == "farm":  # cows = (legs - 2 * heads) / 2
        return Fraction(p["legs"] - 2 * p["heads"], 2)
    raise AssertionError(f"no independent formula for template {name!r}")


ITEMS = generate_embedded_items(300, seed=11)


def test_every_template_is_covered() -> None:
    assert {item.template for item in ITEMS} == {t.name for t in TEMPLATES}
    assert Counter(t.level for t in TEMPLATES) == {1: 4, 2: 4, 3: 4, 4: 4, 5: 4}


@pytest.mark.parametrize("index", range(0, 300, 3))
def test_answer_matches_independent_recomputation(index: int) -> None:
    item = ITEMS[index]
    expected = recompute(item)
    assert expected > 0
    as_text = f"{expected.numerator}/{expected.denominator}" if expected.denominator > 1 else str(expected)
    assert item.problem.answer == as_text


def test_all_answers_recompute_and_are_canonical_strings() -> None:
    for item in ITEMS:
        answer = item.problem.answer
        assert re.fullmatch(r"-?\d+(/\d+)?", answer), answer
        assert Fraction(answer) == recompute(item), item
        if "/" in answer:
            numerator, denominator = map(int, answer.split("/"))
            assert sympy.gcd(numerator, denominator) == 1 and denominator > 1


def test_numbers_in_text_are_the_parameters() -> None:
    for item in ITEMS:
        text_numbers = [int(n) for n in re.findall(r"\d+", item.problem.problem)]
        int_params = sorted(v for _, v in item.params if isinstance(v, int))
        assert sorted(text_numbers) == int_params, item


def test_some_answers_are_fractions() -> None:
    assert any("/" in item.problem.answer for item in ITEMS)


def test_known_first_problem_for_seed_0() -> None:
    assert generate_embedded(1, seed=0) == [
        Problem(
            id="embedded-1-0",
            problem="Mia has 4 stickers. A friend gives Mia 3 more stickers. "
            "How many stickers does Mia have now?",
            answer="7",
            level=1,
            subject="Arithmetic",
            source="embedded",
        )
    ]


def test_deterministic_per_seed_and_prefix_stable() -> None:
    assert generate_embedded(30, seed=5) == generate_embedded(30, seed=5)
    assert generate_embedded(30, seed=5)[:12] == generate_embedded(12, seed=5)
    assert generate_embedded(30, seed=5) != generate_embedded(30, seed=6)


def test_levels_cycle_and_ids() -> None:
    problems = generate_embedded(12)
    assert [p.level for p in problems] == [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]
    assert [p.id for p in problems[:6]] == [f"embedded-{lv}-{i}" for i, lv in enumerate([1, 2, 3, 4, 5, 1])]
    assert len({p.id for p in generate_embedded(100)}) == 100
    assert {p.level for p in generate_embedded(5, seed=9)} == {1, 2, 3, 4, 5}


def test_level_filter() -> None:
    problems = generate_embedded(6, seed=2, levels=[4, 2])
    assert [p.level for p in problems] == [4, 2, 4, 2, 4, 2]
    assert [p.subject for p in problems[:2]] == ["Algebra", "Arithmetic"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"num_problems": -1}, "num_problems"), ({"levels": [0]}, "levels"), ({"levels": []}, "levels"),
     ({"levels": [6]}, "levels")],
)
def test_bad_arguments(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        generate_embedded(**kwargs)  # type: ignore[arg-type]


def test_format_rational() -> None:
    assert [format_rational(v) for v in (sympy.Integer(12), sympy.Rational(6, 8), sympy.Rational(-5, 2))] == [
        "12", "3/4", "-5/2",
    ]


def test_grading_accepts_latex_and_slash_forms_of_fraction_answers() -> None:
    fraction = next(item.problem.answer for item in ITEMS if "/" in item.problem.answer)
    numerator, denominator = fraction.split("/")
    assert grade_answer(fraction, f"\\boxed{{\\frac{{{numerator}}}{{{denominator}}}}}").correct
    assert grade_answer(f"\\frac{{{numerator}}}{{{denominator}}}", fraction).correct
    assert grade_answer(fraction, f"\\boxed{{{int(numerator) + 1}/{denominator}}}").reason == "wrong"
