"""Selection of a subset of benchmark problems."""

from __future__ import annotations

import random
from collections.abc import Sequence

from eval.problem import Problem


def _check_count(name: str, value: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer or None, got {value!r}")


def _filter_ids(problems: list[Problem], ids: Sequence[str]) -> list[Problem]:
    known = {p.id for p in problems}
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise ValueError(f"ids not found in the dataset: {unknown}")
    wanted = set(ids)
    return [p for p in problems if p.id in wanted]


def select_subset(
    problems: Sequence[Problem],
    first_k: int | None = None,
    levels: list[int] | None = None,
    ids: list[str] | None = None,
    random_k: int | None = None,
    seed: int = 0,
) -> list[Problem]:
    """Select problems: filter by ``ids`` and ``levels``, then take ``random_k`` or ``first_k``.

    Filters keep the dataset order. ``random_k`` draws that many problems with
    ``random.Random(seed)`` and keeps their original relative order; ``first_k``
    takes the first ones. Counts larger than what is left take everything.
    ``first_k`` and ``random_k`` are exclusive. Unknown ids raise ValueError naming them.
    """
    _check_count("first_k", first_k)
    _check_count("random_k", random_k)
    if first_k is not None and random_k is not None:
        raise ValueError("give at most one of first_k and random_k")
    selected = list(problems)
    if ids is not None:
        selected = _filter_ids(selected, ids)
    if levels is not None:
        if not all(isinstance(lv, int) and not isinstance(lv, bool) for lv in levels):
            raise ValueError(f"levels must be a list of integers, got {levels!r}")
        wanted = set(levels)
        selected = [p for p in selected if p.level in wanted]
    if random_k is not None:
        count = min(random_k, len(selected))
        chosen = sorted(random.Random(seed).sample(range(len(selected)), count))
        return [selected[i] for i in chosen]
    if first_k is not None:
        return selected[:first_k]
    return selected
