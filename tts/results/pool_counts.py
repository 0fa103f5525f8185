"""A variant's block-pool counts in its summary: what each model's block pool evicted,
recomputed after an eviction (thrash) and preempted, and the thrash as a share of the
prefill the model computed, from the run's per-model block counts (`KV_BLOCKS`:
`tts.backends.vllm.thrash.ThrashCounter` on vLLM, `tts.backends.prefix_cache.CacheCounter`
on the fake and replay backends).
"""

from __future__ import annotations

# rows of the ratio table (`tts.results.ratios.RATIO_METRICS`): key, label, higher is better
POOL_ROWS = [
    ("gen_thrash_blocks", "generator KV blocks recomputed after eviction (thrash)", False),
    ("gen_thrash_share", "generator thrash tokens / prefill tokens computed", False),
    ("gen_evictions", "generator KV blocks evicted", False),
    ("gen_preemptions", "generator requests preempted (KV ran out mid-decode)", False),
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
