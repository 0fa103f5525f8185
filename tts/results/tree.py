"""The tree beside the schedule, and the verifier beside chance: what a speed ratio rests on.

A FlashTTS switch should change when work runs, not what the search finds. When a variant's
final candidates differ from the run's first variant's, its speed is partly another search
(fewer, longer steps; earlier stops), and a ratio between the two is not a scheduling
effect alone. `tree_stats` measures each variant's tree from its records, and `tree_line`
says in one plain line when and how it differs. `verifier_line` puts the verifier's
quality (`eval.verifier_quality`) in one line, flagged when it cannot be told from chance.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from statistics import fmean

from eval.verifier_quality import AUROC_AT_CHANCE

# the presets that keep the baseline's tree: by branches (any sampler), or exactly where
# sampling is resumable (the position sampler, float32 or batch-invariant kernels)
KEEPS_TREE = {"position": "PMS_exact", "vllm": "PMS_branches_prune"}


def tree_stats(records: list[dict]) -> dict:
    """Iterations per problem, steps per final path, tokens per step, verifier requests per
    problem, over a variant's records (empty dict without records)."""
    if not records:
        return {}
    paths = [c for r in records for c in r.get("candidates", [])]
    steps = [c.get("num_steps") or 0 for c in paths]
    return {
        "iterations": fmean(r["metrics"]["iterations"] for r in records),
        "steps_per_path": fmean(steps) if steps else 0.0,
        "tokens_per_step": (sum(c.get("num_tokens") or 0 for c in paths) / sum(steps)) if sum(steps) else 0.0,
        "verifier_calls": fmean(r["metrics"].get("ver_requests", 0) for r in records),
        **diversity(records),
    }


def diversity(records: list[dict]) -> dict:
    """How diverse a variant's final candidates are, per problem on average: how many are
    textually identical to another candidate (clones: identical paths score the same, so
    selection keeps the copies together and the beam's width collapses) and how many
    distinct answers they give (no answer counts as none). Empty without candidates."""
    per = [r["candidates"] for r in records if r.get("candidates")]
    if not per:
        return {}
    clones = [sum(n for n in Counter(c["text"] for c in cands).values() if n > 1) for cands in per]
    answers = [len({c.get("answer") for c in cands} - {None}) for cands in per]
    return {"identical_candidates_mean": fmean(clones), "unique_answers_mean": fmean(answers)}


def tree_line(name: str, mine: dict, base: dict, same_share: float | None, sampler: str,
              base_name: str = "baseline", drift: dict | None = None, kept_by: str | None = None,
              search: str | None = None) -> str | None:
    """One plain line when `name`'s tree is not the first variant's (some problem's final
    candidates differ), with the ratios that say how; None when the trees are the same.
    `drift` (`tree.sampling_drift`): of the requests both sent with one prompt and seed
    (`shared`), how many sampled other tokens (`differed`); any such request means numerics
    alone move the trees here. `kept_by`: a variant of the run that grew the first's tree
    (named as the control; otherwise the preset that keeps it with this sampler)."""
    if same_share is None or same_share >= 1.0 or not mine or not base:
        return None
    parts = []
    for key, label in (("iterations", "iterations"), ("steps_per_path", "steps per path"),
                       ("tokens_per_step", "tokens per step"), ("verifier_calls", "verifier calls")):
        if base.get(key):
            parts.append(f"{mine[key] / base[key]:.2g}x {label}")
    if "identical_candidates_mean" in mine and "identical_candidates_mean" in base:
        parts.append(f"{mine['identical_candidates_mean']:.1f} identical final candidates per problem "
                     f"against {base['identical_candidates_mean']:.1f}")
    control = (f"{kept_by} grew the {base_name}'s tree in this run" if kept_by else
               f"{KEEPS_TREE.get(sampler, KEEPS_TREE['vllm'])} keeps the {base_name}'s tree")
    line = (f"{name} grew a different tree ({', '.join(parts)}; the same final candidates on "
            f"{same_share:.0%} of problems)")
    if search is not None:
        return f"{line}: another search by design (bench.search_variants: {search}), not a schedule of the same one"
    if drift and drift["differed"]:
        return (f"{line}: {drift['differed']} of the {drift['shared']} requests it sent as the {base_name} did (same "
                f"prompt, same seed) sampled other tokens, so numerics alone move trees here (the "
                f"logits move with the batch and the prefix cache); how much of the ratio is the "
                f"schedule's, only `tts replay` on one tree tells")
    return f"{line}: its speed is a different search, not only a faster schedule; {control}"


def verifier_line(quality: dict) -> str:
    """The verifier's quality in one line (`eval.verifier_quality` results), ending with a
    warning when it is at chance."""
    parts = []
    au = quality.get("auroc")
    if au:
        parts.append(f"final-path AUROC {au['auroc']:.2f}{_ci(au.get('ci'))} ({au['n_right']} right, {au['n_wrong']} wrong paths)")
    else:
        parts.append("final-path AUROC n/a (no problem with both right and wrong paths)")
    sel = quality.get("selection")
    if sel:
        rho = "n/a" if sel["rho"] is None else f"{sel['rho']:.2f}{_ci(sel['rho_ci'])}"
        parts.append(f"the previous step's score predicts selection: rank correlation {rho}, its top-k kept "
                     f"{sel['hit_rate']:.2f}{_ci(sel['hit_rate_ci'])} against {sel['chance']:.2f} by chance "
                     f"({sel['selections']} selections)")
    spec = quality.get("speculation")
    if spec:
        parts.append(f"speculation hit rate {spec['hit_rate']:.2f} against {spec['chance']:.2f} by chance")
    line = "; ".join(parts)
    why = quality.get("at_chance_why") or []
    if why:
        line += f": AT CHANCE ({'; '.join(why)})"
        if set(why) - {AUROC_AT_CHANCE}:  # the previous score or speculation ranks at chance
            line += ", so speculation's priority cannot help, and a speed-up here is not FlashTTS's mechanism"
        else:
            line += ", so the final paths' scores do not tell right from wrong and selection cannot help accuracy"
    return line


