"""Tests of eval.accuracy: grouping, selection rules, pass@n, curves and summaries."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from eval.accuracy import (
    Candidate,
    accuracy_curves,
    default_sizes,
    group_answers,
    majority_vote,
    pass_at_n,
    prm_max,
    summarize_accuracy,
    weighted_best_of_n,
)


def exact(pairs: Sequence[tuple[str, str]]) -> list[bool]:
    """A fake equivalence: equal after removing spaces; records how often it is called."""
    exact.calls.append(list(pairs))  # type: ignore[attr-defined]
    return ["".join(a.split()) == "".join(b.split()) for a, b in pairs]


exact.calls = []  # type: ignore[attr-defined]


def C(answer: str | None, score: float | None = None) -> Candidate:
    return Candidate(answer=answer, score=score)


def test_group_answers_with_math_verify() -> None:
    answers = ["\\frac{1}{2}", "0.5", None, "3", "\\dfrac12", "", "1/2", "x+1", "1+x"]
    assert group_answers(answers) == [0, 0, None, 3, 0, None, 0, 7, 7]


def test_group_answers_uses_keys_and_quick_compare_before_equivalence() -> None:
    exact.calls.clear()  # type: ignore[attr-defined]
    labels = group_answers(["3", " 3", "\\frac{6}{2}", "4", "\\text{3}", "a+b", "b+a"], exact)
    assert labels == [0, 0, 0, 3, 0, 5, 6]
    # literal pairs are decided directly ("3" = "\\frac{6}{2}", "3" != "4"); one batch asks
    # the rest, once per pair of groups
    assert exact.calls == [  # type: ignore[attr-defined]
        [("3", "a+b"), ("3", "b+a"), ("4", "a+b"), ("4", "b+a"), ("a+b", "b+a")]
    ]


def test_group_label_is_the_first_member_whatever_the_merge_order() -> None:
    # keys: "a"(0), "5"(1), "b"(2), "10/2"(3); "a"~"10/2" via equiv, then "5"="10/2" directly
    def a_is_5(pairs: Sequence[tuple[str, str]]) -> list[bool]:
        return [{a, b} in ({"a", "5"}, {"a", "10/2"}) for a, b in pairs]

    assert group_answers(["a", "5", "b", "10/2"], a_is_5) == [0, 0, 2, 0]


def test_majority_vote_counts_equivalent_answers() -> None:
    candidates = [C("2"), C("\\frac12"), C("0.5"), C("2"), C("1/2"), C(None), C(None), C(None)]
    assert majority_vote(candidates) == "\\frac12"


def test_majority_tie_goes_to_first_seen() -> None:
    assert majority_vote([C("7"), C("8"), C("8"), C("7")], exact) == "7"
    assert majority_vote([C(None), C(None)], exact) is None
    assert majority_vote([], exact) is None


def test_weighted_best_of_n_sums_scores_per_group() -> None:
    candidates = [C("5", 0.9), C("6", 0.5), C("6", 0.3), C("6", 0.2), C("5", 0.05)]
    assert weighted_best_of_n(candidates, exact) == "6"  # 1.0 against 0.95
    assert majority_vote(candidates, exact) == "6"
    candidates = [C("5", 0.9), C("6", 0.5), C("6", 0.3), C("5", None)]
    assert weighted_best_of_n(candidates, exact) == "5"  # 0.9 + 0 against 0.8


def test_prm_max_takes_highest_score() -> None:
    assert prm_max([C("1", 0.2), C("2", 0.9), C("3", 0.9), C("4", None)]) == "2"
    assert prm_max([C(None, 0.99), C("2", 0.9)]) is None
    assert prm_max([C("4", None), C("5", 0.0)]) == "5"
    assert prm_max([]) is None


def test_pass_at_n_ranks_by_score() -> None:
    candidates = [C("1", 0.1), C("2", 0.8), C("3", 0.5), C(None, 0.9), C("\\frac{4}{2}", 0.7)]
    # ranking: None(0.9), "2"(0.8), \frac{4}{2}(0.7), "3"(0.5), "1"(0.1)
    assert [pass_at_n(candidates, "1", n, exact) for n in (1, 2, 3, 4, 5, 9)] == [
        False, False, False, False, True, True,
    ]
    assert [pass_at_n(candidates, "2", n) for n in (1, 2)] == [False, True]
    with pytest.raises(ValueError, match="n must be a positive integer"):
        pass_at_n(candidates, "1", 0)


def test_default_sizes() -> None:
    assert default_sizes(1) == [1]
    assert default_sizes(8) == [1, 2, 4, 8]
    assert default_sizes(6) == [1, 2, 4, 6]


def test_accuracy_curves_on_first_k() -> None:
    candidates = [
        C("3", 0.2), C("5", 0.9), C("5", 0.1), C("3", 0.4),
        C("3", 0.3), C(None, 0.95), C("5", 0.1), C("4", 0.1),
    ]
    curves = accuracy_curves(candidates, "3", equiv=exact)
    assert curves == {
        "num_candidates": 8,
        "sizes": [1, 2, 4, 8],
        "seed": 0,
        "majority": [True, True, True, True],
        "weighted": [True, False, False, False],  # k=4: 5 has 1.0, 3 has 0.6; k=8: 1.1 vs 0.9
        "prm_max": [True, False, False, False],
        "pass": [True, True, True, True],
        "majority_answer": ["3", "3", "3", "3"],
        "weighted_answer": ["3", "5", "5", "5"],
        "prm_max_answer": ["3", "5", "5", None],
    }
    assert json.loads(json.dumps(curves)) == curves


def test_accuracy_curves_pass_and_explicit_sizes() -> None:
    candidates = [C("1", 0.9), C("2", 0.1), C("2", 0.2), C("\\frac{6}{2}", 0.3)]
    curves = accuracy_curves(candidates, "3", sizes=[1, 3, 4], seed=7)
    assert curves["sizes"] == [1, 3, 4] and curves["seed"] == 7
    assert curves["pass"] == [False, False, True]
    assert curves["majority"] == [False, False, False]
    assert curves["weighted"] == [False, False, False]
    assert curves["prm_max"] == [False, False, False]


@pytest.mark.parametrize("sizes", [[0], [5], [], [1.5]])
def test_accuracy_curves_rejects_bad_sizes(sizes: list[int]) -> None:
    with pytest.raises(ValueError, match="sizes"):
        accuracy_curves([C("1"), C("2"), C("3"), C("4")], "1", sizes=sizes, equiv=exact)


def test_accuracy_curves_needs_candidates() -> None:
    with pytest.raises(ValueError, match="candidates"):
        accuracy_curves([], "1", equiv=exact)


def test_summarize_accuracy_averages_flags() -> None:
    first = {"sizes": [1, 2], "majority": [True, True], "pass": [False, True], "seed": 0,
             "majority_answer": ["1", "1"]}
    second = {"sizes": [1, 2], "majority": [False, True], "pass": [False, False], "seed": 0,
              "majority_answer": ["2", "2"]}
    assert summarize_accuracy([first, second]) == {
        "num_problems": 2,
        "sizes": [1, 2],
        "majority": [0.5, 1.0],
        "pass": [0.0, 0.5],
    }
    flags = [{"correct": c, "id": i} for c, i in [(True, "a"), (False, "b"), (True, "c"), (True, "d")]]
    assert summarize_accuracy(flags) == {"num_problems": 4, "correct": 0.75}
    assert summarize_accuracy([]) == {"num_problems": 0}


def test_summarize_accuracy_rejects_mismatched_sizes() -> None:
    with pytest.raises(ValueError, match="sizes"):
        summarize_accuracy([{"sizes": [1], "pass": [True]}, {"sizes": [1, 2], "pass": [True, True]}])
    with pytest.raises(ValueError, match="differ in length"):
        summarize_accuracy([{"pass": [True]}, {"pass": [True, False]}])


def test_candidate_is_frozen() -> None:
    with pytest.raises(AttributeError):
        C("1").answer = "2"  # type: ignore[misc]
