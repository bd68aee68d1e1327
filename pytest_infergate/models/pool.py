"""Models loaded once per session, keyed by model, precision and device."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from pytest_infergate.errors import ModelLoadError
from pytest_infergate.models.load import LoadedModel, ModelSource, load_model, load_tokenizer, resolve_model
from pytest_infergate.requirements import import_torch

if TYPE_CHECKING:
    from pytest_infergate.options import Options


class ModelPool:
    """Resolves the session's model once and hands out one LoadedModel per precision.

    A failed load is remembered, so every test that needs that precision reports the same error at once
    instead of retrying a slow load. With `fallback` on, a failed precision is served by the reference
    precision and the record says so (`fallback=True`, with the reason).
    """

    def __init__(self, options: Options):
        self.options = options
        self._source: ModelSource | ModelLoadError | None = None
        self._tokenizer = None
        self._loaded: dict[tuple[str, str, str], LoadedModel] = {}
        self._failed: dict[tuple[str, str, str], ModelLoadError] = {}

    @property
    def source(self) -> ModelSource:
        if isinstance(self._source, ModelLoadError):  # failed once: every test says so at once, without retrying
            raise self._source
        if self._source is None:
            try:
                self._source = resolve_model(self.options.model, self.options.cache_dir)
            except ModelLoadError as exc:
                self._source = exc
                raise
        return self._source

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.source)
        return self._tokenizer

    @property
    def loaded(self) -> list[LoadedModel]:
        return list(self._loaded.values())

    @property
    def any_fallback(self) -> bool:
        return any(m.record.fallback for m in self._loaded.values())

    def get(self, precision: str) -> LoadedModel:
        key = (self.source.path, precision, self.options.device)
        if key in self._loaded:
            return self._loaded[key]
        if key in self._failed:
            raise self._failed[key]
        if self.options.torch_threads:
            torch = import_torch()

            torch.set_num_threads(self.options.torch_threads)
        try:
            model = load_model(self.source, precision, self.options.device, self.options.reference_precision,
                               tokenizer=self.tokenizer)
        except ModelLoadError as exc:
            reference = self.options.reference_precision
            if not self.options.fallback or precision == reference:
                self._failed[key] = exc
                raise
            base = self.get(reference)
            model = LoadedModel(base.model, base.tokenizer, base.source,
                                replace(base.record, requested_precision=precision, fallback=True,
                                        fallback_reason=str(exc)), backend=base.backend)
        self._loaded[key] = model
        return model

    def reference(self) -> LoadedModel:
        return self.get(self.options.reference_precision)
