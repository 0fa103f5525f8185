"""A run's generation and verifier work by what it was for, from the engine's events (the
collector's, `tts.metrics.collector`): generation requests and tokens by the request's
kind (`RequestKind`: eager, fresh, spec), verifier calls by their purpose (`Purpose`), with
the beams each call scored and the scores it computed; and the decoupled schedule's
step-log summary built on them."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tts.metrics.measures import UTIL_BINS, StepLog


@dataclass
class WorkLog:
    """Generation by request kind, verifier calls by purpose (module docstring)."""

    requests: Counter = field(default_factory=Counter)
    tokens: Counter = field(default_factory=Counter)
    calls: Counter = field(default_factory=Counter)
    items: defaultdict[str, list[int]] = field(default_factory=lambda: defaultdict(list))  # beams per call
    computed: Counter = field(default_factory=Counter)  # scores computed (cache hits excluded)


@dataclass
class DecoupledLog:
    """What only the decoupled schedule knows: its LLM rounds and problems in flight."""

    llm_rounds: int = 0
    problems_started: int = 0
    max_live: int = 0

    def summary(self, work: WorkLog, gen_log: StepLog, kinds: Sequence[str], fill: tuple[str, Mapping],
                prm_cap: int, prm_purpose: str) -> dict:
        """The step-log summary: generation by `kinds`, the PRM queue's calls (`prm_purpose`),
        the fill policy's (name, decisions)."""
        tokens, requests = {k: work.tokens[k] for k in kinds}, {k: work.requests[k] for k in kinds}
        total_tok, total_req = sum(tokens.values()), sum(requests.values())
        eager, spec = tokens.get("eager", 0), tokens.get("spec", 0)
        items = work.items[prm_purpose]
        util = [min(1.0, n / prm_cap) for n in items] if prm_cap else []
        hist = [0] * UTIL_BINS
        for u in util:
            hist[min(UTIL_BINS - 1, int(u * UTIL_BINS))] += 1
        g = gen_log.summary()
        return {
            "policy": fill[0],
            "fill_decisions": dict(fill[1]),
            # the results summary reads `batch_util_mean` from every step log: the LLM's
            "batch_util_mean": g["batch_util_mean"],
            "llm_batch_util_mean": g["batch_util_mean"],
            "llm_batch_util_hist": g["batch_util_hist"],
            "llm_rounds": self.llm_rounds,
            "llm_steps": gen_log.steps,
            "prm_calls": work.calls[prm_purpose],
            "prm_items_mean": statistics.fmean(items) if items else 0.0,
            "prm_batch_cap": prm_cap,
            "prm_batch_util_mean": statistics.fmean(util) if util else None,
            "prm_batch_util_hist": hist if util else None,
            "prm_scores_computed": work.computed[prm_purpose],
            "tokens": tokens,
            "requests": requests,
            "tokens_per_request_mean": total_tok / total_req if total_req else 0.0,
            "tokens_per_request_by_kind": {k: (tokens[k] / n if n else 0.0) for k, n in requests.items()},
            "scheduled_tokens_per_request_hist": g["tokens_per_request_hist"],
            "eager_tokens": eager,
            "spec_tokens": spec,
            "eager_share": eager / (eager + spec) if eager + spec else 0.0,
            "spec_share": spec / (eager + spec) if eager + spec else 0.0,
            "kv_usage_mean": g["kv_usage_mean"],
            "kv_usage_max": g["kv_usage_max"],
            "problems_started": self.problems_started,
            "max_live_problems": self.max_live,
        }
