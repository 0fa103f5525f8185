import json, sys
from pathlib import Path
print("| run | variant | wall (s) | generator steps (s) | verifier steps (s) | host (s) | host per generator step (ms) |")
print("|---|---|---|---|---|---|---|")
for run in sys.argv[1:]:
    s = json.load(open(Path(run) / "summary.json"))
    for v, d in s["variants"].items():
        g, r = d["generator"]["cost"], d["verifier"]["cost"]
        host = d["wall_s"] - g["wall_s"] - r["wall_s"]
        print(f"| {Path(run).name} | {v} | {d['wall_s']:.1f} | {g['wall_s']:.1f} ({g['steps']}) | {r['wall_s']:.1f} ({r['steps']}) | {host:.2f} | {1000*host/g['steps']:.2f} |")
