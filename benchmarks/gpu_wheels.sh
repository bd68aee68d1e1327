#!/usr/bin/env bash
# Fetch, on a machine with PyPI, the packages a bare GPU machine lacks, into .whl/ (ignored by git), for
# benchmarks/gpu_check.sh to install there without network. The lent H200s here run Python 3.12 with torch,
# transformers, accelerate, numpy, jinja2, psutil, httpx, pytest and pytest-xdist already; they lack bitsandbytes,
# rouge-score (sdist only, so a wheel is built here: it is pure Python), nltk and httpx-sse.
#   bash benchmarks/gpu_wheels.sh            # then carry .whl/ with the checkout (under 64 MiB together)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
rm -rf .whl && mkdir -p .whl
platforms=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
  platforms+=(--platform "${tag}_x86_64")
done
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version "${GPU_PYTHON_VERSION:-3.12}" \
  --implementation cp "${platforms[@]}" -d .whl "bitsandbytes==0.50.2" "nltk" "httpx-sse"
"$python" -m pip wheel -q --no-deps -w .whl "rouge-score==0.1.2"
ls -la .whl
du -sh .whl
