#!/usr/bin/env bash
# One-time set-up on a fresh machine: a virtual environment in .venv with the project and its test extras.
# torch is installed first, pinned to the CPU build that pip finds locally on our CI machines; on a GPU machine
# set INFERGATE_TORCH to the torch requirement you want (e.g. INFERGATE_TORCH="torch>=2.4").
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet "${INFERGATE_TORCH:-torch==2.13.0}"
python -m pip install --quiet -e '.[test]'
echo "pytest-infergate installed in $(pwd)/.venv"
