"""Statistics of the decoupled schedule: run-level counters and their step-log summary
(per-problem metrics and the run's speculation are the collector's, `tts.metrics.collector`)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from tts.engine.decoupled_policy import FillPolicy
from tts.engine.requests import RequestKind as Kind
from tts.metrics.measures import UTIL_BINS, StepLog


@dataclass
class DecoupledStats:
    """Run-level counters of the decoupled schedule."""

    llm_rounds: int = 0
    llm_steps: int = 0
    prm_calls: int = 0
    prm_items: list[int] = field(default_factory=list)  # beams per PRM call
    prm_computed: int = 0  # step scores the verifier computed (cache hits excluded)
    tokens: dict[str, int] = field(default_factory=lambda: {k.value: 0 for k in Kind})
    requests: dict[str, int] = field(default_factory=lambda: {k.value: 0 for k in Kind})
    problems_started: int = 0
    max_live: int = 0

    def summary(self, gen_log: StepLog, fill: FillPolicy, prm_cap: int) -> dict:
        total_tok, total_req = sum(self.tokens.values()), sum(self.requests.values())
        filler = self.tokens[Kind.EAGER.value] + self.tokens[Kind.SPEC.value]
        util = [min(1.0, n / prm_cap) for n in self.prm_items] if prm_cap else []
        hist = [0] * UTIL_BINS
        for u in util:
            hist[min(UTIL_BINS - 1, int(u * UTIL_BINS))] += 1
        g = gen_log.summary()
        return {
            "policy": fill.name,
            "fill_decisions": dict(fill.decisions),
            # the results summary reads `batch_util_mean` from every step log: the LLM's
            "batch_util_mean": g["batch_util_mean"],
            "llm_batch_util_mean": g["batch_util_mean"],
            "llm_batch_util_hist": g["batch_util_hist"],
            "llm_rounds": self.llm_rounds,
            "llm_steps": self.llm_steps,
            "prm_calls": self.prm_calls,
            "prm_items_mean": statistics.fmean(self.prm_items) if self.prm_items else 0.0,
            "prm_batch_cap": prm_cap,
            "prm_batch_util_mean": statistics.fmean(util) if util else None,
            "prm_batch_util_hist": hist if util else None,
            "prm_scores_computed": self.prm_computed,
            "tokens": dict(self.tokens),
            "requests": dict(self.requests),
            "tokens_per_request_mean": total_tok / total_req if total_req else 0.0,
            "tokens_per_request_by_kind": {k: (self.tokens[k] / n if n else 0.0) for k, n in self.requests.items()},
            "scheduled_tokens_per_request_hist": g["tokens_per_request_hist"],
            "eager_tokens": self.tokens[Kind.EAGER.value],
            "spec_tokens": self.tokens[Kind.SPEC.value],
            "eager_share": self.tokens[Kind.EAGER.value] / filler if filler else 0.0,
            "spec_share": self.tokens[Kind.SPEC.value] / filler if filler else 0.0,
            "kv_usage_mean": g["kv_usage_mean"],
            "kv_usage_max": g["kv_usage_max"],
            "problems_started": self.problems_started,
            "max_live_problems": self.max_live,
        }
