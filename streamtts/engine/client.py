"""The engine as the server sees it: :class:`EngineClient`, what ``streamtts serve`` calls
(engine/frontend.py's Engine is one; a test may hand the server another)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..config import EngineConfig
from ..core.prompt import PromptTemplate
from ..request import Voice
from .segmented import SpeechEngine

__all__ = ["EngineClient"]


class EngineClient(SpeechEngine, Protocol):
    """Streams (:meth:`SpeechEngine.stream`), voices, the numbers the server reports, and
    its start and close."""

    config: EngineConfig
    info: dict[str, Any]  # what the engine loaded (model, backend, codec): /v1/info, metrics
    warmup_s: float | None  # how long start()'s warm-up took (None: none ran)

    async def start(self) -> object: ...

    async def aclose(self) -> None: ...

    async def generate(self, text: str, **kwargs: Any) -> object: ...

    async def synthesize(self, text: str, **kwargs: Any) -> np.ndarray: ...

    async def encode_voice(
        self, reference: str | Path | bytes | np.ndarray, sample_rate: int | None = None, name: str = ""
    ) -> Voice: ...

    @property
    def prompt_template(self) -> PromptTemplate: ...

    @property
    def active_streams(self) -> int: ...

    @property
    def queued_streams(self) -> int: ...

    def prefix_cache_info(self) -> dict[str, int]: ...

    def admission_info(self) -> dict[str, float]: ...

    def forget_ticks(self) -> None: ...

    def count_text_tokens(self, text: str) -> int: ...
