"""A request ready for the engine thread (engine/prepare.py makes it)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..config import SamplingParams
from .handoff import ChunkSink
from .stream import StreamStats

__all__ = ["PreparedRequest"]


@dataclass(slots=True)
class PreparedRequest:
    """A request ready for the engine thread: prompt rows and their embeddings."""

    rid: int
    prompt: np.ndarray  # (S, 1 + n_vq) int64
    prompt_embd: np.ndarray  # (S, H) float32
    sampling: SamplingParams
    seed: int
    max_new_tokens: int
    fixed_frames: int | None
    sink: ChunkSink  # receives chunks / errors (thread-safe): engine/sink.py's StreamSink
    prefix_rows: int = 0  # leading rows shared with other requests (cacheable), 0 = none
    prefix_key: bytes = b""  # digest of those rows
    # the session whose own voice those rows hold (Voice.session): their cached KV snapshot is
    # dropped when it ends, not left to fill the cache; 0: kept while it is used
    prefix_session: int = 0
    # continuation: the prompt's last rows are this many assistant gen-slot rows holding an
    # audio prefix in the delay layout (its frames warm the codec; their samples are not sent)
    audio_prefix_rows: int = 0
    keep_rows: bool = False  # StreamOptions.rows: hand the raw generated rows out on the chunks
    # a session's next segment: starts before new streams and is never refused for capacity
    priority: bool = False
    # the session (a segmented speech pipeline) the request belongs to, 0: none; and how many
    # streams that session runs beside this one while it generates ahead (its next segments):
    # a new session is admitted only with room for them (engine/waiting.py)
    session: int = 0
    reserve: int = 0
    # the session's next segment was already queued when this one started: the session keeps
    # its room between the two (engine/waiting.py)
    next_queued: bool = False
    chunk_frames: tuple[int, ...] = ()  # StreamOptions.chunk_frames; () = the config's
    playback_buffer_s: float = 0.0  # the client's playback buffer (0: not said)
    stats: StreamStats = field(default_factory=StreamStats)
