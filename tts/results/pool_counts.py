"""A variant's block-pool counts in its summary: what each model's block pool evicted,
recomputed after an eviction (thrash) and preempted, and the thrash as a share of the
prefill the model computed, from the run's per-model block counts (`KV_BLOCKS`:
`tts.backends.vllm.thrash.ThrashCounter` on vLLM, `tts.backends.prefix_cache.CacheCounter`
on the fake and replay backends); and the tokens each model's steps computed beyond the
work its records count (`add_recomputed`): a preempted request's context prefilled again.
"""

from __future__ import annotations

from tts.metrics.cost_model import COST, CostSums, work_of

# rows of the ratio table (`tts.results.ratios.RATIO_METRICS`): key, label, higher is better
POOL_ROWS = [
    ("gen_thrash_blocks", "generator KV blocks recomputed after eviction (thrash)", False),
    ("gen_thrash_share", "generator thrash tokens / prefill tokens computed", False),
    ("gen_evictions", "generator KV blocks evicted", False),
    ("gen_preemptions", "generator requests preempted (KV ran out mid-decode)", False),
    ("gen_recomputed_tokens", "generator tokens computed again (a preempted request's context, less its cache)", False),
    ("ver_thrash_blocks", "verifier KV blocks recomputed after eviction (thrash)", False),
    ("ver_thrash_share", "verifier thrash tokens / prefill tokens computed", False),
    ("ver_evictions", "verifier KV blocks evicted", False),
]


def add_pool_counts(summary: dict, counts_by_pool: dict[str, dict[str, int]]) -> None:
    """Per pool (generator, verifier): its thrash blocks, evictions and preemptions, and its
    thrash tokens over the prompt tokens it computed (prompt less what the prefix cache
    served, `total_<gen|ver>_prompt_tokens` less `..._cached_tokens`: a share of 0.1 is a
    tenth of its prefill spent again on KV it had held). Counts an older run did not record
    are left out."""
    for pool, counts in counts_by_pool.items():
        p = pool[:3]
        for key in ("thrash_blocks", "evictions", "preemptions"):
            if key in counts:
                summary[f"{p}_{key}"] = counts[key]
        computed = summary.get(f"total_{p}_prompt_tokens", 0) - summary.get(f"total_{p}_cached_tokens", 0)
        if "thrash_tokens" in counts and computed > 0:
            summary[f"{p}_thrash_share"] = counts["thrash_tokens"] / computed


def add_recomputed(summary: dict, metrics: list[dict]) -> None:
    """Per model, the tokens its steps computed (decode sequences and prefill tokens, from
    its step log's sums, less overlap's late tokens) beyond the work its records count
    (`work_of`: tokens generated, prompt tokens less what the prefix cache served): what a
    preempted request's context cost to prefill again, less what the cache still held of
    it, and any prompt prefilled twice. 0 where nothing was; left out without logged steps."""
    work = work_of(metrics)
    for model, done in (("generator", work.decode + work.prefill), ("verifier", work.ver_prefill)):
        log = summary.get(model) or {}
        sums = CostSums.from_dict(log.get(COST) or {})
        if not sums.steps:  # no steps logged (a fake verifier's calls have none)
            continue
        _, decoded, prefilled = sums.xtx[0]
        summary[f"{model[:3]}_recomputed_tokens"] = round(decoded + prefilled - log.get("late_tokens", 0) - done)
