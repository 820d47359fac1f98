"""What a request is: its fields, voices and rules (checked once), and what flows between threads."""

from __future__ import annotations

from .fields import GENERATION_FIELDS, PROMPT_FIELDS, GenerationFields, PromptFields
from .handoff import ChunkSink, Outbox
from .prepared import PreparedRequest
from .rules import FieldError, check
from .stream import (
    AudioChunk,
    LexiconLayer,
    ReferenceLike,
    SpeakersLike,
    StreamOptions,
    StreamStats,
    Voice,
    WordTime,
)
from .voices import SegmentSpeakers, VoiceRequest, speaker_number, speaker_tuple

__all__ = [
    "GENERATION_FIELDS",
    "PROMPT_FIELDS",
    "AudioChunk",
    "ChunkSink",
    "FieldError",
    "GenerationFields",
    "LexiconLayer",
    "Outbox",
    "PreparedRequest",
    "PromptFields",
    "ReferenceLike",
    "SegmentSpeakers",
    "SpeakersLike",
    "StreamOptions",
    "StreamStats",
    "Voice",
    "VoiceRequest",
    "WordTime",
    "check",
    "speaker_number",
    "speaker_tuple",
]
