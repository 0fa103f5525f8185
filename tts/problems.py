"""The problem set a run config selects (its dataset and subset), for every verb."""

from __future__ import annotations

import os
from pathlib import Path

from tts.config.schema import Config
from tts.config.shard import parse_shard


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
    selected = select_subset(problems, first_k=d.first_k, levels=d.levels, ids=d.ids,
                             random_k=d.random_k, seed=d.seed)
    return shard_of(selected, cfg.bench.shard)


def shard_of(problems: list, shard: str | None) -> list:
    """Shard I of K of the selected problems (`bench.shard`): every K-th, from the I-th, in
    their order. The K shards are disjoint and together the whole selection, whatever chose
    it (first_k, random_k, ids, levels); striding spreads a selection ordered by level or
    subject evenly over them. Every variant and seed of a problem runs in its shard, so the
    pairs stay on one machine. None: every problem."""
    if shard is None:
        return problems
    index, count = parse_shard(shard)
    return problems[index::count]


def fit_prompts(cfg: Config, problems: list) -> tuple[list, list[dict]]:
    """(the problems whose chat prompt fits the `PROMPT_ROOM` tokens the engines hold for
    it, one record per problem that does not): the prompt as the generator will see it (its
    tokenizer and chat template, `generator.system_prompt_file`), measured before any model
    loads. A skipped problem's record names it, its prompt's tokens, the limit and why."""
    from tts.backends.codec import generator_codec
    from tts.backends.factory import read_prompt
    from tts.config.limits import PROMPT_ROOM, engine_length

    codec = generator_codec(cfg.generator)
    system = read_prompt(cfg.generator.system_prompt_file)
    kept, skipped = [], []
    for problem in problems:
        tokens = len(codec.encode_prompt(problem.problem, system))
        if tokens <= PROMPT_ROOM:
            kept.append(problem)
            continue
        skipped.append({
            "problem_id": problem.id, "prompt_tokens": tokens, "limit": PROMPT_ROOM,
            "reason": (f"prompt of {tokens} tokens, over the {PROMPT_ROOM} the engines hold for a prompt "
                       f"(engine length {engine_length(cfg.generator)}: prompt, generator.max_total_tokens, "
                       "2 x generator.step_max_tokens)")})
    return kept, skipped
