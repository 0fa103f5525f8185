"""The speculation package's registry of start rules (`tts.engine.speculation.registry`):
a rule is its own file and a registry entry (docs/design.md's, a user's own module named on
the command line, runs in tests/test_plugins.py)."""

import re
from pathlib import Path

import pytest

from tts.backends.fake import FakeGenerator, FakeVerifier, answering_script
from tts.config.enums import Algorithm
from tts.config.schema import SearchConfig
from tts.engine.engine import Engine, EngineOptions, ProblemInput
from tts.engine.speculation.registry import RULES, register_rule
from tts.search import make_policy

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"


def test_a_rule_registered_under_a_taken_name_is_refused():
    """`register_rule` adds a rule under its `name`; another class under a name already taken
    is an error naming the rule that has it, and the registry keeps that one."""
    runon = RULES["runon"]
    with pytest.raises(ValueError, match="spec_rule: 'runon' is taken by RunOn"):
        register_rule(type("Other", (runon,), {}))
    assert RULES["runon"] is runon and register_rule(runon) is runon  # the same class again: no change


def test_speculation_pruning_works_for_any_rule(tmp_path, monkeypatch):
    """Speculation pruning (`optim.spec_prune`) is the mechanism's, not a rule's: the docs'
    rule, with no code for it, has the speculation of beams selection will prune stopped
    (running steps stop, waiting ones lose their claim), and keeps the baseline's tree."""
    section = DESIGN.read_text().split("### How to add a speculation rule", 1)[1]
    (tmp_path / "docs_first_child.py").write_text(re.search(r"```python\n(.*?)```", section, re.S).group(1))
    monkeypatch.syspath_prepend(str(tmp_path))
    rule = "docs_first_child:FirstChild"  # a user's module, named as on the command line
    cfg = SearchConfig(algorithm=Algorithm.beam, n=8, beam_width=2, max_iterations=5)
    problems = [ProblemInput(p, f"problem {p}") for p in ("a", "b")]

    def go(**opts):
        eng = Engine(FakeGenerator(answering_script, batch_cap=64), FakeVerifier(),
                     lambda: make_policy(cfg, 30, 300), "sys", EngineOptions(**opts))
        return list(eng.run(problems))

    base = go()
    plain = go(speculative=True, spec_rule=rule)
    pruned = go(speculative=True, spec_rule=rule, spec_prune=True)
    texts = [{o.problem.id: sorted(b.text for b in o.candidates) for o in outs} for outs in (base, plain, pruned)]
    assert texts[2] == texts[1] == texts[0]
    assert sum(o.metrics.spec_pruned_beams for o in pruned) > 0
    assert sum(o.metrics.spec_pruned_requests for o in pruned) > 0
    assert sum(o.metrics.spec_generated for o in pruned) < sum(o.metrics.spec_generated for o in plain)


class CheckedBranches(RULES["branches"]):
    """Branches whose kept queue of candidates is checked, at every call, against the scan it
    replaced: every finished parent's children, speculable now, in priority order, as far
    as the caller reads (the queue is read lazily)."""

    name = "checked_branches"
    calls = preempted_nodes = scanned = read = 0

    def step_done(self, request):
        before = self._order
        super().step_done(request)
        if self._order > before:  # it branches
            self._all = [*getattr(self, "_all", ()), request]

    def selected(self, problem, parents):
        self._all = [r for r in getattr(self, "_all", ()) if r.problem is not problem]
        super().selected(problem, parents)

    def candidates(self, problems):
        scan = [(r, k) for r in getattr(self, "_all", ()) if r.beam.uid not in self.steps.pruned
                for k in range(r.spec_priority) if self.steps.speculable(r.problem, r.beam, k)]
        scan = [(r.problem, r.beam, k) for r, k in sorted(scan, key=lambda c: (-c[0].spec_priority, c[1]))]
        type(self).calls += 1
        type(self).scanned += len(scan)
        read = 0
        for c in super().candidates(problems):  # lazy: the caller may stop reading
            assert c == scan[read]
            read += 1
            type(self).read += 1
            yield c
        assert read == len(scan)  # read to the end: nothing was left out

    def preempted(self, requests):
        super().preempted(requests)
        type(self).preempted_nodes += len(requests)


@pytest.mark.parametrize("limit", [None, 0.3])
def test_the_branches_queue_is_the_scan_it_replaced(limit):
    """The branches rule keeps its candidates as the iteration goes (finished, stalled and
    pruned branches leave for good, running ones until preempted) instead of scanning every
    finished step's children at every generator step: the same candidates in the same order
    at every call, with speculation preempted for memory (a low `kv_spec_limit`) and
    without, read only as far as the free slots go (fewer than a scan's); and the tree
    stays the baseline's."""
    register_rule(CheckedBranches)
    try:
        cfg = SearchConfig(algorithm=Algorithm.beam, n=8, beam_width=2, max_iterations=5)

        def go(**opts):
            eng = Engine(FakeGenerator(answering_script, batch_cap=12, cache_blocks=64), FakeVerifier(),
                         lambda: make_policy(cfg, 30, 300), "sys", EngineOptions(**opts))
            return {o.problem.id: sorted(b.text for b in o.candidates)
                    for o in eng.run([ProblemInput(p, f"problem {p}") for p in ("a", "b", "c")])}

        CheckedBranches.calls = CheckedBranches.preempted_nodes = CheckedBranches.scanned = CheckedBranches.read = 0
        memory = {} if limit is None else {"kv_spec_limit": limit}
        mine = go(speculative=True, spec_rule="checked_branches", spec_prune=True, **memory)
        assert CheckedBranches.calls > 0
        assert CheckedBranches.read < CheckedBranches.scanned  # the full scan is gone
        assert limit is None or CheckedBranches.preempted_nodes > 0  # branches went back to the queue
        assert mine == go()
    finally:
        RULES.pop("checked_branches", None)
