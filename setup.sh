#!/usr/bin/env bash
# One-time set-up on a fresh machine: a virtual environment in .venv with the project.
#   bash setup.sh        the plugin and the gate suites
#   bash setup.sh test   also the project's test dependencies, including llama-cpp-python's OpenAI-compatible
#                        server for the endpoint tests (it compiles llama.cpp once, 4-12 minutes on 2 cores;
#                        pip keeps the built wheel, so later runs take seconds)
# torch is installed first, pinned to the CPU build that pip finds locally on our CI machines; on a GPU machine
# set INFERGATE_TORCH to the torch requirement you want (e.g. INFERGATE_TORCH="torch>=2.4").
set -euo pipefail
cd "$(dirname "$0")"
case "${1:-}" in
  "") target="." ;;
  test) target=".[test]" ;;
  *) echo "usage: bash setup.sh [test]" >&2; exit 2 ;;
esac
python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet "${INFERGATE_TORCH:-torch==2.13.0}"
# llama.cpp's own tests and examples are not needed to serve a model; skipping them halves the build. A portable
# AVX2 build, not -march=native: a native build on a VM whose CPUID shows AVX-512/AMX that the hypervisor does not
# enable dies with "invalid opcode" on its first request (seen on a Sapphire Rapids guest)
export CMAKE_ARGS="${CMAKE_ARGS:--DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}"
python -m pip install --quiet -e "$target"
echo "pytest-infergate installed in $(pwd)/.venv"
