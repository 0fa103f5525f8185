#!/bin/bash
# The engine before a refactor and after, on one host: the same trees text for text, and
# the ratios. BEFORE and AFTER are checkouts (git worktree add DIR COMMIT) sharing one
# .venv; float32 and the position sampler keep trees exact across batch shapes.
# Usage: bash docs/runs/refactor_check/run.sh BEFORE AFTER OUT
set -e
BEFORE=$1; AFTER=$2; OUT=$3; PY=$(cd "$AFTER" && pwd)/.venv/bin/python
COMMON="generator.dtype=float32 verifier.dtype=float32 generator.sampler=position optim.decoupled_spec_guard=false
 dataset=embedded dataset.first_k=8 search.n=8 generator.max_total_tokens=256 bench.raw_generator=false logger=none
 bench.results_dir=$OUT"
export HF_HUB_OFFLINE=1 WANDB_MODE=disabled
for cfg in compare throughput; do
  if [ $cfg = compare ]; then V="bench.compare=[baseline,PMS,PMS_branches_prune]"; else V="bench.compare=[baseline,decoupled,decoupled_all]"; fi
  for side in before after; do
    dir=$BEFORE; [ $side = after ] && dir=$AFTER
    (cd "$dir" && $PY -m cli.main bench --config-name=$cfg $COMMON "$V" bench.run_name=$cfg-$side)
  done
  $PY "$(dirname "$0")/compare.py" "$OUT/$cfg-before" "$OUT/$cfg-after"
done
