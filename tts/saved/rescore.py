"""Score a run's recorded final candidates with another verifier: its quality on the very
paths a search produced, without generating (`tts rescore RUN verifier=KEY`).

Each candidate's steps are its recorded text cut at `step_ends`; a run recorded before
those were kept is cut after each "\\n\\n" (the step boundary), and where that gives another
number of steps than the record's, the output counts the candidates. Every step is scored,
one request per candidate; the path score aggregates them as the run's search did
(`search.aggregation`). Per variant, beside the run's own verifier:

- the final-path AUROC of right against wrong answers with its 95% interval over problems
  (`eval.verifier_quality.final_auroc`);
- how often the answer the weighted vote and PRM-max pick is right under each verifier's
  scores (the candidates' own grades, `candidate_correct`: nothing is graded again).

Only the verifier loads. The search does not run again, so the candidates are the run's:
this measures the verifier as a judge of those paths, not the search it would guide.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from eval.accuracy import Candidate, prm_max, weighted_best_of_n
from eval.verifier_quality import final_auroc
from tts.backends.base import ScoreRequest, Verifier
from tts.markdown import markdown_table
from tts.search.base import aggregate

BATCH = 32  # candidates per verifier call


def candidate_steps(candidate: dict) -> tuple[list[str], bool]:
    """The candidate's step texts, and whether they are the run's own (cut at `step_ends`);
    otherwise cut after each "\\n\\n"."""
    text, ends = candidate.get("text") or "", candidate.get("step_ends")
    if ends:
        return [text[a:b] for a, b in zip([0, *ends[:-1]], ends)], True
    return [s for s in re.split(r"(?<=\n\n)", text) if s], False


@dataclass
class Rescored:
    """One variant's candidates, rescored: per problem, (recorded score, new score, right)."""

    problems: list[list[tuple[float | None, float | None, bool]]]
    picks: dict[str, list[bool]]  # method@verifier -> per problem, its answer right
    resegmented: int = 0  # candidates cut at "\n\n" into another number of steps than recorded
    candidates: int = 0


def rescore_records(records: Sequence[dict], verifier: Verifier, aggregation: str) -> dict[str, Rescored]:
    """Rescore every candidate of every record, grouped by variant."""
    jobs = []  # (record, candidate, steps)
    out: dict[str, Rescored] = {}
    for record in records:
        mine = out.setdefault(record["variant"], Rescored([], {}))
        for c in record["candidates"]:
            steps, exact = candidate_steps(c)
            mine.candidates += 1
            mine.resegmented += not exact and len(steps) != c.get("num_steps", len(steps))
            jobs.append((record, c, steps))
    new: dict[int, float | None] = {}
    for start in range(0, len(jobs), BATCH):
        chunk = [(i, record, steps) for i, (record, _, steps) in enumerate(jobs[start:start + BATCH], start) if steps]
        if not chunk:
            continue
        scores, _ = verifier.score([ScoreRequest(record["problem"], tuple(steps), tuple(range(len(steps))))
                                    for _, record, steps in chunk])
        new.update((i, aggregate(list(s), aggregation)) for (i, _, _), s in zip(chunk, scores))
    i = 0
    for record in records:
        mine, right = out[record["variant"]], record.get("candidate_correct") or []
        triples = []
        for k, c in enumerate(record["candidates"]):
            triples.append((c.get("score"), new.get(i), bool(right[k]) if k < len(right) else False))
            i += 1
        mine.problems.append(triples)
        for who, column in (("recorded", 0), ("rescored", 1)):
            cands = [Candidate(c.get("answer"), t[column]) for c, t in zip(record["candidates"], triples)]
            verdict = {c.get("answer"): t[2] for c, t in zip(record["candidates"], triples)}
            for method, pick in (("weighted", weighted_best_of_n), ("prm_max", prm_max)):
                mine.picks.setdefault(f"{method}@{who}", []).append(bool(verdict.get(pick(cands), False)))
    return out


