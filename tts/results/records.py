"""Per-problem records: the final candidates, the chosen answers, their grades, metrics.

A record holds everything `tts eval` needs to re-grade a run without generating:
each candidate's text and aggregated score.
"""

from __future__ import annotations

from eval import extract_boxed, grade_answer
from eval.accuracy import Candidate, accuracy_curves, majority_vote, pass_at_n, prm_max, weighted_best_of_n

METHODS = ("majority", "weighted", "prm_max")


def candidate_dicts(outcome) -> list[dict]:
    """The final beams of an engine outcome, as plain dicts."""
    policy = outcome.policy
    return [{
        "text": beam.text,
        "answer": extract_boxed(beam.text),
        "score": policy.path_score(beam) if policy.uses_verifier else None,
        "step_scores": list(beam.scores),
        "num_steps": beam.depth,
        "num_tokens": beam.num_tokens,
        "completed_at": beam.completed_at,
    } for beam in outcome.candidates]


def grade_candidates(gold: str, candidates: list[dict]) -> dict:
    """Chosen answers by each selection method, their verdicts, pass@N and the curves."""
    cands = [Candidate(c["answer"], c["score"]) for c in candidates]
    chosen = {
        "majority": majority_vote(cands),
        "weighted": weighted_best_of_n(cands) if _scored(cands) else None,
        "prm_max": prm_max(cands) if _scored(cands) else None,
    }
    verdicts = {}
    for method, answer in chosen.items():
        if method != "majority" and not _scored(cands):
            continue
        v = grade_answer(gold, "" if answer is None else f"\\boxed{{{answer}}}")
        verdicts[method] = {"correct": v.correct, "reason": v.reason}
    n = len(cands)
    return {
        "answers": chosen,
        "verdicts": verdicts,
        "correct": {m: v["correct"] for m, v in verdicts.items()},
        f"pass@{n}": pass_at_n(cands, gold, n) if n else False,
        "pass@n": pass_at_n(cands, gold, n) if n else False,
        "curves": accuracy_curves(cands, gold) if n else {},
    }


def _scored(cands: list[Candidate]) -> bool:
    return any(c.score is not None for c in cands)


def build_record(outcome, gold: str, variant: str, extra: dict | None = None) -> dict:
    candidates = candidate_dicts(outcome)
    return {
        "variant": variant,
        "problem_id": outcome.problem.id,
        "problem": outcome.problem.problem,
        "gold": gold,
        **(extra or {}),
        "candidates": candidates,
        **grade_candidates(gold, candidates),
        "metrics": outcome.metrics.to_dict(),
    }


def accuracy_summary(records: list[dict]) -> dict:
    """Mean correctness per selection method and pass@N over records."""
    out: dict[str, float] = {}
    if not records:
        return out
    for method in METHODS:
        flags = [r["correct"][method] for r in records if method in r.get("correct", {})]
        if flags:
            out[f"acc_{method}"] = sum(flags) / len(flags)
    out["pass@n"] = sum(bool(r.get("pass@n")) for r in records) / len(records)
    out["num_graded"] = len(records)
    return out
