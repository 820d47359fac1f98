"""The asyncio front end: ``Engine.stream()`` and ``Engine.synthesize()``.

The front end only hands data out. Model loading and request preparation run
on worker threads, generation on the engine thread, codec decoding on the
decode thread. Leaving an ``async for`` early, ``aclose()``, or cancelling the
consuming task becomes an abort: the engine frees the stream's slot and KV
cache before its next step.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from ..config import EngineConfig, SamplingParams, load_config
from ..errors import EngineClosedError, OverloadedError
from ..request import (
    AudioChunk,
    ReferenceLike,
    SpeakersLike,
    StreamOptions,
    StreamStats,
    Voice,
    VoiceRequest,
)
from .prepare import LongText, Preparer
from .sink import StreamSink
from .timed import ChunkTimer, wants_timestamps

if TYPE_CHECKING:
    from ..core.prompt import PromptTemplate
    from .backbone_calls import BackboneFactory, BackboneLike
    from .decoding import DecodeWorker
    from .long_text import LongTextStream
    from .loop import EngineCore

log = logging.getLogger(__name__)

__all__ = ["AudioChunk", "AudioStream", "Engine", "Synthesis", "Voice"]

WARMUP_TEXT = "Warming up."
# two steps: the prompt's prefill and llama.cpp's one-row graph; no audio frame is due yet
WARMUP_STEPS = 2


@dataclass(slots=True)
class Synthesis:
    """A whole utterance: waveform, de-delayed codes and the stream's numbers."""

    pcm: np.ndarray
    codes: np.ndarray
    stats: StreamStats


class AudioStream:
    """One request's audio, as an async iterator of :class:`AudioChunk`.

    Breaking out of ``async for`` drops the last reference and aborts the
    request at once (``__del__``); cancelling the consuming task or
    ``aclose()`` aborts too; ``async with engine.stream(...) as s`` makes it
    explicit. The generation is not started until the first ``__anext__``.

    The request is prepared (normalised, tokenised, embedded) on a worker thread when
    it starts. Text longer than one generation fits in the context comes back from
    there as segments; the stream then speaks them in one voice
    (:class:`~streamtts.engine.long_text.LongTextStream`) and ``segments`` lists them.
    """

    def __init__(
        self,
        engine: Engine,
        text: str,
        voices: VoiceRequest[ReferenceLike],
        options: StreamOptions,
    ) -> None:
        self._engine = engine
        self.rid = next(engine._rids)
        self.stats = StreamStats(t_submit=time.monotonic())
        self.segments: list[str] | None = None  # set when the text is spoken in segments
        # once started, the (S, 1 + n_vq) prompt rows of its one generation (None: segments)
        self.prompt: np.ndarray | None = None
        self._text = text
        self._voices = voices
        self._options = options
        self._sink: StreamSink | None = None
        self._long: LongTextStream | None = None
        self._done = False
        self._timer: ChunkTimer | None = None  # word times asked for (options.timestamps)
        self._next_frame = 0
        # a session's next segment (set before it starts): admitted before new streams and
        # never refused for capacity (engine/capacity.py)
        self.priority = False
        self.session = 0  # the segmented pipeline it belongs to (0: none) ...
        self.reserve = 0  # ... and the streams that pipeline runs beside it (waiting.py)
        self.next_queued = False  # ... whose next segment is queued already (waiting.py)

    @property
    def segments_done(self) -> int:
        """How many of ``segments`` were spoken to their end so far (0 without segments)."""
        return self._long.done if self._long is not None else 0

    def __aiter__(self) -> AudioStream:
        return self

    async def __anext__(self) -> AudioChunk:
        if self._done:
            raise StopAsyncIteration
        try:
            if self._sink is None and self._long is None:
                await self._start()
            if self._long is not None:
                return await self._long.__anext__()
            assert self._sink is not None
            item = await self._sink.get()
        except StopAsyncIteration:  # the segments are all spoken
            self._done = True
            raise
        except BaseException:  # CancelledError, or preparation failed
            await self.aclose()
            raise
        if item is None:
            self._done = True
            rest = None if self._timer is None else await self._timer.rest(self._engine.ids.n_vq, self._next_frame)
            if rest is None:
                raise StopAsyncIteration
            return rest
        if isinstance(item, BaseException):
            self._done = True
            raise item
        self._next_frame = item.frames.stop
        if self._timer is not None:
            try:
                await self._timer.on_chunk(item)
            except BaseException:  # cancelled while its words were placed
                await self.aclose()
                raise
        return item

    @property
    def timing_rate(self) -> float | None:
        """After the end, with word times asked for: this generation's speaking rate (what
        the next generation in the same voice may assume, ``StreamOptions.timing_rate``)."""
        return None if self._timer is None else self._timer.measured_rate

    async def _start(self) -> None:
        engine = self._engine
        core = engine._require_started()
        if core.queued_streams >= engine.config.queue_size:
            raise OverloadedError(
                f"all {core.capacity} stream slots are busy and {core.queued_streams} requests are waiting"
            )
        refused = None if self.priority else core.refusal(self.reserve)
        if refused is not None:  # at once, before the request is prepared
            core.admission.refused_early += 1
            raise refused
        sink = StreamSink(asyncio.get_running_loop(), self.stats)
        v = self._voices
        req = await asyncio.to_thread(
            functools.partial(engine._preparer.prepare, speakers=v.speakers, prefix=v.prefix, prefix_text=v.prefix_text,
                              speaker_texts=v.speaker_texts),
            self.rid, self._text, v.reference, self._options, sink, self.stats,
        )  # fmt: skip
        if isinstance(req, LongText):
            from .long_text import LongTextStream

            self.segments = req.segments
            # the segments' requests normalise nothing again: the instruction goes as prepared
            # ... and the lexicons go compiled
            options = msgspec.structs.replace(
                self._options, instruction=req.instruction, lexicon=None, lexicons=req.lexicons
            )
            self._long = LongTextStream(
                engine, req.segments, req.voice, options, stats=self.stats,
                speakers=req.speakers, prefix=req.prefix,
            )  # fmt: skip
            return
        self._sink = sink
        self.prompt = req.prompt
        req.priority, req.session, req.reserve = self.priority, self.session, self.reserve
        req.next_queued = self.next_queued
        if wants_timestamps(self._options):
            self._timer = ChunkTimer(self._text, self._options)
        core.submit(req)

    async def __aenter__(self) -> AudioStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._abort()
        if self._long is not None:
            await self._long.aclose()

    def _abort(self) -> None:
        if not self._done:
            self._done = True
            if self._sink is not None:
                self._sink.cancelled = True
                self._engine._abort(self.rid)

    def __del__(self) -> None:  # the consumer dropped the stream without finishing it
        if not getattr(self, "_done", True):
            self._abort()


