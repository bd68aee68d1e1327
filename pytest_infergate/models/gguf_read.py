"""Reading a GGUF file once while transformers converts it.

transformers' GGUF loader parses the file's metadata once for the config, once for the tokenizer and once for the
weights, and builds gguf-py's tensor-name map once for every module of the model (397 times for SmolLM2-135M):
measured here, 14 of the 22 s the embedded model's conversion took. Within `read_gguf_once()` each file is parsed
once and each name map built once. Both are read-only objects, so sharing them changes nothing in what is loaded
(the converted weights are byte-identical); where gguf-py lacks either name, nothing is patched and the conversion
only takes longer.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager

PATCHED = ("GGUFReader", "get_tensor_name_map")


@contextmanager
def read_gguf_once() -> Iterator[None]:
    import gguf

    originals = {name: getattr(gguf, name, None) for name in PATCHED}
    if any(value is None for value in originals.values()):
        yield
        return
    readers: dict[tuple, object] = {}

    def shared_reader(path, mode: str = "r"):
        key = (os.path.realpath(os.fspath(path)), mode)
        if key not in readers:
            readers[key] = originals["GGUFReader"](path, mode)
        return readers[key]

    gguf.GGUFReader = shared_reader  # transformers imports both names from gguf inside its functions
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(originals["get_tensor_name_map"])
    try:
        yield
    finally:
        for name, value in originals.items():
            setattr(gguf, name, value)
        readers.clear()
