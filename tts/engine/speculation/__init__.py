"""Speculation: work generated before a selection asks for it, one mechanism under named
start rules.

- `rule.py`: the `StartRule` a rule author writes (candidates, and three optional
  reactions: a step ended, requests preempted, a problem selected);
- `steps.py`: the mechanism (speculative steps in their problems' tables, their start,
  preemption, adoption and drop; run-on's requests), counted once for every rule;
- `driver.py`: what a discipline holds of it (`Speculation`: the start in free slots,
  preemption, the memory rule, the cost guard, the count); `iteration.py`, the barrier's
  side of an iteration (run-on mode, pruning, the tokens a beam holds after generation);
- `memory.py`: the one memory rule (when speculation is preempted, and pauses);
- `runon.py`, `branches.py` (the barrier's), `scoped.py` (the decoupled schedule's): the
  rules, by name in `registry.py` (`optim.spec_rule`);
- `policy.py`: speculation's priority bins and run-on's hand-down; `guard.py`: whether
  the decoupled schedule's speculation pays.
"""
