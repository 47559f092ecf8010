#!/usr/bin/env bash
# The race's loan cycle at tiny shapes on a CPU, as tests/test_gpu_race.py runs it, under any Python ($PYTHON: the
# loans' torch, say): a short loan, a loan killed by its command's limit once two runs ended, a loan that finishes
# the race; each taken into the store as a session takes a GPU's, then the race's report (the study engine's).
#   PYTHON=/path/to/python bash benchmarks/gpu/rehearse.sh WORK [SETTINGS]
# SETTINGS (default: settings.yaml) is read for its `loan-smoke` profile: a copy whose race has `train: {compile:
# true}` rehearses the compiled race. Prints each loan's pieces and the report's verdicts; exits non-zero on
# the first failure.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
[ $# -ge 1 ] || { echo "usage: bash benchmarks/gpu/rehearse.sh WORK [SETTINGS]" >&2; exit 2; }
work="$1"; settings="${2:-$here/settings.yaml}"
py="${PYTHON:-python3}"
export PYTHONPATH="$here/../../src${PYTHONPATH:+:$PYTHONPATH}"
rm -rf "$work"; mkdir -p "$work"
"$py" "$here/corpus.py" --rehearsal "$work/text" > /dev/null
common=(--loan --smoke --settings "$settings" --store "$work/store" --race-root "$work/loans")
i=0
for extra in "--deadline 30 --pieces 1" "--kill-after-runs 2" "--deadline 600"; do
  i=$((i + 1))
  set +e
  # shellcheck disable=SC2086
  "$py" "$here/kit.py" "$work/out$i" "${common[@]}" --work "$work/w$i" --corpus-root "$work/text" $extra \
    > "$work/loan$i.log" 2>&1
  rc=$?
  set -e
  if [ $rc -ne 0 ] && [ $rc -ne 137 ]; then echo "loan $i failed ($rc): $work/loan$i.log" >&2; tail -20 "$work/loan$i.log" >&2; exit 1; fi
  "$py" -c "import json,sys; d=json.load(open(sys.argv[1])); d['started']='2026-01-0$i 00:00:00'; json.dump(d, open(sys.argv[1], 'w'))" "$work/out$i/results.json"
  "$py" -c "import json,sys; d=json.load(open(sys.argv[1])); print('loan $i (rc $rc):', '; '.join(p['key'] + ': ' + str(len(p.get('started', []))) + ' started' for p in d.get('pieces', [])), '; runs brought back:', len(d.get('runs', [])))" "$work/out$i/results.json"
  "$py" "$here/kit.py" "${common[@]}" --take "$work/out$i" > "$work/take$i.log" 2>&1 || { cat "$work/take$i.log" >&2; exit 1; }
done
cat "$work/take3.log"
