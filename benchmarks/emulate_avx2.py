"""Run a command as if on an AVX2-only x86 CPU (an AMD EPYC of the Zen 2/3 kind, an older Xeon) on an AVX-512 one:
the golden files recorded on such a machine can then be checked here.

    python benchmarks/emulate_avx2.py .venv/bin/pytest suites/ [args...]

What it limits, for the command and every process it starts (pytest-xdist workers, baseline environments):
MKL (MKL_ENABLE_INSTRUCTIONS=AVX2), oneDNN (ONEDNN_MAX_CPU_ISA=AVX2), ATen's own kernels
(ATEN_CPU_CAPABILITY=avx2, so bitsandbytes also takes its fp32 int8 matmul instead of torch._int_mm), and
bitsandbytes' AVX512-BF16 nf4 kernel (`avx2_site/sitecustomize.py`). The golden header then records the AVX2 kernel
path, and the gate picks the file recorded on it. What it cannot change is the CPU model: MKL still sizes its blocks
for this CPU, so fp32 and nf4 reproduce an AMD EPYC's tokens but not all its last bits, and int8 does not reproduce
its tokens (README "What remains hardware-dependent").
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SITE = Path(__file__).resolve().parent / "avx2_site"
AVX2_ENV = {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
            "INFERGATE_EMULATE_AVX2": "1"}


def emulated_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = dict(os.environ if environ is None else environ)
    path = environ.get("PYTHONPATH")
    return {**environ, **AVX2_ENV, "PYTHONPATH": f"{SITE}{os.pathsep}{path}" if path else str(SITE)}


def is_emulated() -> bool:
    return all(os.environ.get(key) == value for key, value in AVX2_ENV.items())


def reexec_emulated() -> None:
    """Restart this Python script under the emulation, unless it already runs under it (before torch loads)."""
    if not is_emulated():
        os.execve(sys.executable, [sys.executable, *sys.argv], emulated_environment())


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        sys.exit(__doc__)
    os.execvpe(sys.argv[1], sys.argv[1:], emulated_environment())


if __name__ == "__main__":
    main()
