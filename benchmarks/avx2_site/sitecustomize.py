"""Loaded at the start of every Python process that `benchmarks/emulate_avx2.py` runs (this folder is put first on
PYTHONPATH): bitsandbytes asks the CPU itself (cpuid) whether it has AVX512-BF16, which no environment variable
limits, so its answer is patched to the AVX2-only CPUs' before any model is built."""

import os

if os.environ.get("INFERGATE_EMULATE_AVX2") == "1":
    try:
        import bitsandbytes.functional as _bnb_functional
        import bitsandbytes.nn.modules as _bnb_modules
    except ImportError:  # nothing to patch where bitsandbytes is not installed
        pass
    else:
        # Linear4bit reads it when built and the golden header's kernel path when written
        _bnb_modules.has_avx512bf16 = _bnb_functional.has_avx512bf16 = lambda: False