def _ci(ci: list[float] | None) -> str:
    return f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""


def describe(summary: dict, by_variant: dict[str, list[dict]], config: dict, trace: Path | None = None) -> None:
    """Add to a run's summary each variant's tree (`tree`, with `sampling_drift` from the
    run's trace where its tree differs), its verifier quality (`verifier_quality`), and the
    plain lines: `tree_lines` (variants whose tree is not the first's) and `verifier_lines`."""
    from eval.verifier_quality import at_chance, final_auroc, selection_prediction, speculation_vs_chance

    names = list(by_variant)
    variants = summary["variants"]
    search = config.get("search") or {}
    kept_share = 1.0 / max(1, int(search.get("beam_width") or 1))
    sampler = str((summary.get("host") or {}).get("sampler") or "vllm")
    for name in names:
        variants[name]["tree"] = tree_stats(by_variant[name])
    # a search variant samples otherwise on purpose (greedy: temperature 0): no drift to count
    by_design = set((config.get("bench") or {}).get("search_variants") or [])
    moved = [name for name in names[1:] if (same := variants[name].get("same_candidates")) is not None
             and same < 1.0 and name not in by_design]
    if moved and trace is not None and trace.exists():
        _add_drift(variants, names[0], moved, trace)
    kept_by = next((name for name in names[1:] if variants[name].get("same_candidates") == 1.0), None)
    summary["tree_lines"] = [line for name in names[1:] if (line := tree_line(
        name, variants[name]["tree"], variants[names[0]]["tree"], variants[name].get("same_candidates"), sampler,
        names[0], variants[name]["tree"].get("sampling_drift"), kept_by, _search_of(name, by_design)))]
    summary["verifier_lines"] = {}
    for name in names:
        problems = [[(c.get("score"), ok) for c, ok in zip(r["candidates"], r["candidate_correct"])]
                    for r in by_variant[name] if "candidate_correct" in r]
        if not any(score is not None for p in problems for score, _ in p):
            continue  # no verifier scored these paths (self-consistency), or records before grading kept them
        auroc = final_auroc(problems)
        spec = speculation_vs_chance(variants[name].get("spec_hit_rate"), kept_share)
        selection = selection_prediction([r.get("selection") or {} for r in by_variant[name]])
        why = at_chance(auroc, spec, selection)
        quality = {"auroc": auroc, "selection": selection, "speculation": spec, "at_chance": bool(why),
                   "at_chance_why": why}
        variants[name]["verifier_quality"] = quality
        summary["verifier_lines"][name] = verifier_line(quality)


def _search_of(name: str, by_design: set[str]) -> str | None:
    """A search variant's preset in words (`greedy`: "greedy, temperature 0"), else None."""
    if name not in by_design:
        return None
    from omegaconf import OmegaConf

    from tts.config.compose import CONF_DIR

    preset = CONF_DIR / "search" / f"{name.partition('@')[0]}.yaml"
    settings = OmegaConf.to_container(OmegaConf.load(preset)) if preset.exists() else {}
    said = ", ".join(f"{k} {v}" for k, v in settings.items() if k in ("algorithm", "n", "temperature"))
    return f"{name}: {said}" if said else name


def _add_drift(variants: dict, base: str, moved: list[str], trace: Path) -> None:
    """Each moved variant's `tree.sampling_drift` from the run's trace; a trace that cannot
    be read (cut off mid-member by a kill is fine; not a trace at all) costs only this."""
    import logging

    from tts.trace.format import read_trace

    try:
        recorded = read_trace(trace)
    except ValueError as err:
        logging.getLogger(__name__).warning("sampling drift: not counted (%s)", err)
        return
    for name in moved:
        variants[name]["tree"]["sampling_drift"] = dict(zip(("differed", "shared"), recorded.drift(base, name)))


def verifier_brief(quality: dict) -> str:
    """`verifier_line` in a few words, for the headline (`summary.md` keeps the whole line)."""
    au, sel, spec = quality.get("auroc"), quality.get("selection"), quality.get("speculation")
    parts = [f"final-path AUROC {au['auroc']:.2f}{_ci(au.get('ci'))}" if au else "final-path AUROC n/a"]
    if sel:
        parts.append(f"previous score's top-k kept {sel['hit_rate']:.2f} (chance {sel['chance']:.2f})")
    if spec:
        parts.append(f"speculation hits {spec['hit_rate']:.2f} (chance {spec['chance']:.2f})")
    return ", ".join(parts) + ("; AT CHANCE: speculation's priority cannot help" if quality.get("at_chance") else "")


def plain_lines(summary: dict) -> list[str]:
    """The summary's tree lines, then one verifier line per variant that used one."""
    return [*summary.get("tree_lines", []),
            *(f"verifier ({name}): {line}" for name, line in summary.get("verifier_lines", {}).items())]
