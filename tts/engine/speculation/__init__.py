"""Speculation: work generated before a selection asks for it, one mechanism under named
start rules.

- `steps.py`: the mechanism (speculative steps in their problems' tables, their start,
  preemption, adoption and drop; run-on's submission), counted once for every rule;
- `memory.py`: the one memory rule (when speculation is preempted, and pauses);
- `rule.py`: the `StartRule` interface a discipline drives (fill, preempt, take a
  generator output, react to memory, after selection);
- `runon.py`, `branches.py` (the barrier's), `scoped.py` (the decoupled schedule's): the
  rules, by name in `registry.py` (`optim.spec_rule`);
- `policy.py`: speculation's priority bins and run-on's hand-down; `guard.py`: whether
  the decoupled schedule's speculation pays.
"""
