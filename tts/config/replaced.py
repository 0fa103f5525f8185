"""Config keys that were replaced: a config that still sets one is told what replaces it
(`compose.explain`), and a run's saved config is read in the schema's terms
(`upgrade_saved`, for `RunStore.saved_config`)."""

from __future__ import annotations

REPLACED_OPTIM_KEYS = {"spec_branches": "optim.spec_rule (spec_branches=true is spec_rule=branches)"}


def upgrade_saved(saved: dict) -> dict:
    """A run's saved config in the schema's terms: a config saved before `optim.spec_rule`
    holds `optim.spec_branches` (true: spec_rule=branches). Kept for the saved runs: the
    study runs under docs/runs/ (aa_order, accuracy_power, sharded_joblib, sharded_ray)
    were saved so, and `tts report`, `tts eval RUN` and `tts replay` read them."""
    optim = saved.get("optim")
    if isinstance(optim, dict) and "spec_branches" in optim:
        if optim.pop("spec_branches"):
            optim["spec_rule"] = "branches"
    return saved
