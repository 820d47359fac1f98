"""The engine: asyncio front end, engine thread, decode thread, and what feeds them."""

from __future__ import annotations

from .frontend import AudioChunk, AudioStream, Engine, Synthesis, Voice

__all__ = ["AudioChunk", "AudioStream", "Engine", "Synthesis", "Voice"]
