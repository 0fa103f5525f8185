"""The scaling sweep's gain taken apart (`tts report`'s "Scaling with n"), one line per run of
the sweep (`scaling_runs`: one n, one source, measured or simulated):

- **The tree against the schedule.** PMS over the baseline is the schedule's factor
  (`PMS_branches_prune`, PMS's schedule on the baseline's own tree, over the baseline) times
  the tree's (PMS over `PMS_branches_prune`). The schedule's share of PMS's gain is its factor's
  share of the product in log terms, ln(schedule) / ln(PMS), where PMS gains: 100% when the
  tree adds nothing, over 100% when the tree costs, negative when the schedule alone loses;
  "no gain" where PMS does not gain. The control grows the baseline's tree only where the
  variants' trees are one (`tree_basis`: a replay with `replay.tree`; float32 with the position
  sampler, unless a batch's rounding parts them); elsewhere the split is approximate, and the
  table says so.
- **One optimisation at a time.** P over the baseline, PM over P and PMS over PM each add one
  of P, M and S (FlashTTS's ablation); their product is PMS over the baseline. Where PMS gains,
  the step with the largest ratio carries the gain ("within noise" where its interval holds
  1); where it does not, the line says so and names the step that costs most.

Every ratio is precise goodput, two variants of the same run over the same problems and
seeds (`variant_ratios`): the run's own ratio table where it holds the pair (against its
first variant), else the summaries' quotient with the paired 95% interval its records give
(resampled by problem; none without records, a W&B run's). Beside each line, the largest
drawn share of the variants it takes (a replay's tokens or scores its trace did not hold).
"""

from __future__ import annotations

import math
from typing import Any

from tts.markdown import is_number, markdown_table, number
from tts.report.scaling import drawn_cell, run_line, scaling_runs, tree_basis
from tts.report.sources import RunData, variant_ratios
from tts.report.tables import interval_cell

KEY = "precise_goodput"
TREE, CONTROL = "PMS", "PMS_branches_prune"  # PMS, and PMS's schedule on the baseline's tree
LADDER = ("P", "PM", "PMS")  # each adds its last letter to the one before (the first: to the baseline)


def _ratio(run: RunData, base: str, name: str, label: str) -> dict[str, Any]:
    """`name` over `base` in precise goodput, its interval and pairs, under `label`."""
    r = variant_ratios(run, base, name, [KEY])
    return {label: r[KEY], f"{label}_ci": r[f"{KEY}_ci"], f"{label}_text": r[f"{KEY}_text"],
            f"{label}_pairs": r.get("pairs")}


def _most_drawn(run: RunData, names: list[str]) -> float | None:
    """The largest drawn share, of tokens or of scores, among the variants; None if measured."""
    shares = [s for name in names for s in run.drawn_shares(name) if is_number(s)]
    return max(shares) if shares else None


def tree_rows(runs: list[RunData]) -> list[dict[str, Any]]:
    """Per run of the sweep holding PMS and its control: PMS over the baseline, the control
    over the baseline (the schedule alone), PMS over the control (the tree), the schedule's
    share of PMS's gain (module docstring) and the most drawn of the three variants."""
    rows = []
    for run in scaling_runs(runs):
        row = run_line(run)
        base = row["baseline"]
        if not {TREE, CONTROL} <= set(run.variants) or base in (TREE, CONTROL):
            continue
        row |= _ratio(run, base, TREE, "pms") | _ratio(run, base, CONTROL, "schedule") | \
            _ratio(run, CONTROL, TREE, "tree")
        row["schedule_share"] = log_share(row["schedule"], row["pms"])
        row["drawn"] = _most_drawn(run, [base, TREE, CONTROL])
        row["trees"] = tree_basis(run)
        rows.append(row)
    return rows


def step_rows(runs: list[RunData]) -> list[dict[str, Any]]:
    """Per run of the sweep holding every variant of `LADDER`: each step's ratio under the
    letter it adds ("P", "M", "S"), PMS over the baseline ("pms"), the step that carries the
    gain and the most drawn of the variants."""
    rows = []
    for run in scaling_runs(runs):
        row = run_line(run)
        chain = [row["baseline"], *LADDER]
        if not set(LADDER) <= set(run.variants) or row["baseline"] in LADDER:
            continue
        for before, after in zip(chain, chain[1:]):
            row |= _ratio(run, before, after, after[-1])
        row |= _ratio(run, row["baseline"], LADDER[-1], "pms")
        row["carries"] = carrier(row, [name[-1] for name in LADDER])
        row["drawn"] = _most_drawn(run, chain)
        rows.append(row)
    return rows


