"""LiveKit Agents: :class:`TTS`, a ``livekit.agents.tts.TTS`` plugin for ``streamtts serve``.

::

    from livekit.agents import AgentSession
    from streamtts.integrations.livekit import TTS

    session = AgentSession(stt=..., llm=..., tts=TTS(url="ws://127.0.0.1:8000", voice="alloy"))

``pip install 'streamtts[livekit]'``. One WebSocket session per ``TTS`` instance, shared by
its streams (:class:`streamtts.client.SharedSession`), one context each:

* :meth:`TTS.stream` (``capabilities.streaming=True``, ``aligned_transcript=True``): text
  pushed in is sent as it comes (the server's segmenter cuts clauses, so token-by-token
  input speaks like the whole text); ``flush()`` speaks what is pending now (the end of
  LiveKit's segment); ``end_input()`` ends the context; audio frames come out through the
  output emitter as they are generated; ``aclose()`` cancels the context: its generation
  stops before the engine's next step and the socket stays open for the next stream;
* :meth:`TTS.synthesize` (chunked): the whole text into one context, its audio streamed out;
* the words come with their (estimated, docs/timing.md) times: the session asks for
  ``timestamps: "words"`` and each word goes to the emitter as a ``TimedString`` before its
  audio, in seconds of the stream's audio (live captions, ``use_tts_aligned_transcript``).

Audio is 16-bit PCM at ``sample_rate`` (resampled on the server: 8, 16, 22.05, 24, 32, 44.1
or 48 kHz). ``voice``: a name of the server's ``voices:`` table, a voice id from
``POST /v1/voices``, or None for the model's own voice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Literal

from ..client import Audio, ContextStream, SharedSession, StreamClient
from ..errors import ServerError
from ..server.protocol import Alignment, Error
from . import missing

try:
    from livekit.agents import (
        DEFAULT_API_CONNECT_OPTIONS,
        APIConnectionError,
        APIConnectOptions,
        APIError,
        tts,
        utils,
    )
    from livekit.agents.types import TimedString
except ImportError as exc:  # pragma: no cover - depends on the install
    raise missing("livekit", "livekit-agents", exc) from exc

log = logging.getLogger(__name__)

__all__ = ["TTS", "ChunkedStream", "SynthesizeStream"]

_CANCEL_TIMEOUT_S = 2.0


class TTS(tts.TTS[Literal["metrics_collected", "error"]]):
    """LiveKit TTS over ``streamtts serve``'s streaming protocol."""

    def __init__(
        self,
        *,
        url: str = "ws://127.0.0.1:8000",
        token: str | None = None,
        voice: str | None = None,
        language: str | None = None,
        seed: int | None = None,
        sampling: Mapping[str, float | int] | None = None,
        sample_rate: int = 24000,
    ) -> None:
        super().__init__(
            capabilities=tts.TTSCapabilities(streaming=True, aligned_transcript=True),
            sample_rate=sample_rate,
            num_channels=1,
        )
        client = StreamClient(
            url,
            token=token,
            voice=voice,
            language=language,
            seed=seed,
            sampling=dict(sampling) if sampling else None,
            format=f"pcm_s16le_{sample_rate}",
            timestamps="words",
        )
        self._shared = SharedSession(client)

    @property
    def model(self) -> str:
        return "moss-tts-delay"

    @property
    def provider(self) -> str:
        return "streamtts"

    @property
    def shared_session(self) -> SharedSession:
        """The WebSocket session the streams share (opened on first use)."""
        return self._shared

    def synthesize(
        self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> ChunkedStream:
        return ChunkedStream(tts=self, input_text=text, conn_options=conn_options)

    def stream(
        self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> SynthesizeStream:
        return SynthesizeStream(tts=self, conn_options=conn_options)

    async def aclose(self) -> None:
        await self._shared.aclose()

    async def _context(self) -> ContextStream:
        try:
            return await self._shared.context()
        except ServerError as exc:
            raise APIConnectionError(f"streamtts server: {exc}") from exc
        except OSError as exc:
            raise APIConnectionError(f"streamtts server unreachable: {exc}") from exc


async def _pump(ctx: ContextStream, emitter: tts.AudioEmitter) -> None:
    """The context's audio into the emitter, until its ``done``."""
    try:
        async for ev in ctx:
            if isinstance(ev, Alignment):
                emitter.push_timed_transcript([_timed(w.word, w.start, w.end) for w in ev.words])
            elif isinstance(ev, Audio):
                emitter.push(ev.data)
            elif isinstance(ev, Error):  # a refusal of this context's text (not fatal)
                raise APIError(f"streamtts server: {ev.code}: {ev.message}", retryable=False)
    except ServerError as exc:
        raise APIConnectionError(f"streamtts server: {exc}") from exc


def _timed(word: str, start: float, end: float) -> TimedString:
    """A word as a transcript delta: LiveKit joins the deltas as they are, so a space
    follows a word of a spaced script (not a CJK character)."""
    cjk = "\u3000" <= word[-1:] <= "\u9fff" or "\uff00" <= word[-1:] <= "\uffef"
    return TimedString(word if cjk else word + " ", start_time=start, end_time=end)


async def _cancel(ctx: ContextStream) -> None:
    """Stop the context on the server (a cancelled task may still send this)."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(ctx.cancel(), _CANCEL_TIMEOUT_S)


def _start(output_emitter: tts.AudioEmitter, sample_rate: int, *, stream: bool) -> None:
    """Our audio as LiveKit's emitter takes it: 16-bit mono PCM at the session's rate."""
    output_emitter.initialize(
        request_id=utils.shortuuid(), sample_rate=sample_rate, num_channels=1,
        mime_type="audio/pcm", stream=stream,
    )  # fmt: skip


class ChunkedStream(tts.ChunkedStream):
    """``synthesize()``: one text, one context, its audio streamed out."""

    def __init__(self, *, tts: TTS, input_text: str, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, input_text=input_text, conn_options=conn_options)
        self._owner: TTS = tts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        _start(output_emitter, self._owner.sample_rate, stream=False)
        ctx = await self._owner._context()
        try:
            await ctx.send_text(self._input_text)
            await ctx.end()
            await _pump(ctx, output_emitter)
        except asyncio.CancelledError:
            await _cancel(ctx)
            raise
        output_emitter.flush()


class SynthesizeStream(tts.SynthesizeStream):
    """``stream()``: pushed text streamed into one context; ``aclose()`` cancels it."""

    def __init__(self, *, tts: TTS, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._owner: TTS = tts
        self.context: ContextStream | None = None  # the server context (tests, logs)

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        _start(output_emitter, self._owner.sample_rate, stream=True)
        ctx = await self._owner._context()
        self.context = ctx

        async def send() -> None:
            async for data in self._input_ch:
                if isinstance(data, self._FlushSentinel):
                    await ctx.flush()  # LiveKit's segment is complete: speak it now
                    continue
                self._mark_started()
                await ctx.send_text(data)
            await ctx.end()  # end_input(): the context finishes, then its done

        sender = asyncio.create_task(send(), name="streamtts-livekit-send")
        output_emitter.start_segment(segment_id=ctx.id)
        try:
            await _pump(ctx, output_emitter)
            await sender
        except asyncio.CancelledError:  # aclose(): stop generating at once
            await _cancel(ctx)
            raise
        finally:
            if not sender.done():
                sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)
        output_emitter.end_segment()
