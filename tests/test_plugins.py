"""A user's own speculation rule and search algorithm, from their own module, with no entry in
tts (`tts.config.plugins`): named on the command line as `module:attribute`, or by a plain
word an installed package declares as an entry point; in `tts bench` on the fake backend and
in a Hydra joblib job. docs/design.md's two examples are those modules, as written."""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.test_hydra_launchers import FAKE, sweep
from tests.test_replay import trees

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"
RUN = ["--config-name=config", "generator=fake", "verifier=fake", "logger=none", "dataset.first_k=2",
       "search.n=4", "search.beam_width=2", "search.max_iterations=5"]
RULE, SEARCH = "docs_first_child:FirstChild", "docs_weakest_step:WeakestStep"  # the modules `own` writes
SPECULATE = ["optim.engine=flash", "optim.speculative=true"]  # the barrier with speculation: variant "S"


def docs_block(heading: str) -> str:
    """The code block of docs/design.md's section `heading`."""
    section = DESIGN.read_text().split(heading, 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture
def own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The folder `tts` runs in, holding docs/design.md's rule and search algorithm as modules
    of their own; `sys.path` and `sys.modules` are as they were after the test."""
    (tmp_path / "docs_first_child.py").write_text(docs_block("### How to add a speculation rule"))
    (tmp_path / "docs_weakest_step.py").write_text(docs_block("### How to add a search algorithm"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    importlib.invalidate_caches()
    yield tmp_path
    for name in set(sys.modules) - before:
        if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


def tts_bench(name: str | None, *overrides: str) -> Path:
    """`tts bench` on the fake backend, in this process; its run folder (`name`, else the one
    it names itself, the only one under results/)."""
    result = CliRunner().invoke(app, ["bench", *RUN, *overrides, *([f"bench.run_name={name}"] if name else [])])
    assert result.exit_code == 0, result.output
    return Path("results", name).resolve() if name else next(Path("results").iterdir()).resolve()


def refused(*overrides: str) -> str:
    """The one line `tts bench` answers a user's mistake with (exit code 2, no traceback)."""
    result = CliRunner().invoke(app, ["bench", *RUN, *overrides])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    return " ".join(result.output.split())


def test_the_docs_rule_runs_from_its_own_module_named_on_the_command_line(own):
    """docs/design.md's rule, a module of its own named `optim.spec_rule=module:attribute`:
    child 0 of each ended step speculates and is adopted whole by its kept child, so the tree
    is the baseline's with fewer generator steps; the variant is labelled by the rule's name."""
    assert len(docs_block("### How to add a speculation rule").splitlines()) <= 25  # a rule of a few lines
    for algo in ("beam", "dvts"):
        base = tts_bench(f"base_{algo}", f"search.algorithm={algo}", "dataset.first_k=4")
        mine = tts_bench(f"mine_{algo}", f"search.algorithm={algo}", *SPECULATE, f"optim.spec_rule={RULE}",
                         "dataset.first_k=4")
        assert {p: c for (_, p), c in trees(mine).items()} == {p: c for (_, p), c in trees(base).items()}, algo
        steps = json.loads((mine / "step_logs.json").read_text())
        assert list(steps) == ["S_first_child"]  # the class's `name`, not its import path
        spec = steps["S_first_child"]["speculation"]
        assert spec["spec_steps_whole"] > 0 and spec["spec_used"] > 0, algo
        assert spec["spec_generated"] == spec["spec_used"] + spec["spec_wasted"], algo
        base_steps = json.loads((base / "step_logs.json").read_text())["baseline"]["generator"]["steps"]
        assert steps["S_first_child"]["generator"]["steps"] < base_steps, algo


def test_the_docs_search_algorithm_runs_from_its_own_module_named_on_the_command_line(own):
    """docs/design.md's search algorithm, named `search.algorithm=module:attribute`, grows the
    tree beam search grows with the `min` aggregation (not the `last` one's), and the run
    folder it names itself carries its plain name."""
    assert len(docs_block("### How to add a search algorithm").splitlines()) <= 25
    mine = tts_bench(None, f"search.algorithm={SEARCH}")
    assert mine.name.endswith("-weakest_step-n4-baseline")
    assert trees(mine) == trees(tts_bench("min", "search.aggregation=min"))
    assert trees(mine) != trees(tts_bench("last", "search.aggregation=last"))  # the test can tell


def test_an_installed_packages_entry_points_name_a_rule_and_an_algorithm_by_a_plain_word(own):
    """A package whose metadata declares the rule in `tts.spec_rules` and the algorithm in
    `tts.search_algorithms` (a dist-info folder on sys.path, as an installed one is): plain
    words name them, to the trees their `module:attribute` names grow; an unknown word lists
    the installed ones among the valid choices."""
    info = own / "my_tts_code-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-tts-code\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[tts.spec_rules]\nfirst_child = {RULE}\n\n"
                                           f"[tts.search_algorithms]\nweakest_step = {SEARCH}\n")
    sys.path.insert(0, str(own))  # as site-packages is
    words = tts_bench("words", "search.algorithm=weakest_step", *SPECULATE, "optim.spec_rule=first_child")
    paths = tts_bench("paths", f"search.algorithm={SEARCH}", *SPECULATE, f"optim.spec_rule={RULE}")
    assert trees(words) == trees(paths) and {v for v, _ in trees(words)} == {"S_first_child"}
    assert "varying_granularity, weakest_step, or module:attribute" in refused("search.algorithm=weakest")


