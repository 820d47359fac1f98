"""streamtts: real-time streaming text-to-speech for MOSS-TTS-Delay."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .files import WrittenFiles
from .logstyle import install_fallback
from .model.files import register

__version__ = "0.1.0"

# the runtime calls the model-files step (demo model, fused GGUF); the tooling writes them
register(WrittenFiles())
install_fallback()  # `streamtts: warning: ...` for programs that configured no logging

__all__ = ["Engine", "EngineConfig", "SamplingParams", "AudioChunk", "load_config", "__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from .config import EngineConfig, SamplingParams, load_config
    from .engine import AudioChunk, Engine


def __getattr__(name: str) -> Any:
    # Lazy: `import streamtts` stays cheap (no llama.cpp, no ONNX Runtime).
    if name in ("Engine", "AudioChunk"):
        from . import engine

        return getattr(engine, name)
    if name in ("EngineConfig", "SamplingParams", "load_config"):
        from . import config

        return getattr(config, name)
    raise AttributeError(name)
