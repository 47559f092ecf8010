#!/usr/bin/env bash
# The race's loan cycle at tiny shapes on a CPU, as tests/test_gpu_race.py runs it, under any Python ($PYTHON: the
# loans' torch, say): a tuning loan, a seed loan, a loan killed mid-block, the loan that completes it, the report.
#   PYTHON=/path/to/python bash benchmarks/gpu/rehearse.sh WORK [SETTINGS]
# SETTINGS (default: settings.yaml) is read for its `loan-smoke` profile: a copy with `compile: true` rehearses the
# compiled race. Prints each loan's pieces and the report's first lines; exits non-zero on the first failure.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
[ $# -ge 1 ] || { echo "usage: bash benchmarks/gpu/rehearse.sh WORK [SETTINGS]" >&2; exit 2; }
work="$1"; settings="${2:-$here/settings.yaml}"
py="${PYTHON:-python3}"
rm -rf "$work"; mkdir -p "$work/gpu-race"
PYTHONPATH="$here/../../src" "$py" "$here/corpus.py" --rehearsal "$work/text" > /dev/null
i=0
for extra in "--pieces 6" "--pieces 2" "--kill-after-runs 2" "--pieces 1"; do
  i=$((i + 1))
  set +e
  # shellcheck disable=SC2086
  PYTHON="$py" bash "$here/run.sh" "$work/out$i" --loan --smoke --settings "$settings" --race-root "$work/gpu-race" \
    --work "$work/w$i" --corpus-root "$work/text" $extra > "$work/loan$i.log" 2>&1
  rc=$?
  set -e
  if [ $rc -ne 0 ] && [ $rc -ne 137 ]; then echo "loan $i failed ($rc): $work/loan$i.log" >&2; tail -20 "$work/loan$i.log" >&2; exit 1; fi
  mkdir -p "$work/gpu-race/loan-$i" && cp "$work/out$i/results.json" "$work/gpu-race/loan-$i/"
  "$py" -c "import json,sys; d=json.load(open(sys.argv[1])); print('loan $i (rc $rc):', '; '.join(p['key'] + ': ' + p['status'] for p in d['pieces']))" "$work/out$i/results.json"
done
PYTHONPATH="$here/../../src" "$py" "$here/race_report.py" --root "$work/gpu-race"
head -30 "$work/gpu-race/report.md"
