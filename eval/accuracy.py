"""Answer selection (majority, weighted best-of-N, PRM-max) and accuracy curves.

Candidates are grouped by answer equivalence: first by a canonical normalized string
key, then groups whose keys are not trivially comparable are merged when an
equivalence function (default: math-verify in the grading pool, in one parallel
batch) says they are equivalent. Candidates without an answer do not vote.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from eval.grader import equivalent_many
from eval.normalize import canonical_key, quick_equal

Equivalence = Callable[[Sequence[tuple[str, str]]], list[bool]]
"""A batch equivalence test: one bool per ``(a, b)`` pair of bare answers."""

METHODS: tuple[str, ...] = ("majority", "weighted", "prm_max", "pass")
SELECTORS: tuple[str, ...] = ("majority", "weighted", "prm_max")


@dataclass(frozen=True)
class Candidate:
    """One candidate solution: its extracted final answer and its verifier score."""

    answer: str | None
    score: float | None = None


def _find(parent: list[int], i: int) -> int:
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


def _union(parent: list[int], a: int, b: int) -> None:
    """Merge the sets of ``a`` and ``b``; the smaller index stays the root."""
    root_a, root_b = _find(parent, a), _find(parent, b)
    parent[max(root_a, root_b)] = min(root_a, root_b)


def _merge_keys(reps: list[str], keys: list[str], equiv: Equivalence) -> list[int]:
    """Union-find over distinct keys; return the root index of each key.

    Pairs of integer/fraction literals are decided directly; the remaining pairs are
    asked of ``equiv`` in one batch, one pair per pair of literal-merged groups.
    """
    parent = list(range(len(keys)))
    unsure: list[tuple[int, int]] = []
    for i in range(len(keys)):
        for j in range(i + 1, len(keys)):
            same = quick_equal(keys[i], keys[j])
            if same is None:
                unsure.append((i, j))
            elif same:
                _union(parent, i, j)
    root_pairs = sorted({(_find(parent, i), _find(parent, j)) for i, j in unsure})
    root_pairs = [(a, b) for a, b in root_pairs if a != b]
    verdicts = equiv([(reps[a], reps[b]) for a, b in root_pairs]) if root_pairs else []
    for (a, b), same in zip(root_pairs, verdicts):
        if same:
            _union(parent, a, b)
    return [_find(parent, i) for i in range(len(keys))]


def group_answers(answers: Sequence[str | None], equiv: Equivalence | None = None) -> list[int | None]:
    """Label each answer with the index of the first answer equivalent to it.

    None and empty answers get None. ``equiv`` defaults to ``equivalent_many``.
    """
    keys = [canonical_key(a) if a is not None else "" for a in answers]
    distinct = list(dict.fromkeys(k for k in keys if k))
    first_index = {key: keys.index(key) for key in distinct}
    reps = [str(answers[first_index[key]]) for key in distinct]
    roots = _merge_keys(reps, distinct, equiv or equivalent_many)
    label_of = {key: first_index[distinct[roots[n]]] for n, key in enumerate(distinct)}
    return [label_of[k] if k else None for k in keys]


def _best_label(totals: dict[int, float]) -> int | None:
    """The label with the largest total; ties go to the group seen first."""
    if not totals:
        return None
    return min(totals, key=lambda label: (-totals[label], label))


def _majority_label(labels: Sequence[int | None], k: int) -> int | None:
    counts: dict[int, float] = {}
    for label in labels[:k]:
        if label is not None:
            counts[label] = counts.get(label, 0.0) + 1.0
    return _best_label(counts)


def _weighted_label(labels: Sequence[int | None], scores: Sequence[float | None], k: int) -> int | None:
    sums: dict[int, float] = {}
    for label, score in zip(labels[:k], scores[:k]):
        if label is not None:
            sums[label] = sums.get(label, 0.0) + (score or 0.0)
    return _best_label(sums)


def _ranked(candidates: Sequence[Candidate]) -> list[int]:
    """Indices by score, highest first; unscored last; ties keep the original order."""
    return sorted(
        range(len(candidates)),
        key=lambda i: (candidates[i].score is None, -(candidates[i].score or 0.0), i),
    )


def _prm_index(candidates: Sequence[Candidate], k: int) -> int | None:
    ranked = _ranked(candidates[:k])
    return ranked[0] if ranked else None


def _answers(candidates: Sequence[Candidate]) -> list[str | None]:
    return [c.answer for c in candidates]


def majority_vote(candidates: Sequence[Candidate], equiv: Equivalence | None = None,
                  labels: Sequence[int | None] | None = None) -> str | None:
    """Return the answer of the largest group of equivalent answers (ties: first seen).

    The returned string is the group's first answer; None when no candidate has one.
    ``labels``: the candidates' ``group_answers``, where the caller has them already.
    """
    labels = group_answers(_answers(candidates), equiv) if labels is None else labels
    label = _majority_label(labels, len(candidates))
    return None if label is None else candidates[label].answer


def weighted_best_of_n(candidates: Sequence[Candidate], equiv: Equivalence | None = None,
                       labels: Sequence[int | None] | None = None) -> str | None:
    """Return the answer whose group has the largest sum of scores (None scores count 0)."""
    labels = group_answers(_answers(candidates), equiv) if labels is None else labels
    scores = [c.score for c in candidates]
    label = _weighted_label(labels, scores, len(candidates))
    return None if label is None else candidates[label].answer


def prm_max(candidates: Sequence[Candidate]) -> str | None:
    """Return the answer of the highest-scored candidate (which may be None).

    Unscored candidates rank last; ties go to the earlier candidate.
    """
    index = _prm_index(candidates, len(candidates))
    return None if index is None else candidates[index].answer


def _correct_labels(
    candidates: Sequence[Candidate], labels: Sequence[int | None], gold: str, equiv: Equivalence
) -> dict[int, bool]:
    """Grade one representative per group against ``gold`` in one batch."""
    groups = sorted({label for label in labels if label is not None})
    pairs = [(gold, str(candidates[label].answer)) for label in groups]
    return dict(zip(groups, equiv(pairs) if pairs else []))


def pass_at_n(
    candidates: Sequence[Candidate], gold: str, n: int, equiv: Equivalence | None = None
) -> bool:
    """Return whether any of the ``n`` highest-scored candidates is correct."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    top = [candidates[i] for i in _ranked(candidates)[:n]]
    answers = [str(c.answer) for c in top if c.answer is not None and canonical_key(c.answer)]
    return any((equiv or equivalent_many)([(gold, a) for a in answers])) if answers else False