@pytest.mark.parametrize("overrides, needle", [
    (["optim.spec_rule=first_kid", *SPECULATE],
     "optim.spec_rule: unknown 'first_kid' (not a built-in, nor an installed package's entry point in "
     "tts.spec_rules); valid choices: auto, none, runon, branches, scoped, or module:attribute"),
    ([f"search.algorithm=nowhere:{SEARCH.partition(':')[2]}"],
     "search.algorithm: 'nowhere:WeakestStep' does not import (ModuleNotFoundError: No module named 'nowhere'"),
    (["search.algorithm=docs_weakest_step:WeakestSteps"],
     "search.algorithm: 'docs_weakest_step:WeakestSteps' does not import (AttributeError:"),
    ([f"search.algorithm={RULE}"], f"search.algorithm: '{RULE}' is <class 'docs_first_child.FirstChild'>, "
                                   "not a SearchPolicy subclass; valid choices: beam, dvts"),
    ([f"optim.spec_rule={SEARCH}", *SPECULATE], "not a StartRule subclass; valid choices: auto, none, runon"),
    (["optim.spec_rule=tts.engine.speculation.rule:StartRule", *SPECULATE],
     "optim.spec_rule: 'tts.engine.speculation.rule:StartRule' is abstract: it does not define candidates"),
    (["optim.spec_rule=clash:RunOnAgain", *SPECULATE],
     "optim.spec_rule: 'clash:RunOnAgain' is named 'runon', as the built-in RunOn is; give the class another"),
    (["optim=decoupled", f"optim.spec_rule={RULE}"],
     f"optim.spec_rule: '{RULE}' runs on the barrier schedule, not the decoupled one"),
])
def test_a_rule_or_algorithm_that_is_not_there_is_one_line_naming_the_field(own, overrides, needle):
    """Each way a name can fail (unknown, no module, no attribute, not a rule or an
    algorithm, abstract, a built-in's name, a schedule that cannot drive it) is one line
    naming the field, what was tried and the valid choices."""
    (own / "clash.py").write_text("from tts.engine.speculation.runon import RunOn\n\n\n"
                                  "class RunOnAgain(RunOn):\n    name = 'runon'\n")
    assert needle in refused(*overrides)


def test_a_joblib_job_imports_the_users_modules_from_the_folder_the_sweep_started_in(own):
    """`tts bench -m hydra/launcher=joblib`: each job, in a worker process whose working
    folder Hydra moved to its job folder (`hydra.job.chdir`), imports the user's rule and
    algorithm by the same `module:attribute` from the folder the sweep started in; the
    algorithm's job grows beam search's `min` tree, and the variant is labelled plainly."""
    jobs, tts_pid = sweep(own, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.job.chdir=true",
                          f"search.algorithm={SEARCH},beam", "search.aggregation=min", "search.n=4",
                          "search.beam_width=2", *SPECULATE, f"optim.spec_rule={RULE}", *FAKE)
    assert [j.name for j in jobs] == ["0", "1"]
    assert all(json.loads((j / "job.json").read_text())["pid"] != tts_pid for j in jobs)  # in the workers
    mine, beam = (trees(j) for j in jobs)
    assert mine == beam and {v for v, _ in mine} == {"S_first_child"}
    spec = json.loads((jobs[0] / "step_logs.json").read_text())["S_first_child"]["speculation"]
    assert spec["spec_generated"] > 0
