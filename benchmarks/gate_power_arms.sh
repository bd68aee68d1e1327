#!/bin/bash
# Every gate-power arm of issue #41 on a clean clone, in turn, with nothing else running but each arm's own hog:
#   bash benchmarks/gate_power_arms.sh OUT_DIR [--with-readme]
# OUT_DIR gets one log per arm (gate_power.py's verdict counts at its end) and `times`; --with-readme also times the
# README's main command quiet and under one busy loop per core (PASS expected both ways, within 2.5x).
set -u
out=$(realpath -m "${1:?give an output folder}"); readme=${2:-}
mkdir -p "$out"; clone=$out/clone
rm -rf "$clone"; git clone -q "$(git rev-parse --show-toplevel)" "$clone"; cd "$clone"
git log --oneline -1 > "$out/head.txt"
stamp() { echo "$1 $(date -u +%FT%TZ)" >> "$out/times"; }
stamp setup; bash setup.sh > "$out/setup.log" 2>&1 || { echo "setup failed: $out/setup.log"; exit 1; }
gate_power=(.venv/bin/python benchmarks/gate_power.py --model tiny-random-llama --mode baseline --slowdowns 0,0.25,1.0)
stamp quiet; "${gate_power[@]}" --trials 10 > "$out/stored_quiet.log" 2>&1
for side in run save both; do
  stamp "hog_$side"; "${gate_power[@]}" --trials 5 --hog "$side" > "$out/stored_hog_$side.log" 2>&1
done
stamp hog_both_computing; "${gate_power[@]}" --trials 5 --hog both --slowdown busy > "$out/stored_hog_both_computing.log" 2>&1
hog() { for _ in $(seq "$(nproc)"); do python3 -c 'while 1: pass' & done; }
if [ "$readme" = --with-readme ]; then
  stamp readme_quiet; start=$(date +%s)
  .venv/bin/pytest suites/ > "$out/readme_quiet.log" 2>&1; echo "exit $? in $(( $(date +%s) - start )) s" >> "$out/readme_quiet.log"
  hog; stamp readme_hog; start=$(date +%s)
  .venv/bin/pytest suites/ > "$out/readme_hog.log" 2>&1; echo "exit $? in $(( $(date +%s) - start )) s" >> "$out/readme_hog.log"
  kill $(jobs -p)
fi
hog; stamp ab_hog_run; .venv/bin/python benchmarks/gate_power.py --mode ab --trials 5 --slowdowns 0,0.25 > "$out/ab_hog_run.log" 2>&1
kill $(jobs -p); stamp done
grep -H -A3 "^verdicts" "$out"/*.log
