"""Templates of the embedded problem set: graded arithmetic and algebra word problems.

Each template draws integer parameters from a ``random.Random`` and computes the
answer with sympy (arithmetic on sympy numbers, or ``sympy.solve`` on the equations
that the story describes); the answer is never written by hand.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import sympy

Params = dict[str, int | str]

NAMES: tuple[str, ...] = ("Tom", "Mia", "Sam", "Lena", "Omar", "Ana", "Ben", "Priya", "Leo", "Zoe")
ITEMS: tuple[str, ...] = ("apples", "stickers", "marbles", "cards", "shells", "books")
PROPER_FRACTIONS: tuple[tuple[int, int], ...] = (
    (1, 2), (1, 3), (2, 3), (1, 4), (3, 4), (1, 5), (2, 5), (3, 5), (4, 5)
)
_X, _Y = sympy.symbols("x y")


@dataclass(frozen=True)
class Template:
    """A word-problem template: ``sample`` draws parameters, ``solve`` computes the answer."""

    name: str
    level: int
    sample: Callable[[random.Random], Params]
    solve: Callable[[Params], sympy.Rational]
    text: str


def _n(params: Params, key: str) -> sympy.Integer:
    return sympy.Integer(int(params[key]))


def _one_root(equations: list[sympy.Eq], unknown: sympy.Symbol) -> sympy.Rational:
    """Solve ``equations``; return the unique positive value of ``unknown``."""
    solutions = sympy.solve(equations, [_X, _Y] if len(equations) > 1 else [unknown], dict=True)
    values = [s[unknown] for s in solutions if s[unknown] > 0]
    if len(values) != 1:
        raise RuntimeError(f"template parameters give {len(values)} positive solutions")
    return sympy.Rational(values[0])


# Level 1: addition and subtraction with small numbers.
def _gain(rng: random.Random) -> Params:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    return {"name": name, "item": item, "a": rng.randint(2, 12), "b": rng.randint(2, 9)}


def _loss(rng: random.Random) -> Params:
    a = rng.randint(6, 20)
    return {"a": a, "b": rng.randint(1, a - 1)}


def _spend(rng: random.Random) -> Params:
    a = rng.randint(5, 20)
    return {"name": rng.choice(NAMES), "a": a, "b": rng.randint(1, a - 1)}


def _sum_two(p: Params) -> sympy.Rational:
    return _n(p, "a") + _n(p, "b")


def _difference(p: Params) -> sympy.Rational:
    return _n(p, "a") - _n(p, "b")


# Level 2: multiplication and division.
def _product_params(rng: random.Random) -> Params:
    return {"name": rng.choice(NAMES), "a": rng.randint(2, 12), "b": rng.randint(2, 9)}


def _share_params(rng: random.Random) -> Params:
    k, q = rng.randint(2, 9), rng.randint(2, 10)
    return {"name": rng.choice(NAMES), "total": k * q, "k": k}


def _product(p: Params) -> sympy.Rational:
    return _n(p, "a") * _n(p, "b")


def _quotient(p: Params) -> sympy.Rational:
    return _n(p, "total") / _n(p, "k")


# Level 3: several steps with fractions.
def _pizza(rng: random.Random) -> Params:
    n = rng.choice((8, 10, 12))
    a = rng.randint(2, n - 4)
    return {"name": rng.choice(NAMES), "n": n, "a": a, "b": rng.randint(2, n - a - 2)}


def _pizza_left(p: Params) -> sympy.Rational:
    return (_n(p, "n") - _n(p, "a") - _n(p, "b")) / _n(p, "n")


def _money_fraction(rng: random.Random) -> Params:
    p, q = rng.choice(PROPER_FRACTIONS)
    m = q * rng.randint(4, 12)
    rest = m - m * p // q
    return {"name": rng.choice(NAMES), "m": m, "p": p, "q": q, "r": rng.randint(1, rest - 1)}


def _money_left(p: Params) -> sympy.Rational:
    money = _n(p, "m")
    return money - money * sympy.Rational(int(p["p"]), int(p["q"])) - _n(p, "r")


def _recipe(rng: random.Random) -> Params:
    b = rng.choice((2, 3, 4))
    return {"a": rng.randint(1, b - 1), "b": b, "k": rng.randint(2, 7)}


def _recipe_total(p: Params) -> sympy.Rational:
    return sympy.Rational(int(p["a"]), int(p["b"])) * _n(p, "k")


def _tank(rng: random.Random) -> Params:
    p, q = rng.choice(PROPER_FRACTIONS)
    c = q * rng.randint(5, 20)
    missing = c - c * p // q
    return {"c": c, "p": p, "q": q, "r": rng.randint(1, missing - 1)}


def _tank_missing(p: Params) -> sympy.Rational:
    capacity = _n(p, "c")
    return capacity - capacity * sympy.Rational(int(p["p"]), int(p["q"])) - _n(p, "r")


# Level 4: one linear equation in one unknown.
def _think(rng: random.Random) -> Params:
    a, b, x = rng.randint(2, 9), rng.randint(1, 20), rng.randint(2, 20)
    return {"a": a, "b": b, "c": a * x + b}


def _think_solve(p: Params) -> sympy.Rational:
    return _one_root([sympy.Eq(_n(p, "a") * _X + _n(p, "b"), _n(p, "c"))], _X)


def _ages(rng: random.Random) -> Params:
    k, x, n = rng.randint(2, 4), rng.randint(3, 12), rng.randint(2, 10)
    return {"name": rng.choice(NAMES), "k": k, "n": n, "s": k * x + x + 2 * n}


def _ages_solve(p: Params) -> sympy.Rational:
    n = _n(p, "n")
    return _one_root([sympy.Eq((_n(p, "k") * _X + n) + (_X + n), _n(p, "s"))], _X)


def _taxi(rng: random.Random) -> Params:
    f, r, miles = rng.randint(2, 6), rng.randint(2, 4), rng.randint(3, 15)
    return {"f": f, "r": r, "c": f + r * miles}


def _taxi_solve(p: Params) -> sympy.Rational:
    return _one_root([sympy.Eq(_n(p, "f") + _n(p, "r") * _X, _n(p, "c"))], _X)


def _consecutive(rng: random.Random) -> Params:
    return {"s": 3 * rng.randint(2, 40) + 3}


def _consecutive_solve(p: Params) -> sympy.Rational:
    return _one_root([sympy.Eq(_X + (_X + 1) + (_X + 2), _n(p, "s"))], _X)


# Level 5: two linear equations, or a quadratic with integer roots.
def _shop(rng: random.Random) -> Params:
    pen, book = rng.randint(1, 5), rng.randint(2, 9)
    while True:
        a1, b1, a2, b2 = (rng.randint(1, 5) for _ in range(4))
        if a1 * b2 != a2 * b1:
            break
    return {"a1": a1, "b1": b1, "c1": a1 * pen + b1 * book, "a2": a2, "b2": b2, "c2": a2 * pen + b2 * book}


def _shop_solve(p: Params) -> sympy.Rational:
    first = sympy.Eq(_n(p, "a1") * _X + _n(p, "b1") * _Y, _n(p, "c1"))
    second = sympy.Eq(_n(p, "a2") * _X + _n(p, "b2") * _Y, _n(p, "c2"))
    return _one_root([first, second], _Y)


def _sum_diff(rng: random.Random) -> Params:
    x = rng.randint(10, 60)
    y = rng.randint(1, x - 1)
    return {"s": x + y, "d": x - y}


def _sum_diff_solve(p: Params) -> sympy.Rational:
    return _one_root([sympy.Eq(_X + _Y, _n(p, "s")), sympy.Eq(_X - _Y, _n(p, "d"))], _X)


def _rectangle(rng: random.Random) -> Params:
    w, d = rng.randint(2, 15), rng.randint(1, 8)
    return {"d": d, "area": w * (w + d)}


def _rectangle_solve(p: Params) -> sympy.Rational:
    return _one_root([sympy.Eq(_X * (_X + _n(p, "d")), _n(p, "area"))], _X)


def _farm(rng: random.Random) -> Params:
    chickens, cows = rng.randint(2, 20), rng.randint(2, 20)
    return {"heads": chickens + cows, "legs": 2 * chickens + 4 * cows}


def _farm_solve(p: Params) -> sympy.Rational:
    heads = sympy.Eq(_X + _Y, _n(p, "heads"))
    legs = sympy.Eq(2 * _X + 4 * _Y, _n(p, "legs"))
    return _one_root([heads, legs], _Y)


TEMPLATES: tuple[Template, ...] = (
    Template("gain", 1, _gain, _sum_two, (
        "{name} has {a} {item}. A friend gives {name} {b} more {item}. "
        "How many {item} does {name} have now?"
    )),
    Template("pages", 1, _gain, _sum_two, (
        "{name} read {a} pages on Monday and {b} pages on Tuesday. "
        "How many pages did {name} read on the two days altogether?"
    )),
    Template("birds", 1, _loss, _difference, (
        "There are {a} birds on a tree. Then {b} of the birds fly away. "
        "How many birds are left on the tree?"
    )),
    Template("spend", 1, _spend, _difference, (
        "{name} had {a} dollars and spent {b} dollars on a snack. "
        "How many dollars does {name} have left?"
    )),
    Template("bags", 2, _product_params, _product, (
        "Each bag holds {a} marbles. How many marbles are there in {b} bags?"
    )),
    Template("rows", 2, _product_params, _product, (
        "A farmer plants {b} rows of trees with {a} trees in each row. "
        "How many trees does the farmer plant?"
    )),
    Template("share", 2, _share_params, _quotient, (
        "{total} cookies are shared equally among {k} children. "
        "How many cookies does each child get?"
    )),
    Template("packs", 2, _share_params, _quotient, (
        "Pencils are sold in packs of {k}. "
        "How many packs does {name} need to buy to get exactly {total} pencils?"
    )),
    Template("pizza", 3, _pizza, _pizza_left, (
        "A pizza is cut into {n} equal slices. "
        "{name} eats {a} slices and a friend eats {b} slices. "
        "What fraction of the pizza is left?"
    )),
    Template("money", 3, _money_fraction, _money_left, (
        "{name} has {m} dollars. "
        "{name} spends {p}/{q} of the money on a book and then {r} dollars on lunch. "
        "How many dollars does {name} have left?"
    )),
    Template("recipe", 3, _recipe, _recipe_total, (
        "A recipe needs {a}/{b} of a cup of sugar for one batch of cookies. "
        "How many cups of sugar are needed for {k} batches?"
    )),
    Template("tank", 3, _tank, _tank_missing, (
        "A water tank holds {c} liters. "
        "It is {p}/{q} full, and then {r} more liters are poured in. "
        "How many more liters are needed to fill the tank?"
    )),
    Template("think", 4, _think, _think_solve, (
        "I think of a number. When I multiply it by {a} and then add {b}, I get {c}. "
        "What is my number?"
    )),
    Template("ages", 4, _ages, _ages_solve, (
        "{name} is {k} times as old as a younger brother. "
        "In {n} years, the sum of their ages will be {s}. How old is the brother now?"
    )),
    Template("taxi", 4, _taxi, _taxi_solve, (
        "A taxi ride costs a fixed fee of {f} dollars plus {r} dollars for every mile. "
        "A ride costs {c} dollars in total. How many miles long was the ride?"
    )),
    Template("consecutive", 4, _consecutive, _consecutive_solve, (
        "The sum of three consecutive integers is {s}. "
        "What is the smallest of the three integers?"
    )),
    Template("shop", 5, _shop, _shop_solve, (
        "At a shop, {a1} pens and {b1} notebooks cost {c1} dollars together, "
        "while {a2} pens and {b2} notebooks cost {c2} dollars. "
        "How many dollars does one notebook cost?"
    )),
    Template("sum_diff", 5, _sum_diff, _sum_diff_solve, (
        "The sum of two numbers is {s} and their difference is {d}. "
        "What is the larger of the two numbers?"
    )),
    Template("rectangle", 5, _rectangle, _rectangle_solve, (
        "The length of a rectangle is {d} centimeters more than its width, "
        "and its area is {area} square centimeters. "
        "What is the width of the rectangle in centimeters?"
    )),
    Template("farm", 5, _farm, _farm_solve, (
        "A farm has only chickens and cows. "
        "Together they have {heads} heads and {legs} legs. How many cows are on the farm?"
    )),
)