def default_sizes(num_candidates: int) -> list[int]:
    """Return 1, 2, 4, ... up to ``num_candidates``, plus ``num_candidates`` itself."""
    sizes: list[int] = []
    size = 1
    while size <= num_candidates:
        sizes.append(size)
        size *= 2
    if num_candidates >= 1 and sizes[-1] != num_candidates:
        sizes.append(num_candidates)
    return sizes


def _check_sizes(sizes: list[int] | None, num_candidates: int) -> list[int]:
    if num_candidates < 1:
        raise ValueError("candidates must hold at least one candidate")
    if sizes is None:
        return default_sizes(num_candidates)
    bad = [s for s in sizes if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= num_candidates]
    if bad or not sizes:
        raise ValueError(f"sizes must be integers in [1, {num_candidates}], got {sizes!r}")
    return list(sizes)


def accuracy_curves(
    candidates: Sequence[Candidate],
    gold: str,
    sizes: list[int] | None = None,
    seed: int = 0,
    equiv: Equivalence | None = None,
    labels: Sequence[int | None] | None = None,
) -> dict[str, Any]:
    """Correctness of each selection rule on the first k candidates, for each k in ``sizes``.

    ``sizes`` defaults to 1, 2, 4, ... N (and N). search-and-learn also takes the
    first k completions (they are i.i.d. samples), so no subsampling is done here and
    ``seed`` is only recorded in the result. Groups are formed once over all N
    candidates. "pass" is whether any of the first k is correct (pass@k, equal to
    ``pass_at_n`` on those k). Returns a JSON-ready dict with "sizes", one list of
    bools per rule in ``METHODS``, and the chosen answer per selection rule
    ("<rule>_answer"; for majority/weighted the first answer of the winning group).
    ``labels``: the candidates' ``group_answers``, where the caller has them already.
    """
    chosen_sizes = _check_sizes(sizes, len(candidates))
    test = equiv or equivalent_many
    labels = group_answers(_answers(candidates), test) if labels is None else labels
    correct = _correct_labels(candidates, labels, gold, test)
    result: dict[str, Any] = {"num_candidates": len(candidates), "sizes": chosen_sizes, "seed": seed}
    for method in METHODS:
        result[method] = []
    for method in SELECTORS:
        result[f"{method}_answer"] = []
    for k in chosen_sizes:
        for method, index in _picks(candidates, labels, k).items():
            label = None if index is None else labels[index]
            result[method].append(label is not None and correct[label])
            result[f"{method}_answer"].append(None if index is None else candidates[index].answer)
        result["pass"].append(any(correct.get(lb, False) for lb in labels[:k] if lb is not None))
    return result


def _picks(
    candidates: Sequence[Candidate], labels: Sequence[int | None], k: int
) -> dict[str, int | None]:
    """The candidate index chosen by each rule among the first ``k`` candidates."""
    scores = [c.score for c in candidates]
    return {
        "majority": _majority_label(labels, k),
        "weighted": _weighted_label(labels, scores, k),
        "prm_max": _prm_index(candidates, k),
    }


def _mean_flags(values: list[Any], key: str) -> float | list[float] | None:
    """Average bools (or equal-length lists of bools) across problems; None if not flags."""
    if all(isinstance(v, bool) for v in values):
        return sum(values) / len(values)
    if not all(isinstance(v, list) and all(isinstance(x, bool) for x in v) for v in values):
        return None
    lengths = {len(v) for v in values}
    if len(lengths) != 1:
        raise ValueError(f"per_problem[*][{key!r}] lists differ in length: {sorted(lengths)}")
    return [sum(column) / len(values) for column in zip(*values)]


def summarize_accuracy(per_problem: list[dict[str, Any]]) -> dict[str, Any]:
    """Average per-problem correctness flags over problems.

    Each dict is, for example, an ``accuracy_curves`` result or ``{"correct": True}``.
    A key whose values are bools in every dict becomes their mean; a key whose values
    are lists of bools becomes the element-wise mean. "sizes", when present, must be
    the same for all problems and is copied. Other keys are ignored. Returns
    ``{"num_problems": P, ...}`` (only "num_problems" when ``per_problem`` is empty).
    """
    summary: dict[str, Any] = {"num_problems": len(per_problem)}
    if not per_problem:
        return summary
    shared = set(per_problem[0]).intersection(*per_problem[1:])
    if "sizes" in shared:
        sizes = [p["sizes"] for p in per_problem]
        if any(s != sizes[0] for s in sizes):
            raise ValueError("per_problem[*]['sizes'] must be the same for every problem")
        summary["sizes"] = list(sizes[0])
    for key in sorted(shared - {"sizes"}):
        mean = _mean_flags([p[key] for p in per_problem], key)
        if mean is not None:
            summary[key] = mean
    return summary
