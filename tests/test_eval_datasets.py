"""Tests of eval.datasets / eval.subset: local JSONL loading, hub errors, subsets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from eval import Problem, load_problems, select_subset
from eval.datasets import answer_to_str
from eval.rows import DatasetLoadError

# The full benchmark files sit beside the repository on the machines it was built on, not
# in a clone; a few real rows of each, in its source's own format, are tests/data's.
DATA = Path(__file__).parents[1].parent / "shared" / "data"
REPO = Path(__file__).parents[1]
FIXTURES = Path(__file__).parent / "data"


def _data_file(name: str) -> Path:
    path = DATA / f"{name}.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} is absent (the full benchmark, not in a clone; tests/data/{name}.jsonl's rows "
                    "cover the loader)")
    return path


def test_math500_rows_in_their_source_format() -> None:
    """problem, solution, answer, subject, level; no id: the row's index is."""
    problems = load_problems("math500", path=str(FIXTURES / "math500.jsonl"))
    assert [(p.id, p.answer, p.level, p.subject) for p in problems] == [
        ("math500-0", "\\left( 3, \\frac{\\pi}{2} \\right)", 2, "Precalculus"),
        ("math500-1", "\\frac{14}{3}", 3, "Algebra"),
        ("math500-2", "\\text{Evelyn}", 2, "Algebra"),
        ("math500-3", "6+9i", 3, "Algebra"),
        ("math500-4", "\\dfrac{17}{50}", 5, "Prealgebra"),
        ("math500-5", "\\$32,\\!348", 5, "Algebra"),
        ("math500-6", "\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}", 4, "Precalculus"),
        ("math500-7", "(-\\infty, 0]", 2, "Precalculus"),
    ]
    assert problems[0].problem.startswith("Convert the point $(0,3)$ in rectangular coordinates")
    assert {p.source for p in problems} == {"math500"}


def test_aime24_rows_keep_their_ids_and_leading_zeros() -> None:
    """id, problem, question, solution, answer (a string of digits), url."""
    problems = load_problems("aime24", path=str(FIXTURES / "aime24.jsonl"))
    assert [(p.id, p.answer, p.level, p.subject, p.source) for p in problems] == [
        ("aime24-60", "204", None, None, "aime24"),
        ("aime24-67", "025", None, None, "aime24"),
        ("aime24-83", "045", None, None, "aime24"),
    ]
    assert problems[0].problem.startswith("Every morning Aya goes for a $9$-kilometer-long walk")


def test_amc23_rows_float_answers_become_integer_strings() -> None:
    """id, problem, question, answer (a float: 27.0), url."""
    problems = load_problems("amc23", path=str(FIXTURES / "amc23.jsonl"))
    assert [(p.id, p.answer, p.level, p.subject, p.source) for p in problems] == [
        ("amc23-0", "27", None, None, "amc23"),
        ("amc23-3", "3159", None, None, "amc23"),
        ("amc23-17", "-1", None, None, "amc23"),
        ("amc23-44", "1625", None, None, "amc23"),
    ]
    assert problems[0].problem.startswith("Cities $A$ and $B$ are $45$ miles apart.")


@pytest.mark.parametrize(("name", "ids"), [("math500", ["math500-1", "math500-3"]),
                                           ("aime24", ["aime24-67"]), ("amc23", ["amc23-3", "amc23-44"])])
