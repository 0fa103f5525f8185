"""The problem set a run config selects (its dataset and subset), for every verb."""

from __future__ import annotations

import os
from pathlib import Path

from tts.config.schema import Config


def load_problems_for(cfg: Config) -> list:
    """The configured dataset and subset, as `eval.Problem` records."""
    from eval import generate_embedded, load_problems, select_subset

    d = cfg.dataset
    name = d.name.value
    if name == "embedded":
        problems = generate_embedded(num_problems=d.embedded_size, seed=d.seed)
    else:
        path = d.path
        data_dir = os.environ.get("TTS_DATA_DIR")
        if path is None and data_dir and Path(data_dir, f"{name}.jsonl").exists():
            path = str(Path(data_dir, f"{name}.jsonl"))
        problems = load_problems(name, path=path, hf_id=d.hf_id, split=d.split)
    return select_subset(problems, first_k=d.first_k, levels=d.levels, ids=d.ids,
                         random_k=d.random_k, seed=d.seed)