def log_share(part: float | None, whole: float | None) -> float | None:
    """ln(part) / ln(whole): the share of a product's gain that one factor gives; None unless
    the whole gains (above 1) and the part is a positive number."""
    if not (is_number(part) and is_number(whole)) or part <= 0 or whole <= 1:
        return None
    return math.log(part) / math.log(whole)


def carrier(row: dict[str, Any], letters: list[str]) -> str:
    """Where PMS gains over the baseline ("pms" above 1): the letter of the largest step,
    "(within noise)" where its interval holds 1, "(no interval)" where there is none. Where
    it does not: "no gain", and the letter of the step that costs most, if one does."""
    steps = [(row[letter], letter) for letter in letters if is_number(row.get(letter))]
    if not steps or not is_number(row.get("pms")):
        return "-"
    if row["pms"] <= 1:
        worst, letter = min(steps)
        return f"no gain; {letter} costs most" if worst < 1 else "no gain"
    letter = max(steps)[1]
    ci = row.get(f"{letter}_ci")
    return letter if ci and ci[0] > 1 else f"{letter} ({'within noise' if ci else 'no interval'})"


def share_cell(row: dict[str, Any]) -> str:
    """The schedule's share of PMS's gain as a table prints it; "no gain" where PMS has none."""
    if is_number(row.get("pms")) and row["pms"] <= 1:
        return "no gain"
    return number(row.get("schedule_share"), "{:.0%}")


def _order(row: dict[str, Any]) -> tuple:
    return row["n"], row["simulated"], row["source"], row["run"]


def tree_table(rows: list[dict[str, Any]]) -> str:
    head = ["n", "source", "PMS / baseline [95%]", f"schedule alone: {CONTROL} / baseline [95%]",
            f"tree: PMS / {CONTROL} [95%]", "schedule's share of PMS's gain (log)", "trees", "pairs", "most drawn"]
    return markdown_table(head, ([r["n"], r["source"], *(interval_cell(r, k) for k in ("pms", "schedule", "tree")),
                                  share_cell(r), r["trees"], r.get("pms_pairs"), drawn_cell(r["drawn"])]
                                 for r in sorted(rows, key=_order)))


def step_table(rows: list[dict[str, Any]]) -> str:
    chain = ["baseline", *LADDER]
    head = ["n", "source", *(f"{after[-1]}: {after} / {before} [95%]" for before, after in zip(chain, chain[1:])),
            "PMS / baseline [95%]", "carries the gain", "pairs", "most drawn"]
    return markdown_table(head, ([r["n"], r["source"], *(interval_cell(r, k[-1]) for k in LADDER),
                                  interval_cell(r, "pms"), r["carries"], r.get("pms_pairs"), drawn_cell(r["drawn"])]
                                 for r in sorted(rows, key=_order)))


def ablation_lines(tree: list[dict[str, Any]], steps: list[dict[str, Any]]) -> list[str]:
    """The report's lines for both tables, each with what it holds; none for a table without rows."""
    lines = []
    if tree:
        lines += ["### The tree against the schedule", "",
                  f"Precise goodput. `{CONTROL}` runs PMS's schedule on the baseline's tree, so its ratio to the "
                  "baseline is the schedule's alone and PMS's ratio to it the tree's; the two multiply to PMS's. "
                  "The schedule's share of PMS's gain is ln(schedule) / ln(PMS) where PMS gains: 100% where the "
                  "tree adds nothing, over 100% where it costs, negative where the schedule alone loses. The control "
                  "grows the baseline's tree only where the trees are one (column trees: a replay of one recording "
                  "with `replay.tree`; float32 with the position sampler, unless a batch's rounding parts them); "
                  "where each variant grew its own (bf16 moves a tree with its batch), the split is approximate.",
                  "",
                  tree_table(tree), ""]
    if steps:
        lines += ["### One optimisation at a time", "",
                  "Precise goodput. P, PM and PMS each add one optimisation (P: prefix-aware order, M: the "
                  "roofline memory split, S: speculation), each step over the variant before it in the same "
                  "run, over the same problems, with its paired 95% interval; the steps multiply to PMS over "
                  "the baseline. Where PMS gains, the largest step carries it (within noise where its interval "
                  "holds 1); where it does not, the step that costs most is named.", "",
                  step_table(steps), ""]
    return lines
