"""Blocking wrapper for scripts: the async engine on a private event-loop thread.

    from streamtts.sync import SyncEngine
    with SyncEngine() as tts:                     # demo model; or SyncEngine("configs/x.yaml")
        for chunk in tts.stream("Hello there."):  # chunks as they are generated (kwargs: Engine.stream)
            ...
        wav = tts.synthesize("Hello again.")
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .closing import Closing
from .config import EngineConfig
from .engine.frontend import Engine, Synthesis
from .request import AudioChunk, Voice


class SyncEngine(Closing):
    def __init__(self, config: str | Path | EngineConfig | None = None, **overrides: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="streamtts-sync", daemon=True)
        self._thread.start()
        self.engine = Engine.from_config(config, **overrides)
        self._call(self.engine.start())

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def stream(self, text: str, **kwargs: Any) -> Iterator[AudioChunk]:
        s = self.engine.stream(text, **kwargs)
        it = s.__aiter__()
        try:
            while True:
                try:
                    yield self._call(it.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._call(s.aclose())

    def generate(self, text: str, **kwargs: Any) -> Synthesis:
        result: Synthesis = self._call(self.engine.generate(text, **kwargs))
        return result

    def synthesize(self, text: str, **kwargs: Any) -> np.ndarray:
        return self.generate(text, **kwargs).pcm

    def encode_voice(self, reference: Any, sample_rate: int | None = None, name: str = "") -> Voice:
        """Encode a clip once (see :meth:`Engine.encode_voice`); ``stream(..., reference=v)``,
        ``speakers={"S1": v, ...}`` or ``prefix=v`` take it."""
        voice: Voice = self._call(self.engine.encode_voice(reference, sample_rate, name))
        return voice

    def close(self) -> None:
        if self._loop.is_running():
            self._call(self.engine.aclose())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
