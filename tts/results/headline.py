"""What a run says on the terminal, and the full tables it keeps beside it.

A run ends with a headline of about a dozen lines a newcomer can trust: where it ran and
what, each variant's accuracy with its interval, the key speed ratios with their paired
intervals and the pairs they rest on, the tree line and the verifier line (`tree.py`), and
where the full tables are. The full per-variant table and ratio table go to
`<run>/summary.md` (`summary_markdown`); `tts bench -v` and `tts report RUN` print them.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from tts.markdown import markdown_table
from tts.results.host import hosts_lines
from tts.results.store import SUMMARY_MD
from tts.results.tree import plain_lines, verifier_brief

# the ratios the headline shows, by their summary key, with a short name and the way that is
# better (up: higher is better)
KEY_RATIOS = (("precise_goodput", "goodput", "↑"), ("latency_s_mean", "latency", "↓"),
              ("problems_per_min", "problems/min", "↑"), ("total_gen_tokens", "tokens", "↓"),
              ("verifier_s_mean", "verifier time", "↓"))
WIDTH = 160  # no headline line is longer; the detail is in summary.md
FEW_PAIRS = 8  # below this many pairs an interval is a draw, and the headline says so
VARIANT_KEYS = ("num_problems", "precise_goodput", "latency_s_mean", "generator_s_mean", "verifier_s_mean",
                "tokens_per_s", "problems_per_min", "acc_majority", "acc_weighted", "acc_prm_max", "pass@n",
                "gen_cache_hit_rate", "ver_cache_hit_rate", "gen_batch_util_mean", "gen_batch_cap", "ver_batch_util_mean",
                "straggler_gap", "spec_hit_rate")


def cell(variant: dict, key: str) -> str:
    """A summary value; an accuracy with its 95% interval (`<key>_ci`); where there is no
    value, the note that says why (`<key>_note`), else "-"."""
    value, interval = variant.get(key), variant.get(f"{key}_ci")
    if value is None:
        return variant.get(f"{key}_note") or "-"
    if interval:
        return f"{value:.3g} [{interval[0]:.2f}, {interval[1]:.2f}]"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def summary_markdown(summary: dict) -> str:
    """The run's full tables as Markdown: every variant's metrics, the ratio table, the tree
    and verifier lines."""
    names = list(summary["variants"])
    values = [summary["variants"][n] for n in names]
    table = markdown_table(["metric", *names], ([key, *(cell(v, key) for v in values)] for key in VARIANT_KEYS
                                                if any(v.get(key) is not None for v in values)))
    parts = ["\n".join([*_state_lines(summary), table])]
    if summary.get("ratio_table_md"):
        parts.append(summary["ratio_table_md"])
    parts.append("\n".join(plain_lines(summary)))
    return "\n\n".join(p for p in parts if p) + "\n"


def write_summary_markdown(path: Path, summary: dict) -> Path:
    out = path / SUMMARY_MD
    out.write_text(summary_markdown(summary))
    return out


def headline(summary: dict, config: dict) -> list[str]:
    """The run in about a dozen lines (after the host line, which the caller prints)."""
    names = list(summary["variants"])
    out = [_what_ran(summary, config, names)] + _state_lines(summary)
    acc = _accuracy_key(summary["variants"][names[0]])
    if acc:
        out.append(f"accuracy ({acc.removeprefix('acc_')}), 95% interval: "
                   + "; ".join(f"{n} {cell(summary['variants'][n], acc)}" for n in names))
    rows = {r.get("key"): r for r in summary.get("ratios", []) if r.get("key")}
    base = names[0]
    if len(names) > 1 and rows:
        out.append(f"ratios to {base}, paired 95% intervals (↑ higher is better, ↓ lower is better):")
    counts = []
    for name in names[1:]:
        parts = [f"{short} {way} {_ratio(rows.get(key), name, base)}" for key, short, way in KEY_RATIOS
                 if rows.get(key)]
        pairs = next((r.get("n_pairs", {}).get(name) for r in rows.values() if r.get("n_pairs")), None)
        counted = f" ({pairs} pair{'' if pairs == 1 else 's'}): " if pairs else ": "
        out.extend(packed(f"{name}/{base}{counted}", parts))
        counts += [pairs] if pairs else []
    fewest = min(counts, default=None)
    if fewest is not None and fewest < FEW_PAIRS:
        out.append(f"only {fewest} pair{'' if fewest == 1 else 's'}: these intervals are a draw, not a result "
                   f"({FEW_PAIRS} or more problems make them worth reading)")
    for line in summary.get("tree_lines", []):
        out.extend(textwrap.wrap(_brief_tree(line), WIDTH, subsequent_indent="  ", break_on_hyphens=False))
    for name in summary.get("verifier_lines", {}):
        quality = (summary["variants"].get(name) or {}).get("verifier_quality")
        line = f"verifier ({name}): " + (verifier_brief(quality) if quality else summary["verifier_lines"][name])
        out.extend(textwrap.wrap(line, WIDTH, subsequent_indent="  ", break_on_hyphens=False))
    return out


def _brief_tree(line: str) -> str:
    """A tree line (`tree.tree_line`) with its reason in a few words; summary.md has it all."""
    head, sep, reason = line.partition("): ")
    if not sep:
        return line
    why = ("numerics alone move trees here" if "numerics alone" in reason else
           "another search by design" if "by design" in reason else "its speed is partly another search")
    return f"{head}): {why} (summary.md says how)"


def packed(prefix: str, parts: list[str], width: int = WIDTH) -> list[str]:
    """`prefix` and the comma-separated `parts` in lines of at most `width` characters, the
    continuation lines indented."""
    lines, line = [], prefix
    for i, part in enumerate(parts):
        piece = part + ("," if i + 1 < len(parts) else "")
        if line.strip() and len(line) + len(piece) + 1 > width and line != prefix:
            lines.append(line.rstrip())
            line = "  "
        line += ("" if line.endswith((": ", "  ")) else " ") + piece
    lines.append(line.rstrip())
    return lines


def _state_lines(summary: dict) -> list[str]:
    """A line for a run not yet through its variants (an interim summary), else none; and
    the hosts of a run resumed on other machines (`hosts_lines`)."""
    pending = summary.get("pending") or []
    return ([f"incomplete: {', '.join(pending)} not run yet (`tts bench ... --resume` continues the run)"]
            if pending else []) + shard_lines(summary) + hosts_lines(summary.get("hosts"))


def _what_ran(summary: dict, config: dict, names: list[str]) -> str:
    search, dataset = config.get("search") or {}, config.get("dataset") or {}
    seeds = summary.get("seeds") or []
    n = summary["variants"][names[0]].get("num_problems", 0)
    per_seed = f" x {len(seeds)} seeds" if len(seeds) > 1 else ""
    models = f"{(config.get('generator') or {}).get('model')} + {(config.get('verifier') or {}).get('model')}"
    return (f"ran: {', '.join(names)} on {n} problems{per_seed} ({dataset.get('name')}), "
            f"{search.get('algorithm')} N={search.get('n')} M={search.get('beam_width')}, {models}")


def _accuracy_key(variant: dict) -> str | None:
    for key in ("acc_weighted", "acc_majority"):
        if variant.get(key) is not None:
            return key
    return None


def _ratio(row: dict | None, name: str, base: str) -> str:
    """A ratio with its paired interval, or why it has none."""
    value = (row or {}).get(f"{name}/{base}")
    if not isinstance(value, (int, float)):
        return "-"
    ci = row.get(f"{name}/{base}_ci")
    if ci:
        return f"{value:.2f}x [{ci[0]:.2f}, {ci[1]:.2f}]"
    return f"{value:.2f}x {row.get(f'{name}/{base}_ci_note') or 'n/a'}"


def shard_lines(summary: dict) -> list[str]:
    """One line saying the run was merged from shards (none for an unsharded run)."""
    shards = summary.get("shards")
    if not shards:
        return []
    return [f"merged from {len(shards)} shards: " + ", ".join(f"{s['shard']} ({s['records']} records)"
                                                              for s in shards)]
