#!/usr/bin/env python
"""Compare two runs' trees text for text (every generation and score in the trace, per
variant) and their ratios (summary.json). Usage: compare.py BEFORE AFTER"""
import gzip, json, sys
from collections import Counter
from pathlib import Path

def trace(run):
    gens, scores = {}, {}
    with gzip.open(Path(run) / "trace.jsonl.gz", "rt") as f:
        for line in f:
            r = json.loads(line)
            if r["t"] == "g":
                gens.setdefault(r["v"], []).append((r["seed"], r["h"], r["p"], r["max"], r["spec"], tuple(r["o"]), r["f"]))
            elif r["t"] == "s":
                scores.setdefault(r["v"], []).append((r["k"], round(r["r"], 6)))
    return gens, scores

def records(run):
    out = {}
    for line in open(Path(run) / "records.jsonl"):
        r = json.loads(line)
        out[(r["variant"], r["problem_id"], r["seed"])] = ([c["text"] for c in r["candidates"]], r["metrics"].get("iterations"))
    return out

b, a = sys.argv[1], sys.argv[2]
gb, sb = trace(b); ga, sa = trace(a)
ok = True
for v in sorted(set(gb) | set(ga)):
    same_set = Counter(gb.get(v, [])) == Counter(ga.get(v, []))
    same_order = gb.get(v) == ga.get(v)
    same_scores = Counter(sb.get(v, [])) == Counter(sa.get(v, []))
    ok &= same_set and same_scores
    print(f"{v}: generations {len(gb.get(v, []))} / {len(ga.get(v, []))}, same multiset {same_set}, same order {same_order}; "
          f"scores {len(sb.get(v, []))} / {len(sa.get(v, []))}, same {same_scores}")
rb, ra = records(b), records(a)
same_rec = rb == ra
ok &= same_rec
print(f"records: {len(rb)} / {len(ra)}, final candidates and iterations the same: {same_rec}")
for k in rb:
    if rb[k] != ra.get(k):
        print("  differs:", k)
print("TREES IDENTICAL" if ok else "TREES DIFFER")

def ratios(run):
    s = json.load(open(Path(run) / "summary.json"))
    out = {}
    for row in s["ratios"]:
        for k, v in row.items():
            if "/" in k and not k.endswith("_ci") and isinstance(v, (int, float)) and row.get("key"):
                out[(row["metric"], k)] = v
    return out, s["host"]

xb, host = ratios(b); xa, _ = ratios(a)
print("host:", json.dumps(host))
print("| metric | ratio | before | after | after/before |\n|---|---|---|---|---|")
worst = 0.0
for key in xb:
    if key in xa and xb[key]:
        d = xa[key] / xb[key]
        worst = max(worst, abs(d - 1))
        print(f"| {key[0]} | {key[1]} | {xb[key]:.4g} | {xa[key]:.4g} | {d:.4f} |")
print(f"largest ratio change: {worst:.2%}")
