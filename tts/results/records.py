"""Per-problem records: the final candidates, the chosen answers, their grades, metrics.

A record holds everything `tts eval` needs to re-grade a run without generating:
each candidate's text and aggregated score; and where its steps end in the text
(`step_ends`), so that another verifier can score the same steps later.
"""

from __future__ import annotations

from itertools import accumulate

from eval import extract_answer, grade_answer, grade_many
from eval.accuracy import (Candidate, accuracy_curves, group_answers, majority_vote, pass_at_n, prm_max,
                           weighted_best_of_n)

METHODS = ("majority", "weighted", "prm_max")


def candidate_dicts(outcome) -> list[dict]:
    """The final beams of an engine outcome, as plain dicts."""
    policy = outcome.policy
    return [{
        "text": beam.text,
        "answer": extract_answer(beam.text),
        "score": policy.path_score(beam) if policy.uses_verifier else None,
        "step_scores": list(beam.scores),
        "step_ends": list(accumulate(len(step.text) for step in beam.steps)),  # text[a:b]: each step
        "num_steps": beam.depth,
        "num_tokens": beam.num_tokens,
        "completed_at": beam.completed_at,
    } for beam in outcome.candidates]


def grade_candidates(gold: str, candidates: list[dict]) -> dict:
    """Chosen answers by each selection method, their verdicts, pass@N and the curves."""
    cands = [Candidate(c["answer"], c["score"]) for c in candidates]
    # the candidates grouped by equivalent answers once (at n=512, hundreds of answers and
    # their pairs asked of the grading pool), for every rule and the curves
    labels = group_answers([c.answer for c in cands])
    chosen = {
        "majority": majority_vote(cands, labels=labels),
        "weighted": weighted_best_of_n(cands, labels=labels) if _scored(cands) else None,
        "prm_max": prm_max(cands) if _scored(cands) else None,
    }
    verdicts = {}
    for method, answer in chosen.items():
        if method != "majority" and not _scored(cands):
            continue
        v = grade_answer(gold, "" if answer is None else f"\\boxed{{{answer}}}")
        verdicts[method] = {"correct": v.correct, "reason": v.reason}
    n = len(cands)
    # each distinct answer graded once, all in one call: for the verifier's AUROC
    unique = [a for a in dict.fromkeys(c.answer for c in cands) if a is not None]
    graded = {a: v.correct for a, v in zip(unique, grade_many([(gold, f"\\boxed{{{a}}}") for a in unique]))}
    graded[None] = False
    return {
        "answers": chosen,
        "candidate_correct": [graded[c.answer] for c in cands],
        "verdicts": verdicts,
        "correct": {m: v["correct"] for m, v in verdicts.items()},
        f"pass@{n}": pass_at_n(cands, gold, n) if n else False,
        "pass@n": pass_at_n(cands, gold, n) if n else False,
        "curves": accuracy_curves(cands, gold, labels=labels) if n else {},
    }


def _scored(cands: list[Candidate]) -> bool:
    return any(c.score is not None for c in cands)


def build_record(outcome, gold: str, variant: str, extra: dict | None = None) -> dict:
    from eval.verifier_quality import selection_events

    candidates = candidate_dicts(outcome)
    return {
        "variant": variant,
        "problem_id": outcome.problem.id,
        "problem": outcome.problem.problem,
        "gold": gold,
        **(extra or {}),
        "candidates": candidates,
        **grade_candidates(gold, candidates),
        "selection": selection_events(outcome.selections),
        "metrics": outcome.metrics.to_dict(),
    }


ACCURACY_KEYS = tuple(f"acc_{m}" for m in METHODS) + ("pass@n",)


def correctness(record: dict, key: str) -> bool | None:
    """Whether the record's answer is right under an accuracy key (`acc_<method>` or
    `pass@n`); None where the record has no verdict for it (an unscored method)."""
    if key == "pass@n":
        return bool(record.get("pass@n"))
    value = record.get("correct", {}).get(key.removeprefix("acc_"))
    return None if value is None else bool(value)


def accuracy_summary(records: list[dict]) -> dict:
    """Mean correctness per selection method and pass@N over records, each with its 95%
    Wilson interval (`<key>_ci`, [low, high])."""
    from eval.statistics import proportion_interval

    out: dict = {}
    if not records:
        return out
    for key in ACCURACY_KEYS:
        flags = [f for f in (correctness(r, key) for r in records) if f is not None]
        if flags:
            out[key] = sum(flags) / len(flags)
            out[f"{key}_ci"] = list(proportion_interval(sum(flags), len(flags)))
    out["num_graded"] = len(records)
    return out


def pair_key(record: dict) -> tuple[str, int | None]:
    """What pairs a record with another variant's: its problem and its seed (`bench.seeds`;
    None in records written before records carried their seed)."""
    return record["problem_id"], record.get("seed")


def paired_accuracy(baseline: list[dict], variant: list[dict]) -> dict:
    """Per accuracy key, the variant against the baseline over the (problem, seed) pairs
    both answered (`eval.statistics.paired_comparison`: difference, its 95% paired
    bootstrap interval, discordant counts, exact McNemar p-value)."""
    from eval.statistics import paired_comparison

    base = {pair_key(r): r for r in baseline}
    out = {}
    for key in ACCURACY_KEYS:
        pairs = [(correctness(base[pair_key(r)], key), correctness(r, key))
                 for r in variant if pair_key(r) in base]
        pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
        result = paired_comparison([a for a, _ in pairs], [b for _, b in pairs])
        if result is not None:
            out[key] = result.to_dict()
    return out
