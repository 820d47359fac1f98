"""What flows between the front end, the engine thread and the decode thread."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..constants import AUDIO_VOCAB, FRAME_RATE, FRAME_S
from ..errors import InputError
from .fields import GenerationFields


class LexiconLayer(Protocol):
    """A compiled pronunciation lexicon (:class:`streamtts.text.lexicon.Lexicon`)."""

    def __len__(self) -> int: ...

    def match(self, text: str, pos: int, token: str) -> tuple[int, str] | None:
        """(end, replacement) of the longest key matching ``text`` at ``pos``; None if none."""


class StreamOptions(GenerationFields, frozen=True, kw_only=True):
    """Everything one request may set besides its text and voices: the request's fields
    (fields.py) and the Python API's own. ``None`` = engine default."""

    normalize: bool | None = None
    # Benchmarks only: force exactly this many frames (gen slot until then, then the delay slot).
    fixed_frames: int | None = None
    # Benchmarks and tests: this stream's chunk sizes in frames (first, then the ramp; the last
    # repeats) instead of the config's chunk_frames, so that one engine compares policies
    chunk_frames: tuple[int, ...] | None = None
    # The speaking rate the word-time estimate assumes until the generation ends (voiced
    # 10 ms hops per syllable); None: a prior per script. Set from an earlier generation in
    # the same voice (segmented.py).
    timing_rate: float | None = None
    # Hand out the raw generated rows (text id + n_vq delayed codes, as the model emitted
    # them) on the chunks (AudioChunk.rows): for checking against the official code.
    rows: bool = False
    # Compiled lexicons matched under ``lexicon`` (the request's own map), in order: the
    # server puts a stored lexicon the request names and its own (``serve --lexicon``) here.
    lexicons: tuple[LexiconLayer, ...] = ()


@dataclass(frozen=True, slots=True)
class Voice:
    """An encoded reference voice: (T, n_vq) codes, reusable across requests; ``clip``: the
    clip it was encoded from (mono float32 at 24 kHz, before loudness normalisation), kept
    so that a continuation can encode several speakers' clips joined end to end (None for
    a voice given as codes)."""

    codes: np.ndarray
    name: str = ""
    clip: np.ndarray | None = field(default=None, repr=False, compare=False)
    # how it was made, when it was designed from a description (POST /v1/voices/design)
    description: str = field(default="", compare=False)
    # the session whose first segment it was cut from (its own voice, of no use once that
    # session ends: engine/segmented.py); 0: a voice any request may use again
    session: int = field(default=0, compare=False)

    @property
    def seconds(self) -> float:
        return float(self.codes.shape[0]) * FRAME_S

    @property
    def n_vq(self) -> int:
        return int(self.codes.shape[1])

    @classmethod
    def from_codes(cls, codes: Any, name: str = "") -> Voice:
        """A voice from pre-encoded codes: (T, n_vq) integers in [0, 1024), T >= 1 (the
        codec encoder's output, e.g. a ``.npy`` written by ``--codes-out``). A voice with more
        levels than a model uses is cut to the model's first n_vq when used; fewer is an
        error then."""
        c = np.asarray(codes)
        what = f"voice {name!r} codes" if name else "voice codes"
        if c.ndim != 2 or c.shape[0] < 1 or c.shape[1] < 1:
            raise InputError(f"{what} must be a (T, n_vq) array with T >= 1, got shape {c.shape}")
        if not np.issubdtype(c.dtype, np.integer):
            raise InputError(f"{what} must be integers, got {c.dtype}")
        if int(c.min()) < 0 or int(c.max()) >= AUDIO_VOCAB:
            raise InputError(
                f"{what} must be in [0, {AUDIO_VOCAB - 1}], got [{int(c.min())}, {int(c.max())}]"
            )
        return cls(codes=np.ascontiguousarray(c, dtype=np.int64), name=name)


# What a request may name as its voice: an encoded Voice, or a clip to encode (path, bytes, samples).
ReferenceLike = Voice | str | Path | bytes | np.ndarray | None
# A dialogue's voices: speaker tag ("S1" for the text's [S1], ...) -> its voice.
SpeakersLike = Mapping[str, ReferenceLike]


@dataclass(frozen=True, slots=True)
class WordTime:
    """One word's *estimated* time (streamtts.timing): seconds from the stream's first
    sample; ``start_char``/``end_char``: its place in the text of its generation."""

    word: str
    start: float
    end: float
    start_char: int = 0
    end_char: int = 0

    def shifted(self, seconds: float) -> WordTime:
        return WordTime(self.word, round(self.start + seconds, 4), round(self.end + seconds, 4), self.start_char, self.end_char)