def test_a_runs_dataset_is_read_from_tts_data_dir(name: str, ids: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`TTS_DATA_DIR=DIR tts bench dataset=NAME`: DIR/NAME.jsonl, then the subset."""
    from tts.config.compose import compose
    from tts.problems import load_problems_for

    monkeypatch.setenv("TTS_DATA_DIR", str(FIXTURES))
    cfg = compose("config", [f"dataset={name}", "dataset.first_k=null", f"dataset.ids={ids}"])
    assert [p.id for p in load_problems_for(cfg)] == ids


def test_math500_local_fields() -> None:
    problems = load_problems("math500", path=str(_data_file("math500")))
    assert len(problems) == 500
    first = problems[0]
    assert first.id == "math500-0"
    assert first.answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert first.level == 2
    assert first.subject == "Precalculus"
    assert first.source == "math500"
    assert first.problem.startswith("Convert the point $(0,3)$")
    assert problems[499].id == "math500-499"
    assert len({p.id for p in problems}) == 500
    assert {p.level for p in problems} == {1, 2, 3, 4, 5}


def test_aime24_local_ids_and_string_answers() -> None:
    problems = load_problems("aime24", path=str(_data_file("aime24")))
    assert len(problems) == 30
    assert problems[0] == Problem(
        id="aime24-60", problem=problems[0].problem, answer="204", source="aime24"
    )
    assert problems[-1].id == "aime24-89"
    assert [p.answer for p in problems if p.id == "aime24-67"] == ["025"]


def test_amc23_float_answers_become_integer_strings() -> None:
    problems = load_problems("amc23", path=str(_data_file("amc23")))
    assert len(problems) == 40
    assert (problems[0].id, problems[0].answer) == ("amc23-0", "27")
    assert [p.answer for p in problems if p.id == "amc23-17"] == ["-1"]
    assert all("." not in p.answer for p in problems)
    assert problems[0].level is None and problems[0].subject is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [(27.0, "27"), (-1.0, "-1"), (2.5, "2.5"), (0.125, "0.125"), (7, "7"), (" 025 ", "025")],
)
def test_answer_to_str(value: object, expected: str) -> None:
    assert answer_to_str(value, "row") == expected


@pytest.mark.parametrize("value", [None, True, float("nan"), [1]])
def test_answer_to_str_rejects(value: object) -> None:
    with pytest.raises(ValueError, match="answer"):
        answer_to_str(value, "row 3")


def _write_jsonl(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


GOOD = json.dumps({"problem": "1+1?", "answer": "2", "level": 1, "subject": "Algebra"})


def test_bad_json_line_names_file_and_line(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "broken.jsonl", [GOOD, GOOD, '{"problem": "x", "answer"', GOOD])
    with pytest.raises(ValueError) as info:
        load_problems("math500", path=path)
    assert "broken.jsonl" in str(info.value)
    assert "line 3" in str(info.value)


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({"answer": "2"}, "problem"),
        ({"problem": "1+1?"}, "answer"),
        ({"problem": "", "answer": "1"}, "problem"),
        ({"problem": "1+1?", "answer": " "}, "answer"),
        ({"problem": "1+1?", "answer": None}, "answer"),
    ],
)
def test_missing_field_names_file_line_and_field(tmp_path: Path, row: dict[str, str], field: str) -> None:
    path = _write_jsonl(tmp_path / "rows.jsonl", [GOOD, "", json.dumps(row)])
    with pytest.raises(ValueError) as info:
        load_problems("aime24", path=path)
    message = str(info.value)
    assert "rows.jsonl" in message and "line 3" in message and field in message


def test_non_utf8_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "latin.jsonl"
    bad = '{"problem": "caf\u00e9", "answer": "1"}'.encode("latin-1")
    path.write_bytes(GOOD.encode() + b"\n" + bad + b"\n")
    with pytest.raises(ValueError, match="latin.jsonl: line 2: invalid JSON"):
        load_problems("math500", path=str(path))


def test_non_object_row_is_rejected(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "list.jsonl", ["[1, 2]"])
    with pytest.raises(ValueError, match="list.jsonl: line 1"):
        load_problems("amc23", path=path)


def test_blank_lines_skipped_and_question_alias(tmp_path: Path) -> None:
    rows = [GOOD, "", json.dumps({"id": 7, "question": "Q?", "answer": 3.0})]
    path = _write_jsonl(tmp_path / "mixed.jsonl", rows)
    assert load_problems("amc23", path=path) == [
        Problem(id="amc23-0", problem="1+1?", answer="2", level=1, subject="Algebra", source="amc23"),
        Problem(id="amc23-7", problem="Q?", answer="3", source="amc23"),
    ]


def test_missing_file_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="dataset.path"):
        load_problems("math500", path=str(tmp_path / "nope.jsonl"))


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ValueError) as info:
        load_problems("gsm8k")
    assert "['aime24', 'amc23', 'embedded', 'math500']" in str(info.value)


def test_embedded_without_path_generates_default_set() -> None:
    problems = load_problems("embedded")
    assert len(problems) == 20
    assert problems[0].id == "embedded-1-0"
    with pytest.raises(ValueError, match="hf_id"):
        load_problems("embedded", hf_id="some/id")


def test_hub_failure_names_the_id_and_suggests_path(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    def fail(*args: object, **kwargs: object) -> None:
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", fail)
    with pytest.raises(DatasetLoadError) as info:
        load_problems("amc23")
    message = str(info.value)
    assert "'zwhe99/amc23'" in message and "'test'" in message and "dataset.path=" in message


def test_hub_rows_are_normalized(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    seen: list[tuple[str, str]] = []

    def fake(hf_id: str, split: str) -> list[dict[str, object]]:
        seen.append((hf_id, split))
        return [{"problem": "P", "answer": "5", "level": "Level 4", "subject": "Geometry", "unique_id": "x"}]

    monkeypatch.setattr(datasets, "load_dataset", fake)
    assert load_problems("math500") == [
        Problem(id="math500-0", problem="P", answer="5", level=4, subject="Geometry", source="math500")
    ]
    load_problems("aime24", hf_id="me/aime", split="dev")
    assert seen == [("HuggingFaceH4/MATH-500", "test"), ("me/aime", "dev")]


def test_offline_hub_fails_fast_with_clear_error() -> None:
    code = (
        "from eval import load_problems\n"
        "try:\n    load_problems('aime24')\n"
        "except RuntimeError as e:\n    print(type(e).__name__, e)\n"
    )
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    expected = "DatasetLoadError could not load Hugging Face dataset 'HuggingFaceH4/aime_2024'"
    assert done.stdout.startswith(expected)
    assert "dataset.path=" in done.stdout


PROBLEMS = [
    Problem(id=f"p{i}", problem=f"q{i}", answer=str(i), level=(i % 3) + 1 if i != 5 else None)
    for i in range(8)
]


def _ids(problems: list[Problem]) -> list[str]:
    return [p.id for p in problems]


def test_select_first_k_and_no_filters() -> None:
    assert _ids(select_subset(PROBLEMS, first_k=3)) == ["p0", "p1", "p2"]
    assert _ids(select_subset(PROBLEMS)) == [f"p{i}" for i in range(8)]
    assert _ids(select_subset(PROBLEMS, first_k=50)) == [f"p{i}" for i in range(8)]


def test_select_levels_then_first_k() -> None:
    # levels: p0=1 p1=2 p2=3 p3=1 p4=2 p5=None p6=1 p7=2
    assert _ids(select_subset(PROBLEMS, levels=[1])) == ["p0", "p3", "p6"]
    assert _ids(select_subset(PROBLEMS, levels=[2, 1], first_k=3)) == ["p0", "p1", "p3"]


def test_select_ids_keep_dataset_order_and_combine_with_levels() -> None:
    assert _ids(select_subset(PROBLEMS, ids=["p6", "p1", "p0"])) == ["p0", "p1", "p6"]
    assert _ids(select_subset(PROBLEMS, ids=["p6", "p1", "p0"], levels=[1])) == ["p0", "p6"]


def test_select_unknown_ids_are_named() -> None:
    with pytest.raises(ValueError) as info:
        select_subset(PROBLEMS, ids=["p1", "zz", "yy"])
    assert "['zz', 'yy']" in str(info.value)


def test_select_random_k_is_seeded_and_order_stable() -> None:
    first = select_subset(PROBLEMS, random_k=4, seed=3)
    assert first == select_subset(PROBLEMS, random_k=4, seed=3)
    positions = [PROBLEMS.index(p) for p in first]
    assert positions == sorted(positions) and len(set(positions)) == 4
    draws = {tuple(_ids(select_subset(PROBLEMS, random_k=4, seed=s))) for s in range(10)}
    assert len(draws) > 1
    assert len(select_subset(PROBLEMS, random_k=20)) == 8


def test_select_random_k_after_level_filter() -> None:
    chosen = select_subset(PROBLEMS, levels=[2], random_k=2, seed=1)
    assert len(chosen) == 2 and all(p.level == 2 for p in chosen)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"first_k": -1}, "first_k"),
        ({"random_k": 1.5}, "random_k"),
        ({"first_k": 1, "random_k": 1}, "first_k"),
        ({"levels": ["1"]}, "levels"),
    ],
)
def test_select_rejects_bad_arguments(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        select_subset(PROBLEMS, **kwargs)  # type: ignore[arg-type]


def test_problem_is_frozen() -> None:
    problem = Problem(id="a", problem="b", answer="c")
    with pytest.raises(AttributeError):
        problem.answer = "d"  # type: ignore[misc]
