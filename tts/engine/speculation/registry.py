"""The start rules by name (`optim.spec_rule`): the registry a discipline builds its
speculation from. A new rule of tts is its own file and one entry here (or `register_rule`);
a user's own is named by an installed package's entry point of `GROUP`, or as
`module:attribute` (`tts.config.plugins`), with no entry here."""

from __future__ import annotations

from collections.abc import Callable

from tts.config.plugins import Named, load_class
from tts.engine.inflight import ScheduleParts
from tts.engine.problem import Problem
from tts.engine.requests import Request
from tts.engine.speculation.branches import Branches
from tts.engine.speculation.rule import NoSpeculation, StartRule
from tts.engine.speculation.runon import RunOn
from tts.engine.speculation.scoped import Scoped
from tts.engine.speculation.steps import SpeculativeSteps
from tts.search.tree import Beam

RULES: dict[str, type[StartRule]] = {cls.name: cls for cls in (NoSpeculation, RunOn, Branches, Scoped)}
AUTO = "auto"  # the discipline's own: run-on on the barrier, scoped on the decoupled schedule
DEFAULTS = {"barrier": RunOn.name, "decoupled": Scoped.name}
GROUP = "tts.spec_rules"  # the entry-point group of installed packages' rules


def register_rule(cls: type[StartRule]) -> type[StartRule]:
    """Add a start rule under its `name` (usable as a class decorator); a name already
    taken by another rule is an error."""
    if RULES.get(cls.name, cls) is not cls:
        raise ValueError(f"spec_rule: {cls.name!r} is taken by {RULES[cls.name].__name__}")
    RULES[cls.name] = cls
    return cls


def rule_named(value: str) -> Named:
    """The rule class `optim.spec_rule` names (not `auto`) and its plain name (a variant's
    label); a ValueError of one line names an unknown or unimportable one, with the valid
    choices."""
    return load_class("optim.spec_rule", value, RULES, GROUP, StartRule, also=(AUTO,))


def rule_name(parts: ScheduleParts, discipline: str) -> str:
    """The rule the options ask of `discipline`: `spec_rule`, `auto` being the
    discipline's own; on the barrier, none without `speculative`."""
    opts = parts.opts
    if discipline == "barrier" and not opts.speculative:
        return NoSpeculation.name
    return DEFAULTS[discipline] if opts.spec_rule == AUTO else opts.spec_rule


def make_rule(parts: ScheduleParts, requests_for: Callable[[Problem, list[Beam], int], list[Request]],
              discipline: str) -> StartRule:
    """The start rule the options name for `discipline` ("barrier" or "decoupled"), over one
    mechanism (`SpeculativeSteps`: speculative tokens per beam `spec_max_tokens`, 0 meaning
    one step's limit). `requests_for(problem, beams, iteration)` makes a speculative step's
    request. A ValueError names an unknown rule, or one the discipline cannot drive, with
    the valid choices."""
    value = rule_name(parts, discipline)
    cls = rule_named(value).cls
    if discipline not in cls.disciplines:
        valid = [n for n, c in RULES.items() if discipline in c.disciplines]
        raise ValueError(f"optim.spec_rule: {value!r} runs on the {' or '.join(cls.disciplines)} schedule, "
                         f"not the {discipline} one; valid choices there: {AUTO}, {', '.join(valid)}")
    opts = parts.opts
    spec_max = max(0, opts.spec_max_tokens) or parts.policy.step_max_tokens
    steps = SpeculativeSteps(parts.runner, parts.cut, requests_for, spec_max, opts.kv_spec_limit)
    return cls(steps, parts)
