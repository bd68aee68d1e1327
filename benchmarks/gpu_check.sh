#!/usr/bin/env bash
# The GPU check of `pytest --infergate-gpu`: one prepared script for a CUDA machine without network, at most ~8 min.
#   bash benchmarks/gpu_wheels.sh             # here, with PyPI: the missing wheels into .whl/
#   bash benchmarks/gpu_check.sh OUT_DIR      # there, from the repository root, with .whl/ beside the checkout
# It installs the wheels and this checkout into a scratch site folder, then runs
#   1. the GPU-marked tests (tests/test_gpu.py) and the CUDA-path tests (tests/test_gpu_paths.py),
#   2. `pytest suites/ --infergate-gpu -n 1` on tiny-random-llama (mechanics: every gate, fp16 / int8 / nf4),
#   3. the suites on random-llama-0.5b (a seeded 0.5 B Llama, real shapes: speed and memory; its golden gates
#      would only measure a random model's noise, so they are deselected),
#   4. benchmarks/engine.py on CUDA (engine vs HF generate),
# and writes the log, the JSON results, the HTML reports and nvidia-smi's memory trace into OUT_DIR; the figures
# the README needs are printed at the end.
set -uo pipefail
out=$(mkdir -p "${1:-${OUT:-gpu-check-out}}" && cd "${1:-${OUT:-gpu-check-out}}" && pwd)
exec > >(tee "$out/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1 INFERGATE_CACHE_DIR=${INFERGATE_CACHE_DIR:-/tmp/infergate-cache} HF_HUB_OFFLINE=1
python=${PYTHON:-python3}
site=/tmp/infergate-site
began=$(date +%s)
status=0

step() {  # step NAME COMMAND...: run, time, remember a failure, go on
  local name=$1 t0=$(date +%s)
  shift
  echo "=== $name: $*"
  "$@"
  local rc=$?
  echo "=== $name: exit $rc in $(( $(date +%s) - t0 )) s"
  [ $rc -eq 0 ] || status=1
}

rm -rf "$site"
"$python" -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl || exit 2
"$python" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$site" . || exit 2
export PYTHONPATH="$site"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$python" - <<'PY'
import bitsandbytes, torch, transformers
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), transformers {transformers.__version__}, "
      f"bitsandbytes {bitsandbytes.__version__}, GPU {torch.cuda.get_device_name(0)}")
PY
# GPU memory as nvidia-smi sees it, every second, to set beside the report's split
nvidia-smi --query-gpu=timestamp,memory.used --format=csv -l 1 > "$out/nvidia-smi.csv" 2>/dev/null &
smi=$!

pytest=("$python" -m pytest -p no:cacheprovider -q -rfE)
step gpu-tests "${pytest[@]}" tests/test_gpu.py tests/test_gpu_paths.py
step suites-tiny "${pytest[@]}" suites/ --infergate-gpu -n 1 --infergate-model=tiny-random-llama \
  --infergate-json="$out/suites-tiny.json" --infergate-report="$out/suites-tiny.html"
step suites-0.5b "${pytest[@]}" suites/ --infergate-gpu -n 1 --infergate-model=random-llama-0.5b \
  --deselect suites/test_golden.py \
  --infergate-json="$out/suites-0.5b.json" --infergate-report="$out/suites-0.5b.html"
step engine-benchmark "$python" benchmarks/engine.py --model random-llama-0.5b --device cuda

kill $smi 2>/dev/null
echo "=== figures"
for run in suites-tiny suites-0.5b; do
  [ -f "$out/$run.json" ] && "$python" -m pytest_infergate.cli summary "$out/$run.json"
  # which perf records' engines replayed CUDA graphs, and why the others did not
  [ -f "$out/$run.json" ] && "$python" - "$out/$run.json" <<'PY'
import collections, json, sys
data = json.load(open(sys.argv[1]))
records = data.get("records", data) if isinstance(data, dict) else data
seen = collections.Counter(str(((r.get("measurement") or {}).get("engine") or {}).get("cuda_graphs", "-"))[:160]
                           for r in records if isinstance(r, dict) and r.get("kind") == "perf")
for status, count in seen.most_common():
    print(f"  CUDA graphs in {count} perf records: {status}")
PY
done
echo "peak GPU memory used (nvidia-smi): $(sort -t, -k2 -n "$out/nvidia-smi.csv" | tail -1)"
echo "=== gpu_check: $([ $status -eq 0 ] && echo PASSED || echo FAILED) in $(( $(date +%s) - began )) s"
exit $status
