"""Models: resolve a spec (built-in alias, directory, .gguf, hub id) to a local directory, load it in one precision,
and keep one loaded model per precision for a session. No pytest here; torch is imported only when loading."""

from pytest_infergate.models.load import LoadedModel, LoadRecord, ModelPool, load_model, load_tokenizer
from pytest_infergate.models.sources import ModelSource, resolve_model
from pytest_infergate.requirements import PRECISIONS, QUANTIZED

__all__ = ["PRECISIONS", "QUANTIZED", "LoadRecord", "LoadedModel", "ModelPool", "ModelSource", "load_model",
           "load_tokenizer", "resolve_model"]
