#!/usr/bin/env bash
# The GPU evidence kit (benchmarks/gpu/kit.py): bash benchmarks/gpu/run.sh OUT [--smoke] [--only STEP,...] or OUT --loan
# Runs from a copy of the working tree with no install: the package comes from src/, and every other need
# (torch, tokenizers, safetensors, pyyaml, tqdm, numpy; transformers for the Qwen3 peer, matplotlib for the plots)
# from the Python on PATH, or $PYTHON. Writes OUT/results.json and OUT/report.md as each step ends, plots at the end.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
  echo "usage: bash benchmarks/gpu/run.sh OUT [--smoke] [--only data,env,speed,sweep] | OUT --loan" >&2
  exit 2
fi
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "${PYTHON:-python3}" "$here/kit.py" "$@"
