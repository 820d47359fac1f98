"""Pipecat: :class:`StreamTTSService`, a ``WebsocketTTSService`` for ``streamtts serve``.

::

    from streamtts.integrations.pipecat import StreamTTSService

    tts = StreamTTSService(url="ws://127.0.0.1:8000", voice="alloy")
    pipeline = Pipeline([transport.input(), stt, user_agg, llm, tts, transport.output(), ...])

One WebSocket session for the service's life (``pip install 'streamtts[pipecat]'``):

* each Pipecat audio context (one per LLM turn, or per ``TTSSpeakFrame``) is a context of the
  session (docs/protocol.md, Contexts): ``run_tts`` sends the turn's text to it, the end of
  the turn (``flush_audio``) ends it, and the server's ``done`` for it ends the audio context
  (``TTSStoppedFrame``);
* an interruption cancels the interrupted contexts: their generation stops before the
  engine's next step, their unsent audio is dropped, and the socket stays open, so the next
  turn starts at once (no reconnect);
* audio comes as ``TTSAudioRawFrame``s at the pipeline's output sample rate, resampled on
  the server (8, 16, 22.05, 24, 32, 44.1 or 48 kHz);
* text aggregation: ``SENTENCE`` (Pipecat's default) sends each sentence as a segment of its
  own (flushed at once, lowest latency); ``TOKEN`` streams LLM tokens and lets the server's
  segmenter cut clauses (the same segments whatever the tokenisation);
* word timestamps: the session asks for ``timestamps: "words"`` and every ``alignment``
  message goes to Pipecat's ``add_word_timestamps``, so the words come out as
  ``TTSTextFrame``s in step with their audio, and an interrupted turn enters the LLM's
  context as the words that were played, not the whole reply (the times are *estimated*,
  docs/timing.md). The base class is ``WebsocketTTSService`` (one socket, contexts, our own
  reconnect); word timestamps are part of every Pipecat ``TTSService`` (``WordTTSService``
  is deprecated), and ``InterruptibleTTSService`` would reconnect on every barge-in, which
  contexts and ``cancel`` make unnecessary;
* TTFB metrics: from the turn's first text to its first audio (Pipecat's own metric);
* the server's idle timeout is kept at bay by an empty ``flush`` every ``keepalive_s``.

``voice``: a name of the server's ``voices:`` table (``alloy``, ...), a voice id from
``POST /v1/voices``, or None for the model's own voice (the first turn's voice is kept for
the session's later turns). Changing the voice or language reconnects (a session's voice is
fixed at its start).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from ..client import Audio, ClientSession, stream_url
from ..server.protocol import Alignment, Done, Error, SegmentInfo
from . import missing

try:
    from pipecat.frames.frames import (
        ErrorFrame,
        Frame,
        TTSAudioRawFrame,
        TTSStoppedFrame,
    )
    from pipecat.processors.frame_processor import FrameProcessorSetup
    from pipecat.services.settings import TTSSettings
    from pipecat.services.tts_service import TextAggregationMode, WebsocketTTSService
    from websockets.protocol import State
except ImportError as exc:  # pragma: no cover - depends on the install
    raise missing("pipecat", "pipecat-ai", exc) from exc

log = logging.getLogger(__name__)

__all__ = ["StreamTTSService", "StreamTTSSettings"]

DEFAULT_KEEPALIVE_S = 20.0  # well inside the server's default 60 s idle timeout
DEFAULT_SILENCE_TIMEOUT_S = 30.0


class StreamTTSSettings(TTSSettings):
    """Runtime-updatable settings: ``voice`` and ``language`` (``model`` is informative)."""


class StreamTTSService(WebsocketTTSService):
    """Pipecat TTS over one ``/v1/stream`` session, one context per audio context."""

    Settings = StreamTTSSettings
    _settings: StreamTTSSettings

    def __init__(
        self,
        *,
        url: str = "ws://127.0.0.1:8000",
        token: str | None = None,
        voice: str | None = None,
        language: str | None = None,
        seed: int | None = None,
        sampling: Mapping[str, float | int] | None = None,
        sample_rate: int | None = None,
        text_aggregation_mode: TextAggregationMode | None = None,
        keepalive_s: float | None = DEFAULT_KEEPALIVE_S,
        settings: StreamTTSSettings | None = None,
        **kwargs: Any,
    ) -> None:
        """Args:
        url: the server (``ws://host:port``; ``/v1/stream`` is added).
        token: the server's ``--token``.
        voice, language: see the module doc; ``settings`` wins over them.
        seed: segment i of each context uses ``seed + i`` (reproducible speech).
        sampling: sampling overrides (``audio_temperature``, ...; 0 = greedy).
        sample_rate: output rate; default: the pipeline's ``audio_out_sample_rate``.
        text_aggregation_mode: ``SENTENCE`` (default) or ``TOKEN``.
        keepalive_s: seconds between keepalives (None: none).
        """
        defaults = StreamTTSSettings(model="moss-tts-delay", voice=voice, language=language)
        # Pipecat ends an audio context that stays silent this long; the server always ends
        # ours with `done`, and a loaded CPU server may take more than Pipecat's 3 s default
        # to a turn's first audio
        kwargs.setdefault("stop_frame_timeout_s", DEFAULT_SILENCE_TIMEOUT_S)
        if settings is not None:
            defaults.apply_update(settings)
        super().__init__(
            text_aggregation_mode=text_aggregation_mode,
            push_text_frames=False,  # the words come from the server's word timestamps
            pause_frame_processing=False,  # audio carries its context id
            push_start_frame=True,  # the base opens the audio context and times TTFB
            sample_rate=sample_rate,
            settings=defaults,
            **kwargs,
        )
        self._url = stream_url(url)
        self._token = token
        self._seed = seed
        self._sampling = dict(sampling) if sampling else None
        self._keepalive_s = keepalive_s
        self._session: ClientSession | None = None
        self._receive_task: Any = None

    def can_generate_metrics(self) -> bool:
        return True

    @property
    def session(self) -> ClientSession | None:
        """The open server session (its ``ready`` says the format, limits, ...)."""
        return self._session

    # -- connection ----------------------------------------------------------------------------
    # pipecat's own FrameProcessor.setup narrows BaseObject.setup: the override is theirs
    async def setup(self, setup: FrameProcessorSetup) -> None:  # type: ignore[override]
        await super().setup(setup)  # the sample rate is known from here on
        await self._connect()

    async def _connect(self) -> None:
        await super()._connect()  # type: ignore[no-untyped-call]  # unannotated in pipecat
        await self._connect_websocket()
        if self._websocket is not None and self._receive_task is None:
            self._receive_task = self.create_task(self._receive_task_handler(self._report_error))
        if self._keepalive_s:
            self._create_keepalive_task(self._keepalive_s)

    async def _disconnect(self) -> None:
        await super()._disconnect()  # type: ignore[no-untyped-call]  # unannotated in pipecat
        await self._cancel_keepalive_task()  # type: ignore[no-untyped-call]  # unannotated in pipecat
        if self._receive_task is not None:
            await self.cancel_task(self._receive_task)
            self._receive_task = None
        await self._disconnect_websocket()

    async def _connect_websocket(self) -> None:
        if self._websocket is not None and self._websocket.state is State.OPEN:
            return
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else None
        try:
            ws = await self._websocket_connect(
                self._url, additional_headers=headers, max_size=None, compression=None
            )
            self._session = await ClientSession.open(
                ws,
                format=f"pcm_s16le_{self.sample_rate}",
                voice=self._settings.voice or None,
                language=self._settings.language or None,
                seed=self._seed,
                sampling=self._sampling,
                timestamps="words",
            )
            self._websocket = ws
            await self._call_event_handler("on_connected")
        except Exception as e:  # refused, unreachable: reported as Pipecat reports errors
            self._websocket = None
            self._session = None
            await self.push_error(error_msg=f"{self}: cannot open a session: {e}", exception=e)
            await self._call_event_handler("on_connection_error", f"{e}")

    async def _disconnect_websocket(self) -> None:
        try:
            await self.stop_all_metrics()  # type: ignore[no-untyped-call]  # unannotated in pipecat
            if self._websocket is not None:
                await self._websocket.close()
        except Exception as e:
            log.debug("%s: closing: %s", self, e)
        finally:
            self._websocket = None
            self._session = None
            await self._call_event_handler("on_disconnected")

    async def _send_keepalive(self) -> None:
        if self._session is not None:
            await self._session.flush()  # the implicit context holds nothing: a no-op

    # TTSService narrows AIService's ServiceSettings to TTSSettings: the override is pipecat's
    async def _update_settings(self, delta: TTSSettings) -> dict[str, Any]:  # type: ignore[override]
        changed: dict[str, Any] = await super()._update_settings(delta)
        if changed.keys() & {"voice", "language"} and self._websocket is not None:
            # A session's voice and language are fixed at its start: a new session.
            await self._disconnect()
            await self._connect()
        return changed

    # -- receiving -----------------------------------------------------------------------------
    async def _receive_messages(self) -> None:
        session = self._session
        if session is None:
            raise ConnectionError(f"{self}: no session")
        async for ev in session:
            await self._on_server_event(ev)

    async def _on_server_event(self, ev: Audio | SegmentInfo | Alignment | Done | Error) -> None:
        """One event of the session (tests wrap this to watch the wire)."""
        cid = getattr(ev, "context_id", None)
        if isinstance(ev, Alignment):
            # seconds of the context's audio: Pipecat counts them from its first audio frame
            if cid is not None and self.audio_context_available(cid):
                await self.add_word_timestamps([(w.word, w.start) for w in ev.words], cid)
        elif isinstance(ev, Audio):
            if cid is not None and self.audio_context_available(cid):
                frame = TTSAudioRawFrame(ev.data, self.sample_rate, 1, context_id=cid)
                await self.append_to_audio_context(cid, frame)
        elif isinstance(ev, Done):
            if cid is not None and self.audio_context_available(cid):
                await self.append_to_audio_context(cid, TTSStoppedFrame(context_id=cid))
                await self.remove_audio_context(cid)
        elif isinstance(ev, Error):  # not fatal (fatal ones raise ServerError: reconnect)
            await self.push_error(error_msg=f"{self}: server: {ev.code}: {ev.message}")

    # -- Pipecat's TTS interface ----------------------------------------------------------------
    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """Send ``text`` to the context; its audio arrives on the receive task."""
        if self._session is None or self._websocket is None or self._websocket.state is not State.OPEN:
            await self._connect()
        session = self._session
        if session is None:
            yield ErrorFrame(error=f"{self}: not connected to {self._url}")
            return
        try:
            # SENTENCE: each sentence is a segment now; TOKEN: the server cuts clauses
            await session.send_text(text, flush=not self._is_streaming_tokens, context_id=context_id)
            await self.start_tts_usage_metrics(text)
        except Exception as e:
            yield ErrorFrame(error=f"{self}: sending failed: {e}")
            yield TTSStoppedFrame(context_id=context_id)
            await self._disconnect()
            await self._connect()
            return
        yield None

    async def flush_audio(self, context_id: str | None = None) -> None:
        """The turn's text is complete: end its context (the server speaks what is pending,
        then sends the context's ``done``)."""
        cid = context_id or self.get_active_audio_context_id()
        if cid and self._session is not None:
            try:
                await self._session.end(context_id=cid)
            except Exception as e:
                log.debug("%s: end of %s not sent: %s", self, cid, e)

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """Barge-in: cancel the context on the server (generation stops at the next step)."""
        await self.stop_all_metrics()  # type: ignore[no-untyped-call]  # unannotated in pipecat
        if context_id and self._session is not None:
            try:
                await self._session.cancel(context_id=context_id)
            except Exception as e:
                log.debug("%s: cancel of %s not sent: %s", self, context_id, e)
        await super().on_audio_context_interrupted(context_id)