@dataclass(slots=True)
class AudioChunk:
    """New audio of one stream: ``pcm`` holds only samples not sent before."""

    pcm: np.ndarray  # float32, mono, 24 kHz
    frames: range  # audio frame indices this chunk covers
    codes: np.ndarray  # (len(frames), n_vq) int64, the de-delayed codes of those frames
    step: int  # generation step at which the chunk's last frame was complete
    is_last: bool = False
    tick: int = 0  # engine tick (shared by all streams) that completed it
    # With StreamOptions.timestamps: the words whose (estimated) start lies in the audio so
    # far and were not on an earlier chunk (a word comes no later than its audio); the
    # stream's last chunk carries the rest (it may hold no samples). None: not asked for.
    words: list[WordTime] | None = None
    # With StreamOptions.rows: the (n, 1 + n_vq) int64 rows generated since the previous
    # chunk (the last chunk carries the rest). None: not asked for.
    rows: np.ndarray | None = None

    @property
    def duration_s(self) -> float:
        return len(self.frames) / FRAME_RATE


@dataclass(slots=True)
class StreamStats:
    """Numbers for one stream; times in seconds, measured on the monotonic clock."""

    prompt_rows: int = 0
    prefix_cached_rows: int = 0  # prompt rows loaded from the prefix cache, not computed
    prefill_ticks: int = 0  # llama_decode calls (pieces) the prompt was fed in
    prefill_s: float = 0.0  # wall time of those calls and of loading or storing a cached prefix
    steps: int = 0
    frames: int = 0
    t_submit: float = 0.0
    t_admitted: float = 0.0  # got a slot
    t_prefilled: float = 0.0
    t_first_audio: float = 0.0  # first chunk handed to the consumer
    t_first_made: float = 0.0  # first chunk made (the producer's clock: t_done is too)
    first_audio_step: int = 0  # the step that completed the first chunk's last frame
    t_done: float = 0.0
    prepare_s: float = 0.0  # normalise + tokenise + reference + prompt embedding
    step_s: float = 0.0  # summed wall time of the ticks this stream took part in
    decode_s: float = 0.0  # summed codec time of this stream's windows
    decode_windows: int = 0
    finish_reason: str = ""  # "audio_end", "stop", "max_new_tokens", "context_full", "cancelled", "error"

    @property
    def ttfa_s(self) -> float:
        return self.t_first_audio - self.t_submit if self.t_first_audio else float("nan")

    @property
    def audio_s(self) -> float:
        return self.frames / FRAME_RATE

    @property
    def ms_per_step(self) -> float:
        return 1000.0 * self.step_s / self.steps if self.steps else float("nan")

    @property
    def rtf(self) -> float:
        """Wall time from submit to the last audio over audio duration (< 1 = faster than real time)."""
        end = self.t_done or self.t_first_audio
        return (end - self.t_submit) / self.audio_s if self.frames else float("nan")

    @property
    def ms_per_tick(self) -> float:
        """Wall time per step from the first audio to the last: the tick as the listener lives
        it once audio flows, with all the engine and the machine did between its steps. Both
        ends are the producer's: a consumer that takes its first chunk late (many streams on
        few cores) may take it after the stream was done."""
        steps = self.steps - self.first_audio_step
        start = self.t_first_made or self.t_first_audio
        if not (steps > 0 and start and self.t_done):
            return float("nan")
        return 1000.0 * (self.t_done - start) / steps

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompt_rows": self.prompt_rows,
            "prefix_cached_rows": self.prefix_cached_rows,
            "steps": self.steps,
            "frames": self.frames,
            "audio_s": round(self.audio_s, 3),
            "ttfa_ms": round(1000 * self.ttfa_s, 2),
            "ms_per_step": round(self.ms_per_step, 3),
            "ms_per_tick": round(self.ms_per_tick, 3),
            "prepare_ms": round(1000 * self.prepare_s, 2),
            "prefill_ms": round(1000 * (self.t_prefilled - self.t_admitted), 2) if self.t_prefilled else None,
            "queue_ms": round(1000 * (self.t_admitted - self.t_submit - self.prepare_s), 2) if self.t_admitted else None,
            "decode_ms": round(1000 * self.decode_s, 2),
            "decode_windows": self.decode_windows,
            "rtf": round(self.rtf, 4),
            "finish_reason": self.finish_reason,
        }