def summary(rescored: dict[str, Rescored]) -> dict:
    """Per variant: both AUROCs with intervals, both verifiers' pick accuracies, the counts."""
    out = {}
    for variant, r in rescored.items():
        auroc = {who: final_auroc([[(t[col], t[2]) for t in p] for p in r.problems])
                 for who, col in (("recorded", 0), ("rescored", 1))}
        out[variant] = {"problems": len(r.problems), "candidates": r.candidates, "resegmented": r.resegmented,
                        "auroc": auroc,
                        "accuracy": {k: sum(v) / len(v) for k, v in r.picks.items() if v}}
    return out


def table(result: dict, recorded: str, rescored: str) -> str:
    """The summary as a Markdown table, a row per variant and verifier."""
    def au(a: dict | None) -> str:
        if a is None:
            return "n/a (needs right and wrong answers)"
        ci = a.get("ci")
        return f"{a['auroc']:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")

    rows = [(variant, name, s["problems"], au(s["auroc"][who]), f"{s['accuracy'].get(f'weighted@{who}', 0):.2f}",
             f"{s['accuracy'].get(f'prm_max@{who}', 0):.2f}")
            for variant, s in result.items() for who, name in (("recorded", recorded), ("rescored", rescored))]
    lines = [markdown_table(("variant", "verifier", "problems", "final-path AUROC, 95%", "weighted vote right",
                             "PRM-max right"), rows)]
    resegmented = sum(s["resegmented"] for s in result.values())
    if resegmented:
        lines.append(f"\n{resegmented} candidates were cut at \"\\n\\n\" into another number of steps than the "
                     "run's (it recorded no step_ends): their new scores are of other steps")
    return "\n".join(lines) + "\n"


def rescore_run(run, overrides: list[str], out=None) -> tuple:
    """`tts rescore`: the run's candidates scored by the verifier the overrides name (the
    run's config otherwise; `verifier=KEY` takes that group's model, dtype and adapter);
    writes `rescore.json` and `rescore.md` to `out` (default: beside the run, named for the
    verifier) and returns (that folder, the table with its host line)."""
    import json
    from pathlib import Path

    from omegaconf import OmegaConf

    from tts.backends.factory import Backends
    from tts.backends.vllm.engine import read_hf_config, resolve_dtype
    from tts.config.compose import ConfigError, validate
    from tts.config.saved_run import replay_config
    from tts.config.enums import BackendKind
    from tts.config.schema import Config
    from tts.models.resolve import resolve_model
    from tts.results.host import host_info, host_line
    from tts.results.store import RunStore

    run = Path(run)
    store = RunStore(run)
    saved = store.saved_config()
    if not saved:
        raise ConfigError(f"{run}: not a run folder (no config.yaml)")
    records = [r for r in store.records() if r.get("candidates")]
    if not records:
        raise ConfigError(f"{run}: the run recorded no candidates to rescore")
    recorded = validate(OmegaConf.merge(OmegaConf.structured(Config), saved)).verifier.model
    node = replay_config(saved, overrides)[0]
    cfg = validate(node)
    v = cfg.verifier  # only the verifier loads: the generator's model need not be here
    host = host_info({"verifier": "fake" if v.backend is BackendKind.fake
                      else resolve_dtype(v.dtype, read_hf_config(resolve_model(v.model)))})
    backends = Backends(cfg)
    try:
        result = summary(rescore_records(records, backends.verifier_alone(), cfg.search.aggregation))
    finally:
        backends.close()
    text = f"{host_line(host)}\n\n" + table(result, f"{recorded} (the run's)", cfg.verifier.model)
    folder = Path(out) if out else run.parent / f"{run.name}-rescore-{re.sub(r'[^A-Za-z0-9_.-]+', '_', cfg.verifier.model)}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rescore.json").write_text(json.dumps({"run": str(run), "recorded_verifier": recorded,
                                                     "verifier": cfg.verifier.model, "host": host,
                                                     "variants": result}, indent=1))
    (folder / "rescore.md").write_text(text)
    return folder, text
