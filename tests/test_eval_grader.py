"""Tests of eval.extract, eval.normalize and eval.grader (one shared grading pool)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from eval import Verdict, extract_answer, extract_boxed, grade_answer, grade_many
from eval.grader import equivalent_many, select_answer
from eval.normalize import as_rational, normalize_answer, quick_equal
from eval.pool import TIMEOUT, get_pool, run_batch
from tts.search.tree import has_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so the answer is \\boxed{5}.", "5"),
        ("\\boxed{1} and then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}"),
        ("\\boxed{\\boxed{7}}", "7"),
        ("\\fbox{12}", "12"),
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),
        ("\\boxed 5$ done", "5"),
        ("\\boxed {  42 }", "42"),
        ("\\boxed{}", ""),
        ("\\boxed{3} but then \\boxed{4", None),
        ("the answer is \\boxed{\\frac{1}{2}", None),
        ("no box here", None),
        ("\\boxedx{3}", None),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Step 2: 4 + 3 = 7.\n\nThe answer is 7.", "7"),
        ("The answer is 7.\n\nThe answer is 3.", "3"),  # the last sentence, as for boxes
        ("So, the answer is indeed 32, which is the same", "32"),
        ("The answer is 15 marbles.", "15"),  # units after a number are left out
        ("The answer is 1,000 apples", "1,000"),
        ("The answer is 8 * 10 = 80.", "80"),  # worked arithmetic: its result
        ("The final answer is: $\\frac{3}{8}$.", "\\frac{3}{8}"),
        ("The final answer is (3, 4).", "(3, 4)"),
        ("answer is -2.5.", "-2.5"),
        ("The answer is five.", None),  # a word is not taken for an answer
        ("To find the answer is to add them.", None),
        ("The answer is $\\boxed{7}$.", "7"),  # a box, when there is one, decides
        ("The answer is 7. Check: \\boxed{8", None),  # an unclosed box is no answer
        ("THE ANSWER IS 12.", "12"),  # any case, as the pattern's re.IGNORECASE
        ("the anſwer is 5.", "5"),  # "ſ" matches "s" there: the word is looked for case-folded
        ("Answers are 4 and 5.", None),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected
    assert has_answer(text) == ("\\boxed" in text or expected is not None)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("10\\%", "10"),
        ("\\dfrac12", "\\frac12"),
        ("1,000", "1000"),
        ("10,\\!080", "10080"),
        ("11,\\! 111,\\! 111,\\! 100", "11111111100"),
        ("(1,2)", "(1,2)"),
        ("1,2", "1,2"),
        ("\\text{(B)}", "(B)"),
        ("\\text{Evelyn}", "Evelyn"),
        ("90^\\circ", "90"),
        ("30^{\\circ}", "30"),
        ("\\$32,\\!348", "32348"),
        ("864 \\mbox{ inches}^2", "864"),
        ("5.4 \\text{ cents}", "5.4"),
        ("\\frac{270}7\\text{ degrees}", "\\frac{270}7"),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "( 3, \\frac{\\pi}{2} )"),
        ("x \\rightarrow 1", "x \\rightarrow 1"),
        ("7.", "7"),
        ("  2  +  3 ", "2 + 3"),
    ],
)
def test_normalize_answer(raw: str, expected: str) -> None:
    assert normalize_answer(raw) == expected


def test_rational_literals_and_quick_equal() -> None:
    literals = ["12", "-3", "025", "3/4", "\\frac{6}{8}", "0.5", "\\sqrt2"]
    assert [as_rational(s) is not None for s in literals] == [True, True, True, True, True, False, False]
    assert as_rational("\\frac{6}{8}") == as_rational("3/4")
    assert quick_equal("025", "25") is True
    assert quick_equal("26", "25") is False
    assert quick_equal("-\\frac{3}{4}", "-3/4") is True
    assert quick_equal("0.5", "1/2") is None


@pytest.mark.parametrize(
    ("pred", "expected"),
    [
        ("\\boxed{3}", "3"),
        ("  -7  ", "-7"),
        ("The answer is $\\frac{1}{2}$", "\\frac{1}{2}"),
        ("a" * 101, None),
        ("line one\nline two", None),
        ("so \\boxed{4", None),
    ],
)
def test_select_answer(pred: str, expected: str | None) -> None:
    assert select_answer(pred) == expected


# (gold, prediction, expected reason)
TRICKY: list[tuple[str, str, str]] = [
    ("10", "10\\%", "correct"),
    ("10\\%", "10", "correct"),
    ("\\frac{1}{2}", "0.5", "correct"),
    ("0.5", "\\dfrac12", "correct"),
    ("\\frac12", "The answer is \\boxed{\\dfrac{1}{2}}.", "correct"),
    ("1000", "1,000", "correct"),
    ("1,000", "\\boxed{1000}", "correct"),
    ("(1,2)", "(1,2)", "correct"),
    ("(1,2)", "\\boxed{(2,1)}", "wrong"),
    ("\\{1,2\\}", "2, 1", "correct"),
    ("1, 2", "\\boxed{2,1}", "correct"),
    ("\\{1\\pm\\sqrt{5},-2\\}", "\\boxed{-2, 1+\\sqrt5, 1-\\sqrt5}", "correct"),
    ("\\text{(B)}", "B", "correct"),
    ("\\text{(B)}", "\\boxed{\\textbf{(B)}}", "correct"),
    ("\\text{(B)}", "\\boxed{(C)}", "wrong"),
    ("3", "x=3", "correct"),
    ("3\\sqrt{2}", "\\sqrt{18}", "correct"),
    ("90^\\circ", "90", "correct"),
    ("90", "\\boxed{90^{\\circ}}", "correct"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "\\boxed{(3, \\frac{\\pi}{2})}", "correct"),
    ("\\$18.90", "\\boxed{18.9}", "correct"),
    ("864 \\mbox{ inches}^2", "\\boxed{864}", "correct"),
    ("\\text{Evelyn}", "Evelyn", "correct"),
    ("025", "\\boxed{25}", "correct"),
    ("27", "\\boxed{\\boxed{27}}", "correct"),
    ("27", "\\boxed{28}", "wrong"),
    ("3/4", "\\boxed{\\frac{3}{4}}", "correct"),
    ("\\frac{3}{4}", "3/4", "correct"),
    ("5", "Step 1: think.\n\nSo the answer is \\boxed{5", "no_answer"),
    ("5", "Step 1: think.\n\nSo the answer is five.", "no_answer"),
    ("5", "Step 1: 2 + 3 = 5.\n\nThe answer is 5.", "correct"),
    ("15", "Step 1: 7 + 8 = 15.\n\nThe answer is 15 marbles.", "correct"),
    ("5", "\\boxed{}", "no_answer"),
    ("5", "\\boxed{???}", "unparsable"),
    ("5", "\\boxed{\\frac{}{}}", "unparsable"),
    ("5", "asdf qwe", "wrong"),
    # intervals, matrices, radicals, decimals, percentages, degrees, separators, sets,
    # tuples, choices, text, expressions, and pathological towers
    ("[1,3)", "\\boxed{[1,3)}", "correct"),
    ("[1,3)", "\\boxed{(1,3]}", "wrong"),
    ("(-\\infty, 2]", "\\boxed{(-\\infty,2]}", "correct"),
    ("(-\\infty, 2]", "\\boxed{(-\\infty, 2)}", "wrong"),
    ("(0,1)\\cup(2,\\infty)", "\\boxed{(2,\\infty)\\cup(0,1)}", "correct"),
    ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", "\\boxed{\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}}", "correct"),
    ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", "\\boxed{\\begin{pmatrix}1&2\\\\4&3\\end{pmatrix}}", "wrong"),
    ("\\begin{pmatrix} -1/3 \\\\ 2/3 \\end{pmatrix}", "\\boxed{\\begin{pmatrix} -\\frac{1}{3} \\\\ \\frac{2}{3} \\end{pmatrix}}", "correct"),
    ("\\frac{\\sqrt{3}}{2}", "\\boxed{\\frac{1}{2}\\sqrt{3}}", "correct"),
    ("\\frac{\\sqrt{3}}{2}", "\\boxed{\\frac{\\sqrt{2}}{2}}", "wrong"),
    ("2\\sqrt{5}", "\\boxed{\\sqrt{20}}", "correct"),
    ("\\sqrt{2}", "\\boxed{1.414}", "wrong"),
    ("0.25", "\\boxed{\\tfrac{1}{4}}", "correct"),
    ("\\dfrac{7}{8}", "\\boxed{0.875}", "correct"),
    ("\\dfrac{7}{8}", "\\boxed{0.87}", "wrong"),
    ("-\\frac{2}{3}", "\\boxed{\\frac{-2}{3}}", "correct"),
    ("50\\%", "\\boxed{50}", "correct"),
    ("12.5\\%", "\\boxed{12.5\\%}", "correct"),
    ("30^\\circ", "\\boxed{30^\\circ}", "correct"),
    ("45", "\\boxed{45^{\\circ}}", "correct"),
    ("1,234,567", "\\boxed{1234567}", "correct"),
    ("10,000", "\\boxed{10000}", "correct"),
    ("10,000", "\\boxed{1000}", "wrong"),
    ("\\{-1, 3\\}", "\\boxed{3, -1}", "correct"),
    ("\\{-1, 3\\}", "\\boxed{-1, 2}", "wrong"),
    ("(2, -5)", "\\boxed{(2,-5)}", "correct"),
    ("(2, -5)", "\\boxed{(-5,2)}", "wrong"),
    ("\\text{(D)}", "\\boxed{D}", "correct"),
    ("\\textbf{(E)}", "\\boxed{\\text{(A)}}", "wrong"),
    ("\\text{odd}", "\\boxed{\\text{odd}}", "correct"),
    ("\\text{odd}", "\\boxed{\\text{even}}", "wrong"),
    ("x^2+2x+1", "\\boxed{(x+1)^2}", "correct"),
    ("x^2+2x+1", "\\boxed{(x-1)^2}", "wrong"),
    ("\\pi", "\\boxed{3.14}", "wrong"),
    ("2\\pi", "\\boxed{2 \\pi}", "correct"),
    ("y = 2x + 3", "\\boxed{y=2x+3}", "correct"),
    ("9^{9^{9^9}}", "\\boxed{9^{9^{9^9}}+1}", "wrong"),  # decided without evaluating
    ("9^{9^{9^9}}", "\\boxed{3^{2\\cdot 9^{9^9}}}", "timeout"),  # equal, but only by evaluating
]


@pytest.fixture(scope="module")
def tricky_verdicts() -> list[Verdict]:
    return grade_many([(gold, pred) for gold, pred, _ in TRICKY])


@pytest.mark.parametrize("case", range(len(TRICKY)), ids=[f"{g}|{p}" for g, p, _ in TRICKY])
def test_tricky_pairs(case: int, tricky_verdicts: list[Verdict]) -> None:
    gold, _pred, reason = TRICKY[case]
    verdict = tricky_verdicts[case]
    assert (verdict.reason, verdict.correct, verdict.gold) == (reason, reason == "correct", gold)


def test_grade_answer_matches_grade_many_and_reports_extracted_answer() -> None:
    assert grade_answer("\\frac{1}{2}", "so \\boxed{0.5}") == Verdict(
        correct=True, reason="correct", pred="0.5", gold="\\frac{1}{2}"
    )
    assert grade_answer("5", "long text\nwithout box") == Verdict(
        correct=False, reason="no_answer", pred=None, gold="5"
    )
    assert grade_answer("5", "\\boxed{}") == Verdict(correct=False, reason="no_answer", pred="", gold="5")


def test_equivalent_many() -> None:
    pairs = [("0.5", "\\frac12"), ("2", "3"), ("", "3"), ("\\sqrt{18}", "3\\sqrt2"), ("x+1", "1+x")]
    assert equivalent_many(pairs) == [True, False, False, True, True]


def test_verdict_validates_reason() -> None:
    with pytest.raises(ValueError, match="reason must be one of"):
        Verdict(correct=False, reason="maybe", pred="1", gold="1")
    with pytest.raises(ValueError, match="correct"):
        Verdict(correct=True, reason="wrong", pred="1", gold="2")


@pytest.mark.parametrize("timeout_s", [0, 0.5, -1, True])
def test_timeout_must_be_whole_seconds(timeout_s: object) -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        grade_answer("1", "\\boxed{x+1}", timeout_s=timeout_s)  # type: ignore[arg-type]


STUCK_S = 600  # far past the limits below: a limit not kept fails a test instead of hanging it


def stuck(*_args: object) -> str:
    """A task past its time limit on any host (a stand-in for a slow comparison): it waits on
    an event that nothing sets, until its worker is killed (or STUCK_S seconds have passed)."""
    threading.Event().wait(STUCK_S)
    return "correct"


def maybe_stuck(block: bool) -> str | None:
    return stuck() if block else None


def test_run_batch_timeout_replaces_pool_and_keeps_other_results() -> None:
    pool = get_pool()
    workers = pool._processes  # every worker the pool starts is added to it
    results = run_batch(maybe_stuck, [(False,), (True,), (False,)], timeout_s=1)
    assert results[0] is None and results[1] is TIMEOUT and results[2] is None
    assert get_pool() is not pool
    assert not [w for w in list(workers.values()) if w.is_alive()]  # the stuck task's worker was killed


def test_a_comparison_past_its_time_limit_times_out_then_grading_still_works(monkeypatch) -> None:
    import eval.grader

    monkeypatch.setattr(eval.grader, "compare", stuck)
    slow = grade_answer("(x+y+z+1)^{40}", "\\boxed{(x+y+z+2)^{40}}", timeout_s=1)
    assert slow == Verdict(correct=False, reason="timeout", pred="(x+y+z+2)^{40}", gold="(x+y+z+1)^{40}")
    monkeypatch.undo()
    assert grade_answer("\\sqrt{4}", "\\boxed{2.0}").reason == "correct"


def test_run_batch_crashing_task_is_isolated_and_gets_timeout() -> None:
    # SIGWINCH is ignored by default; SIGKILL kills the worker and breaks the pool.
    # Task 1 alone is blamed: it is retried once, alone, then reported as TIMEOUT.
    tasks = [(signal.SIGWINCH,), (signal.SIGKILL,), (signal.SIGWINCH,), (signal.SIGWINCH,)]
    assert run_batch(signal.raise_signal, tasks, timeout_s=5) == [None, TIMEOUT, None, None]
    assert grade_answer("2", "\\boxed{\\sqrt{4}}").reason == "correct"


def test_unguarded_script_gets_a_clear_start_up_error(tmp_path: Path) -> None:
    """With torch loaded the workers must spawn, which re-runs the main script: an
    unguarded one gets a start-up error that says what to do."""
    script = tmp_path / "unguarded.py"
    script.write_text('import torch\nfrom eval import grade_answer\nprint(grade_answer("x+1", "1+x"))\n')
    repo = Path(__file__).parents[1]
    done = subprocess.run(
        [sys.executable, str(script)], cwd=repo, env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 1
    assert "RuntimeError: grading worker processes failed to start" in done.stderr
    assert 'if __name__ == "__main__":' in done.stderr


DATA = Path(__file__).parents[1].parent / "shared" / "data"
FIXTURES = Path(__file__).parent / "data"  # a few real rows of each benchmark, as its source has them


def boxed(answer: str) -> str:
    return f"So the final answer is $\\boxed{{{answer}}}$."


@pytest.mark.parametrize("name", ["math500", "aime24", "amc23"])
def test_every_benchmark_answer_grades_right_boxed_and_its_neighbours_wrong(name: str) -> None:
    """Each row's gold answer, as the loader reads it, is correct against itself in a boxed
    response, and wrong against the next row's answer (all differ); a row's own solution,
    where it boxes its answer, is correct too."""
    import json

    from eval import load_problems

    path = FIXTURES / f"{name}.jsonl"
    golds = [p.answer for p in load_problems(name, path=str(path))]
    others = golds[1:] + golds[:1]
    assert [v.correct for v in grade_many([(g, boxed(g)) for g in golds])] == [True] * len(golds)
    assert [v.correct for v in grade_many([(g, boxed(o)) for g, o in zip(golds, others)])] == [False] * len(golds)
    solutions = [json.loads(line).get("solution") or "" for line in path.read_text().splitlines()]
    pairs = [(g, s) for g, s in zip(golds, solutions, strict=True) if "\\boxed" in s]
    assert [v.correct for v in grade_many(pairs)] == [True] * len(pairs)
    assert len(pairs) == {"math500": 8, "aime24": 2, "amc23": 0}[name]  # AMC 2023's rows have no solution


@pytest.mark.skipif(not (DATA / "math500.jsonl").is_file(),
                    reason=f"{DATA} is absent (the full benchmarks, not in a clone; tests/data's rows are graded above)")
def test_all_570_reference_answers_grade_correct_against_their_solutions() -> None:
    """Gold: each row's `answer`; prediction: its `solution` (the boxed answer is extracted)
    where it has one, else the `answer` field itself."""
    import json

    from eval import load_problems

    pairs = []
    for name in ("math500", "aime24", "amc23"):
        path = DATA / f"{name}.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for row, problem in zip(rows, load_problems(name, path=str(path)), strict=True):
            solution = row.get("solution") or ""
            pairs.append((problem.answer, solution if "\\boxed" in solution else problem.answer))
    assert len(pairs) == 570
    verdicts = grade_many(pairs)
    wrong = [(gold, v.pred, v.reason) for (gold, _), v in zip(pairs, verdicts) if not v.correct]
    assert wrong == []


def test_a_long_bare_answer_is_still_an_answer() -> None:
    vector = "\\begin{pmatrix} 16/49 \\\\ 48/49 \\\\ 24/49 \\end{pmatrix}"
    assert select_answer(vector) == vector
    assert grade_answer(vector, vector).reason == "correct"


def test_a_script_without_a_main_guard_grades_once(tmp_path: Path) -> None:
    """A plain script that grades at top level, as other tools call it: the grading workers
    do not re-run it (they fork where no torch or vLLM is loaded), so it prints once."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from eval import grade_answer\n"
        "from eval.pool import start_method\n"
        "print('RUN', start_method(), flush=True)\n"
        "print('VERDICT', grade_answer('1/2', 'so \\\\boxed{0.5}').correct, flush=True)\n")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240,
                          cwd=tmp_path, env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["RUN fork", "VERDICT True"]


def test_spawn_is_kept_where_fork_is_unsafe(monkeypatch) -> None:
    import eval.pool as pool

    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or object())
    assert pool.start_method() == "spawn"