class Engine:
    """Loads the model once and serves streams from it.

    ``Engine.from_config()`` with no argument uses the synthetic demo model
    (written on first use into the user's cache directory).
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config.validate()
        self._rids = itertools.count(1)
        self._core: EngineCore | None = None
        self._decoder: DecodeWorker | None = None
        self._backbone: BackboneLike | None = None
        self._preparer: Preparer = None  # type: ignore[assignment]
        self._closed = False
        self.info: dict[str, Any] = {}
        self.warmup_s: float | None = None  # how long start()'s warm-up took (None: none ran)
        # Tests and the orchestration benchmark swap llama.cpp for a stand-in here.
        self.backbone_factory: BackboneFactory | None = None
        self.codec_factory: Any = None  # (config, ids) -> a codec stand-in (bench --null-codec)

    @classmethod
    def from_config(cls, config: str | Path | EngineConfig | None = None, **overrides: Any) -> Engine:
        if isinstance(config, EngineConfig):
            cfg = config
            given = {k: v for k, v in overrides.items() if v is not None}
            for k, v in given.items():
                setattr(cfg, k, v)
            if cfg.explicit_keys is not None:  # overrides are the user's choice too
                cfg.explicit_keys = cfg.explicit_keys | set(given)
            return cls(cfg.validate())
        if config is None:
            from ..model.files import model_files

            config = model_files().demo_config()  # written on first use (streamtts/files.py)
            log.debug("no config given: using the synthetic demo model at %s", Path(config).parent)
        return cls(load_config(config, **overrides))

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> Engine:
        if self._core is None:
            await asyncio.to_thread(self._load)
            if self.config.warmup:
                await self._warm_up()
        return self

    async def _warm_up(self) -> None:
        """A two-step request of the default voice, so the first real one pays none of the
        one-off costs: its prompt prefix is cached (a request prefills only its own rows),
        llama.cpp has built its one-row graph, the heads' threads and the sampler ran once
        (the codec's first call ran at load). Its steps leave the step profile."""
        t0 = time.perf_counter()
        s = self.stream(WARMUP_TEXT, seed=0, max_new_tokens=WARMUP_STEPS)
        async with s:
            async for _ in s:
                pass
        self.reset_profile()
        self.forget_ticks()  # one-off costs are not what a tick costs
        self.warmup_s = time.perf_counter() - t0
        log.debug("warm-up took %.0f ms", 1000 * self.warmup_s)

    async def __aenter__(self) -> Engine:
        return await self.start()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Stop the threads and free native memory (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._core is not None:
            self._core.stop()
        if self._decoder is not None:
            self._decoder.close()
        if self._backbone is not None:
            self._backbone.close()

    def load(self) -> Engine:
        """Blocking load, for synchronous callers."""
        if self._core is None:
            self._load()
        return self

    def _load(self) -> None:
        from .assemble import build_runtime

        rt = build_runtime(self.config, self.backbone_factory, self.codec_factory)
        self.config = rt.config  # with the model's own defaults for the keys the user left unset
        self._backbone = rt.backbone
        self._decoder = rt.decoder
        self._core = rt.core
        self._preparer = rt.preparer
        self.info = rt.info
        self.ids = rt.ids

    def _require_started(self) -> EngineCore:
        if self._closed:
            raise EngineClosedError("engine is closed")
        if self._core is None:
            raise EngineClosedError("engine not started: use `async with Engine.from_config(...)` or `await engine.start()`")
        return self._core

    def _abort(self, rid: int) -> None:
        if self._core is not None and not self._closed:
            self._core.abort(rid)

    def end_session(self, session: int) -> None:
        """A segmented session (``stream(...).session``) starts no more streams: the room
        admission holds for its next segments is free (engine/waiting.py). Any thread."""
        if self._core is not None and not self._closed:
            self._core.end_session(session)

    # -- requests -----------------------------------------------------------------------------
    def stream(
        self,
        text: str,
        *,
        reference: ReferenceLike = None,
        speakers: SpeakersLike | None = None,
        prefix: ReferenceLike = None,
        prefix_text: str | None = None,
        speaker_texts: Mapping[str, str] | None = None,
        language: str | None = None,
        seed: int | None = None,
        sampling: SamplingParams | None = None,
        max_new_tokens: int | None = None,
        options: StreamOptions | None = None,
    ) -> AudioStream:
        """Stream speech for ``text``: chunks arrive as soon as frames are decoded.

        ``options`` carries every setting; the keyword shortcuts override it.
        ``reference``: the voice to clone (a clip: path, bytes, samples; or a Voice).
        ``speakers``: a dialogue's voices instead, ``{"S1": ..., "S2": ...}`` for the text's
        ``[S1]``, ``[S2]`` tags. ``prefix``: audio to continue (a clip or a Voice, e.g.
        ``Voice.from_codes``), ``prefix_text`` its transcript (goes before ``text``). Or
        ``speaker_texts``, ``{"S1": "what S1's clip says", ...}``: continue the speakers' own
        clips (MOSS-TTSD's app), all of them encoded joined end to end as one prefix, their
        transcripts tagged and merged before the dialogue (:meth:`speaker_prefix`).
        An empty ``text`` is valid with ``options.ambient_sound``.
        Text longer than one generation fits in the context is spoken as
        segments in one voice (``stream.segments`` lists them once it started); a
        reference clip is encoded once for all of them, and every segment of a dialogue
        carries every speaker's voice.
        """
        opts = options or StreamOptions()
        short = {"language": language, "seed": seed, "sampling": sampling, "max_new_tokens": max_new_tokens}
        changes = {k: v for k, v in short.items() if v is not None}
        if changes:
            import msgspec

            opts = msgspec.structs.replace(opts, **changes)
        voices = VoiceRequest(
            reference=reference, speakers=speakers, prefix=prefix, prefix_text=prefix_text, speaker_texts=speaker_texts
        )
        return AudioStream(self, text, voices, opts)

    async def generate(self, text: str, **kwargs: Any) -> Synthesis:
        """The whole utterance at once (same path as :meth:`stream`)."""
        s = self.stream(text, **kwargs)
        pcm: list[np.ndarray] = []
        codes: list[np.ndarray] = []
        async with s:
            async for chunk in s:
                pcm.append(chunk.pcm)
                codes.append(chunk.codes)
        n_vq = self.ids.n_vq
        return Synthesis(
            pcm=np.concatenate(pcm) if pcm else np.zeros(0, np.float32),
            codes=np.concatenate(codes) if codes else np.zeros((0, n_vq), np.int64),
            stats=s.stats,
        )

    async def synthesize(self, text: str, **kwargs: Any) -> np.ndarray:
        return (await self.generate(text, **kwargs)).pcm

    async def encode_voice(self, reference: str | Path | bytes | np.ndarray, sample_rate: int | None = None, name: str = "") -> Voice:
        """Encode a reference clip once; pass the Voice as ``reference`` to later requests."""
        self._require_started()
        return await asyncio.to_thread(self._preparer.encode_voice, reference, sample_rate, name)

    async def speaker_prefix(self, speakers: SpeakersLike, speaker_texts: Mapping[str, str]) -> tuple[Voice, str]:
        """The prefix and its transcript that continue the speakers' own clips (``stream``'s
        ``speaker_texts``), for a front door that passes them as ``prefix``/``prefix_text``:
        the clips joined end to end, encoded once; the transcripts tagged."""
        self._require_started()
        return await asyncio.to_thread(self._preparer.speaker_prefix, speakers, speaker_texts)

    # -- introspection --------------------------------------------------------------------------
    @property
    def prompt_template(self) -> PromptTemplate:
        """The template every prompt is built with (``prompt_template``; core/prompt.py)."""
        self._require_started()
        return self._preparer.prompts.template

    @property
    def model_kind(self) -> str:
        """The family member loaded (``moss-tts``, ``moss-ttsd``, ...; core/family.py)."""
        self._require_started()
        return self._preparer.member.kind

    @property
    def active_streams(self) -> int:
        return 0 if self._core is None else int(self._core.active_streams)

    @property
    def queued_streams(self) -> int:
        return 0 if self._core is None else int(self._core.queued_streams)

    def forget_ticks(self) -> None:
        """Drop the tick times admission measured so far (after a warm-up)."""
        if self._core is not None:
            self._core.admission.forget_ticks()

    def admission_info(self) -> dict[str, float]:
        """The measured capacity and the admission decisions so far (engine/capacity.py),
        and how far the stream furthest behind a real-time listener is (``lag_max_s``)."""
        core = self._core
        if core is None:
            return {}
        info: dict[str, float] = core.admission.info()
        due = core.slots.audio_due  # when each stream's listener runs dry (-inf: no audio yet)
        live = due[np.isfinite(due)]
        info["lag_max_s"] = max(0.0, time.monotonic() - float(live.min())) if live.size else 0.0
        return info

    def threads_chosen(self) -> dict[int, int]:
        """llama.cpp's threads per decode, by the fewest rows of each group probed so far
        (engine/thread_tuner.py); empty when a thread count was given or the layers are on
        a GPU."""
        core = self._core
        tuner = None if core is None else core.calls.tuner
        return {} if tuner is None else tuner.chosen()

    def prefix_cache_info(self) -> dict[str, int]:
        """Entries, bytes, hits and misses of the prompt-prefix cache (see prefix_cache.py)."""
        return {} if self._core is None else self._core.prefix_cache.info()

    def reset_profile(self) -> None:
        if self._core is not None:
            self._core.profile = type(self._core.profile)()

    def step_profile(self) -> dict[str, float]:
        return {} if self._core is None else dict(self._core.profile.per_step_ms())

    def count_text_tokens(self, text: str) -> int:
        """Text tokens of ``text`` as the model's tokenizer cuts it (no normalisation)."""
        self._require_started()
        return len(self._preparer.tokenizer.encode(text))

    def fastest_backbone_ms(self) -> float | None:
        """The fastest one-row backbone decode so far (ms), None before any."""
        t = None if self._core is None else self._core.profile.backbone_min_1row
        return None if t is None or t == float("inf") else 1000.0 * t
