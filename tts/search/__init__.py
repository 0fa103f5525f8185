"""Search algorithms as policies over one engine, chosen by name."""

from __future__ import annotations

from tts.config.enums import Algorithm
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


def make_policy(cfg: SearchConfig, step_max_tokens: int, max_total_tokens: int) -> SearchPolicy:
    """The policy named by `cfg.algorithm`; an unknown name lists the valid ones."""
    name = getattr(cfg.algorithm, "value", cfg.algorithm)
    if name not in POLICIES:
        raise ValueError(f"search.algorithm: unknown {name!r}; valid choices: {', '.join(POLICIES)}")
    return POLICIES[name](cfg, step_max_tokens, max_total_tokens)


__all__ = ["POLICIES", "ProblemSearch", "SearchPolicy", "aggregate", "make_policy"]
