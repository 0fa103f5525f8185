"""Search algorithms as policies over one engine, chosen by name (`search.algorithm`).

The registry is `POLICIES` (the built-ins, by the names `Algorithm` lists); a user's own
algorithm is named by an installed package's entry point of `GROUP` or as
`module:attribute` (`tts.config.plugins`). What the rest of tts asks of an algorithm
(whether it is a tree search) it asks here, of the class the value names."""

from __future__ import annotations

from tts.config.enums import Algorithm
from tts.config.plugins import Named, load_class
from tts.config.schema import SearchConfig
from tts.search.base import ProblemSearch, SearchPolicy, aggregate
from tts.search.beam import BeamSearch
from tts.search.dvts import DVTS
from tts.search.dynamic_branching import DynamicBranching
from tts.search.sampling import BestOfN, SelfConsistency
from tts.search.varying_granularity import VaryingGranularity

POLICIES: dict[str, type[SearchPolicy]] = {
    Algorithm.beam.value: BeamSearch,
    Algorithm.dvts.value: DVTS,
    Algorithm.best_of_n.value: BestOfN,
    Algorithm.self_consistency.value: SelfConsistency,
    Algorithm.dynamic_branching.value: DynamicBranching,
    Algorithm.varying_granularity.value: VaryingGranularity,
}
GROUP = "tts.search_algorithms"  # the entry-point group of installed packages' algorithms


def policy_named(value: str) -> Named:
    """The policy class `search.algorithm` names and its plain name (a run's labels); a
    ValueError of one line names an unknown or unimportable one, with the valid choices."""
    return load_class("search.algorithm", value, POLICIES, GROUP, SearchPolicy)


def is_tree(value: str) -> bool:
    """The algorithm `value` names is a tree search (`SearchPolicy.tree`)."""
    return policy_named(value).cls.tree


def check_search(cfg: SearchConfig) -> None:
    """What the algorithm asks of the other search options (a tree search: `search.n` a
    multiple of `search.beam_width`); a ValueError names the field."""
    if is_tree(cfg.algorithm) and cfg.n % cfg.beam_width:
        raise ValueError(f"search.n: n={cfg.n} must be divisible by search.beam_width={cfg.beam_width}")


def make_policy(cfg: SearchConfig, step_max_tokens: int, max_total_tokens: int) -> SearchPolicy:
    """The policy named by `cfg.algorithm`, over options it can take (`check_search`)."""
    check_search(cfg)
    return policy_named(cfg.algorithm).cls(cfg, step_max_tokens, max_total_tokens)


__all__ = ["GROUP", "POLICIES", "ProblemSearch", "SearchPolicy", "aggregate", "check_search", "is_tree",
           "make_policy", "policy_named"]
