#!/bin/bash
# Issue 48: a fresh clone runs the README's lines, each timed by the wall clock, beside BUSY processes spinning on
# the cores (0: quiet). Usage: bash benchmarks/fresh_clone.sh OUT [BUSY] [VOCAB]; the times go to OUT/times.txt and
# each line's output to OUT/NAME.log. benchmarks/RESULTS.md ("A fresh clone on a busy machine") has what it found.
set -u
T=$(realpath -m "$1"); BUSY=${2:-2}; VOCAB=${3:-4096}; REPO=$(git rev-parse --show-toplevel)
mkdir -p "$T" && rm -rf "$T/main" "$T/corpus" && ln -sfn "$REPO/../shared" "$T/shared"
git clone -q "$REPO" "$T/main" && cd "$T/main" || exit 1
mkdir -p "$T/corpus" && python3 - "$T/corpus" <<'PY'
import pathlib, sys, sysconfig
out, n = pathlib.Path(sys.argv[1]), 0  # ~3 MB of text: the standard library's top-level modules as .txt files
for i, p in enumerate(sorted(pathlib.Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))):
    if n > 3_000_000:
        break
    text = p.read_text(errors="ignore")
    n += len(text.encode())
    (out / f"{i:04d}.txt").write_text(text)
print("corpus bytes", n)
PY
pids=""; for _ in $(seq 1 "$BUSY"); do python3 -c "while True: pass" & pids="$pids $!"; done
trap '[ -n "$pids" ] && kill $pids' EXIT
t() {
  local name=$1; shift; local s; s=$(date +%s.%N); "$@" > "$T/$name.log" 2>&1; local rc=$?
  echo "$name rc=$rc wall=$(echo "$(date +%s.%N) - $s" | bc) s load=$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$T/times.txt"
}
echo "start $(date) busy=$BUSY vocab=$VOCAB revision=$(git rev-parse --short HEAD)" > "$T/times.txt"
t make_demo make demo
source .venv/bin/activate && export HF_HUB_OFFLINE=1
t prepare angpt prepare --source "$T/corpus/" --tokenizer "bpe:$VOCAB" --out data/mine
t train_10 angpt train --config configs/demo-angpt.yaml --data data/mine --out runs/mine --train.max_steps 10
t generate angpt generate runs/mine --prompt "Once upon a time"
t export angpt export runs/mine hf/mine --format hf
t dryrun angpt train --arch angpt --preset gpt2-small --data data/mine --out runs/big --dry-run
t compare angpt compare --data data/mine --out reports/mine --arms gpt+,angpt --budgets 64Ki,128Ki --seeds 0,1 \
  --preset demo --set model.d_model=128 model.n_layers=4 model.n_heads=2 model.context_length=128 \
  --batch-tokens 1024 --seq-len 128 --micro-batch 8 --jobs 2 --threads 1
t make_test make test
echo "end $(date)" >> "$T/times.txt"
