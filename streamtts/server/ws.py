"""The ``/v1/stream`` WebSocket endpoint: thin asyncio I/O around :class:`Session`.

Tasks per connection:

* *receiver*: reads frames, feeds the session, enforces the first-message and idle timeouts;
* one *runner* per context (the implicit one, and each named one the client opens): iterates
  that context's speech pipeline (:class:`SegmentedSpeech`) and feeds its audio and segment
  events to the session; cancelling a context cancels its runner alone;
* *sender*: writes the outbox (every frame, in order) to the socket; a named context's audio
  frame goes right after its ``audio`` header message.

The outbox is bounded in audio seconds (``send_buffer_s``). When it is full
the runner waits (and with it the generation: the engine's buffered-ahead pause
holds a stream whose audio is not taken). The sender writes audio at most
``send_lead_s`` ahead of what the listener has consumed (pacing.py: a real-time
player's position, or further where the client's answers to our acknowledgement
pings show it has read further), so the socket never holds tens of seconds of
audio in front of a ping. A client that falls ``send_stall_s`` behind a real-time
listener is too slow to play in real time (or stopped reading): it is dropped
(close 1008) and its generation aborted. A disconnect ends the receiver; the runner is cancelled
at once, which aborts the generation before the engine's next step. A task that dies of an
exception (a bug) is logged and the client gets ``internal_error`` (1011), not a dropped socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from starlette.websockets import WebSocket, WebSocketDisconnect

from ..constants import FRAME_RATE
from ..engine.client import EngineClient
from ..engine.segmented import SegmentAudio, SegmentDone, SegmentedSpeech, SegmentFailed
from ..errors import InputError, ModelLoadError, VoiceStoreUnavailableError
from ..request import LexiconLayer, StreamOptions, Voice
from ..request.voices import speaker_number
from .app_state import ServerState
from .drain import refuse_websocket
from .hosts import deny_websocket
from .logs import REFUSALS
from .model_names import MODEL_HEADER
from .models import ServedModel
from .pacing import PING_EXTENSION, Listener
from .protocol import ClientMessage, CloseCode, Error, ErrorCode, Start, encode
from .session import (
    Abort,
    Action,
    Close,
    Configure,
    EndInput,
    SendAudio,
    SendText,
    Session,
    Synthesize,
)
from .voice_fields import VoiceFieldError, resolve_voice

log = logging.getLogger(__name__)

__all__ = ["Outbox", "websocket_endpoint"]

_CLOSE_TIMEOUT_S = 1.0
_SLOW_POLL_S = 0.5  # how often a full outbox asks whether its client fell behind real time


def _continued(message: Start) -> set[str]:
    """The ``speakers.KEY`` fields whose clips a `start`'s ``speaker_texts`` continues (the
    session checks the keys; one it cannot read is left to that check)."""
    wanted: set[int] = set()
    for key in message.speaker_texts or {}:
        try:
            wanted.add(speaker_number(key))
        except InputError:
            continue
    out: set[str] = set()
    for key in message.speakers or {}:
        try:
            if speaker_number(key) in wanted:
                out.add(f"speakers.{key}")
        except InputError:
            continue
    return out


@dataclass(frozen=True, slots=True)
class ContextFrame:
    """An audio frame of a named context: its ``audio`` header message, then its bytes."""

    header: str
    data: bytes


Item = str | bytes | ContextFrame | Close


class Outbox:
    """Frames waiting for the sender; audio bounded by ``limit_s`` seconds."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self._items: deque[tuple[Item, float, str | None]] = deque()  # (item, seconds, context)
        self.audio_s = 0.0  # audio seconds queued
        self.sent_s = 0.0  # audio seconds taken by the sender so far
        self.sent_by: dict[str | None, float] = {}  # ... per context (None: the implicit one)
        self._audio_items = 0
        self._ready = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: Item, seconds: float = 0.0, context_id: str | None = None) -> None:
        self._items.append((item, seconds, context_id))
        if isinstance(item, (bytes, ContextFrame)):
            self._audio_items += 1
            self.audio_s += seconds
            if self.audio_s >= self.limit_s:
                self._room.clear()
        self._ready.set()

    async def get(self) -> Item:
        return (await self.next())[0]

    async def next(self) -> tuple[Item, float]:
        """The next frame and its audio seconds (0 for a message)."""
        await self.wait_ready()
        return self.pop()

    async def wait_ready(self) -> None:
        """Until something waits to be sent."""
        while not self._items:
            self._ready.clear()
            await self._ready.wait()

    def audio_next(self) -> bool:
        """Whether the frame to go next is audio (a message goes without pacing)."""
        return bool(self._items) and _is_audio(self._items[0][0])

    def pop(self) -> tuple[Item, float]:
        """The next frame and its audio seconds (there is one: :meth:`wait_ready`)."""
        item, seconds, cid = self._items.popleft()
        if isinstance(item, (bytes, ContextFrame)):
            self._audio_items -= 1
            self.audio_s -= seconds
            self.sent_s += seconds
            self.sent_by[cid] = self.sent_by.get(cid, 0.0) + seconds
            if self.audio_s < self.limit_s:
                self._room.set()
            if self._audio_items == 0:
                self.audio_s = 0.0  # no float drift across a long session
        return item, seconds

    async def wait_room(self, too_slow: Callable[[], bool], poll_s: float) -> bool:
        """Wait until audio may be added; False when ``too_slow()`` says so meanwhile (it is
        asked every ``poll_s`` while the outbox is full)."""
        while not self._room.is_set():
            if too_slow():
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), poll_s)
        return True

    def drop_audio(self, context_id: str | None = None) -> None:
        """Abort: audio not yet sent is discarded (messages stay, in order): every context's,
        or (``context_id``) one named context's."""
        if context_id is None:
            self._items = deque(it for it in self._items if not _is_audio(it[0]))
            self._reset()
            return
        self._items = deque(
            it for it in self._items if not (_is_audio(it[0]) and it[2] == context_id)
        )
        audio = [it[1] for it in self._items if _is_audio(it[0])]
        self._audio_items = len(audio)
        self.audio_s = sum(audio)
        if self.audio_s < self.limit_s:
            self._room.set()

    def clear(self) -> None:
        self._items.clear()
        self._reset()

    def _reset(self) -> None:
        self._audio_items = 0
        self.audio_s = 0.0
        self._room.set()


def _is_audio(item: Item) -> bool:
    return isinstance(item, (bytes, ContextFrame))


class WsConnection:
    kind = "ws"

    def __init__(self, ws: WebSocket, state: ServerState) -> None:
        self.ws = ws
        self.state = state
        # the served model the start chose, held loaded while the session lasts (server/models.py)
        self._model: ServedModel | None = None
        self._engine: EngineClient | None = None
        self.settings = state.settings
        self.outbox = Outbox(state.settings.send_buffer_s)
        # acknowledgement pings (uvicorn_ws.py); absent under another ASGI server
        self._ack_ping: Callable[[], asyncio.Future[None] | None] | None = ws.scope.get(
            "extensions", {}
        ).get(PING_EXTENSION)
        self.listener = Listener(state.settings.send_lead_s, acks=self._ack_ping is not None)
        self._wake = asyncio.Event()  # for the paced sender: an acknowledgement or an abort
        self._ack_pending = False
        self.session = Session(
            state.settings.session,
            voices=self._voice,
            sent_audio=lambda cid: self.outbox.sent_by.get(cid, 0.0),
            unknown_voice=state.unknown_voice,
            model=ws.query_params.get("model"),
            model_header=ws.headers.get(MODEL_HEADER),
            lexicons=self._lexicons,
        )
        # A voice fetch (shared store) that failed: the session's lookup raises it.
        self._voice_errors: dict[str, VoiceStoreUnavailableError | InputError] = {}
        self._lexicon_error: VoiceStoreUnavailableError | None = None  # likewise the start's lexicon
        # the `start`'s speakers and prefix values, resolved (a base64 clip encoded) before
        # the session reads them
        self._field_voices: dict[str, Voice] = {}
        self._background: set[asyncio.Task[None]] = set()
        # one speech pipeline and runner task per context (None: the implicit one)
        self.pipelines: dict[str | None, SegmentedSpeech] = {}
        self.runners: dict[str | None, asyncio.Task[None]] = {}
        self._reference: Voice | None = None  # from `start`, else the first voice a context fixed
        self._speakers: dict[str, Voice] | None = None  # a dialogue's voices (`start`)
        self._prefix: tuple[Voice, str | None] | None = None  # continued by the first pipeline
        self._speaker_texts: dict[str, str] | None = None  # or the speakers' clips, by it
        self._timing_rate: float | None = None  # speaking rate the word times measured last
        self._options = StreamOptions()
        self.sender: asyncio.Task[None] | None = None
        self.receiver: asyncio.Task[None] | None = None
        self.urgent_close: Close | None = None
        self._ttfa_seen = False
        self._client = ws.client.host if ws.client else "?"

    async def run(self) -> None:
        self.sender = asyncio.create_task(self._send_loop(), name=f"ws-send-{self.session.id}")
        self.receiver = asyncio.create_task(self._receive_loop(), name=f"ws-recv-{self.session.id}")
        try:
            done, _ = await asyncio.wait(
                {self.sender, self.receiver}, return_when=asyncio.FIRST_COMPLETED
            )
            await self._report_crash(done)
        finally:
            # Stop generating first: a disconnect must free the engine slot right away.
            self.session.connection_lost()
            await self._stop_runners()
            for t in (self.sender, self.receiver):
                t.cancel()
            await asyncio.gather(self.sender, self.receiver, return_exceptions=True)
            if self.urgent_close is not None:
                await self._close_now(self.urgent_close)
            if self._model is not None:
                self.state.models.release(self._model)
                self._model = None

    async def _report_crash(self, done: set[asyncio.Task[None]]) -> None:
        """A task that died of an exception is a bug: log it once, tell the client (1011)."""
        for task in done:
            exc = None if task.cancelled() else task.exception()
            if exc is None:
                continue
            log.error("session %s: %s failed", self.session.id, task.get_name(), exc_info=exc)
            if self.session.closed:
                return
            self.session.internal_error(exc)
            for a in self.session.actions():  # the sender may be the one that died: send here
                if isinstance(a, SendText):
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(self.ws.send_text(a.data), _CLOSE_TIMEOUT_S)
                elif isinstance(a, Close):
                    self.urgent_close = a
            return

    # -- receiving ----------------------------------------------------------------------------
    async def _receive_loop(self) -> None:
        limits = self.settings.session
        while True:
            # before the first frame the shorter of the two timeouts applies (an idle timeout
            # configured below the first-message one must not lose to it)
            first = not self.session.heard and (
                limits.first_message_timeout_s <= limits.idle_timeout_s
            )
            wait = limits.first_message_timeout_s if first else limits.idle_timeout_s
            try:
                msg = await asyncio.wait_for(self.ws.receive(), wait)
            except TimeoutError:
                if self.session.busy or len(self.outbox) or self.session.closed:
                    continue
                if not first:
                    self.session.idle_timeout()
                else:
                    REFUSALS.log("closed WebSocket from %s: silent after connecting", self._client)
                    self.session.first_message_timeout()
                await self._apply(self.session.actions())
                continue
            except WebSocketDisconnect:
                return
            kind = msg["type"]
            if kind == "websocket.disconnect":
                return
            if kind != "websocket.receive":  # pragma: no cover - ASGI says nothing else comes
                continue
            text = msg.get("text")
            if text is not None:
                decoded = self.session.read_text(text)  # decoded once, here
                if decoded is not None:
                    if self.session.state == "idle":
                        await self._fetch_voice(decoded.message)
                    self.session.receive_message(decoded)
            else:
                self.session.receive_bytes(msg.get("bytes") or b"")
            await self._apply(self.session.actions())

    # -- voices and drain ---------------------------------------------------------------------
    async def _fetch_voice(self, message: ClientMessage | None) -> None:
        """Before a `start` naming a voice reaches the (synchronous) session: bring the voice
        into this replica's cache from the shared store, or note why it cannot be had.
        (A message that did not decode: the session reports what is wrong with it.)"""
        if not isinstance(message, Start):
            return
        if message.voice:
            try:
                await self.state.voices.fetch(message.voice)
            except VoiceStoreUnavailableError as exc:
                self._voice_errors[message.voice] = exc
        if isinstance(message.lexicon, str):  # a stored lexicon: into this replica's cache
            try:
                await self.state.lexicons.fetch(message.lexicon)
            except VoiceStoreUnavailableError as exc:
                self._lexicon_error = exc
        fields = [(f"speakers.{k}", v) for k, v in (message.speakers or {}).items()]
        if message.prefix is not None:
            fields.append(("prefix", message.prefix))
        clips = _continued(message)
        for name, value in fields:
            try:
                self._field_voices[value] = await resolve_voice(self.state, value, name, keep_clip=name in clips)
            except VoiceFieldError as exc:
                self._voice_errors[value] = exc

    def _lexicons(self, value: object) -> tuple[LexiconLayer, ...]:
        """The session's lookup of a `start`'s lexicon (fetched above, or why it was not)."""
        err, self._lexicon_error = self._lexicon_error, None
        if err is not None:
            raise err
        return self.state.lexicons.layers(value)

    def _voice(self, voice_id: str) -> Voice | None:
        err = self._voice_errors.pop(voice_id, None)
        if err is not None:
            raise err
        found = self._field_voices.get(voice_id)
        # a configured name, or a voice fetched already
        return found if found is not None else self.state.named_voice(voice_id)

    @property
    def quiet(self) -> bool:
        """Nothing asked for is in progress or waiting to be sent (drain.py)."""
        return self.session.quiet and not len(self.outbox)

    def leave(self) -> None:
        self.session.draining()
        self._apply_later()

    def cut(self, timeout_s: float) -> None:
        self.session.shutdown(timeout_s)
        self._apply_later()

    def _apply_later(self) -> None:
        task = asyncio.get_running_loop().create_task(self._apply(self.session.actions()))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- sending ------------------------------------------------------------------------------
    async def _send_loop(self) -> None:
        try:
            while True:
                await self.outbox.wait_ready()
                # audio is paced while it is still queued: an abort meanwhile drops it, and the
                # error and close behind it go at once (a drain's cut, a barge-in)
                if self.outbox.audio_next() and await self._pace():
                    continue
                item, seconds = self.outbox.pop()
                if isinstance(item, Close):
                    await self.ws.close(item.code, item.reason)
                    return
                if isinstance(item, str):
                    await self.ws.send_text(item)
                    continue
                if isinstance(item, ContextFrame):
                    await self.ws.send_text(item.header)
                    item = item.data
                await self.ws.send_bytes(item)
                self.listener.sent(seconds)
                self._ask_ack()
        except (WebSocketDisconnect, OSError, RuntimeError) as exc:
            log.debug("session %s: send ended: %s", self.session.id, exc)

    async def _pace(self) -> bool:
        """Wait while the listener has not consumed enough for more audio (pacing.py), until
        an acknowledgement, an abort or the time a real-time listener needs; False at once
        when audio may go now."""
        wait = self.listener.wait_s()
        if wait <= 0:
            return False
        self._wake.clear()
        # a timer, not wait_for: this runs for every frame of every paced session, and
        # wait_for's task, timeout and cancellation were a tenth of the event loop's time
        timer = asyncio.get_running_loop().call_later(wait, self._wake.set)
        try:
            await self._wake.wait()
        finally:
            timer.cancel()
        return True

    def _ask_ack(self) -> None:
        """One acknowledgement ping in flight, behind the audio sent last."""
        if self._ack_ping is None or self._ack_pending:
            return
        done = self._ack_ping()
        if done is None:
            return
        self._ack_pending = True
        upto = self.listener.sent_s
        done.add_done_callback(lambda d: self._on_ack(d, upto))

    def _on_ack(self, done: asyncio.Future[None], upto: float) -> None:
        self._ack_pending = False
        if done.cancelled():
            return
        self.listener.acked(upto)
        self._wake.set()
        if self.listener.sent_s > upto:
            self._ask_ack()

    async def _close_now(self, close: Close) -> None:
        # The client may not be reading: a close frame can block behind unsent data.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(close.code, close.reason), _CLOSE_TIMEOUT_S)

    # -- the speech pipelines (one per context) ------------------------------------------------
    def _pipeline(self, cid: str | None) -> SegmentedSpeech:
        """The context's pipeline, started with its runner on first use. It speaks in the
        session's voice: the `start` voice, or else the first one a context's audio fixed."""
        p = self.pipelines.get(cid)
        if p is not None:
            return p
        if self._reference is None:
            self._reference = next(
                (q.reference for q in self.pipelines.values() if q.reference is not None), None
            )
        prefix, prefix_text = self._prefix or (None, None)
        speaker_texts, self._speaker_texts = self._speaker_texts, None
        self._prefix = None  # the session's first pipeline continues it; later ones, its voices
        assert self._engine is not None  # set by Configure, before any pipeline
        p = SegmentedSpeech(
            self._engine,
            reference=self._reference,
            options=self._options,
            speakers=self._speakers,
            prefix=prefix,
            prefix_text=prefix_text,
            speaker_texts=speaker_texts,
            lookahead=self.settings.lookahead,
            continuity_frames=self.settings.continuity_frames,
            fade_ms=self.settings.fade_ms,
        )
        # a new context (a new turn) starts from the rate the session's voice spoke at so far
        rates = [q.timing_rate for q in self.pipelines.values() if q.timing_rate is not None]
        p.timing_rate = rates[-1] if rates else self._timing_rate
        self.pipelines[cid] = p
        name = f"ws-run-{self.session.id}" + ("" if cid is None else f"-{cid}")
        self.runners[cid] = asyncio.create_task(self._run_pipeline(p, cid), name=name)
        return p

    async def _run_pipeline(self, pipeline: SegmentedSpeech, cid: str | None) -> None:
        session = self.session
        try:
            async with contextlib.aclosing(pipeline.events()) as events:
                async for ev in events:
                    if isinstance(ev, SegmentAudio):
                        session.audio(ev.pcm, ev.frames, cid, ev.words, ev.index)
                    elif isinstance(ev, SegmentDone):
                        session.segment_done(
                            ev.index, ev.text, ev.start_frame, ev.frames, ev.stats, cid
                        )
                        self.state.metrics.segments_total.inc()
                    elif isinstance(ev, SegmentFailed):
                        session.segment_failed(ev.index, ev.text, ev.error, cid)
                    await self._apply(session.actions())
                    if session.closed:
                        return
            session.pipeline_finished(cid)
            await self._apply(session.actions())
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("session %s: pipeline failed", session.id)
            session.internal_error(exc)
            await self._apply(session.actions())
        finally:
            if pipeline.timing_rate is not None:
                self._timing_rate = pipeline.timing_rate
            if cid is not None and self.pipelines.get(cid) is pipeline:
                if pipeline.reference is not None and self._reference is None:
                    self._reference = pipeline.reference
                del self.pipelines[cid]  # a finished named context leaves nothing behind
                self.runners.pop(cid, None)

    async def _stop_runners(self, cid: str | None = None, *, every: bool = True) -> None:
        """Cancel the runner of context ``cid``, or (``every``) of every context; returns once
        they have stopped: their generations are aborted before the engine's next step."""
        keys = list(self.runners) if every else [cid]
        tasks = []
        for k in keys:
            r = self.runners.get(k)
            if r is None or r.done() or r is asyncio.current_task():
                continue
            r.cancel()
            tasks.append(r)
            if k is not None:
                self.runners.pop(k, None)
                self.pipelines.pop(k, None)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- actions ------------------------------------------------------------------------------
    async def _apply(self, actions: list[Action]) -> None:
        m = self.state.metrics
        for a in actions:
            if isinstance(a, SendAudio):
                if not await self.outbox.wait_room(self._too_slow, _SLOW_POLL_S):
                    m.slow_clients_total.inc()
                    log.warning(
                        "session %s: client %.1f s behind real time, read nothing for %.1f s; "
                        "dropping it", self.session.id, self.listener.behind_s(),
                        self.listener.unread_for_s(),
                    )  # fmt: skip
                    self.session.send_stalled(self.settings.send_stall_s)
                    await self._apply(self.session.actions())
                    return
                if a.header is None:
                    self.outbox.put(a.data, a.seconds)
                else:
                    self.outbox.put(ContextFrame(a.header, a.data), a.seconds, a.context_id)
                m.audio_seconds_total.inc(a.seconds)
                self._observe_ttfa()
            elif isinstance(a, SendText):
                if a.error_code is not None:
                    m.errors_total.inc(code=a.error_code)
                self.outbox.put(a.data)
            elif isinstance(a, Configure):
                if not await self._take_model(a.model):
                    await self._apply(self.session.actions())
                    return
                self._reference, self._options = a.reference, a.options
                self._speakers = a.speakers
                self._prefix = None if a.prefix is None else (a.prefix, a.prefix_text)
                self._speaker_texts = a.speaker_texts
                self._field_voices.clear()
                self._pipeline(None)  # the implicit context's, at once (as before contexts)
            elif isinstance(a, Synthesize):
                self._pipeline(a.context_id).add(a.text)
            elif isinstance(a, EndInput):
                self._pipeline(a.context_id).end()
            elif isinstance(a, Abort):
                self.outbox.drop_audio(a.context_id)
                self._wake.set()
                # the runners themselves return once the session is closed
                await self._stop_runners(a.context_id, every=a.context_id is None)
            elif isinstance(a, Close):
                if a.immediate:
                    self.outbox.clear()
                    self.urgent_close = a
                    if self.sender is not None:
                        self.sender.cancel()
                else:
                    self.outbox.put(a)
                if a.code == CloseCode.NORMAL and self.session.state == "closed":
                    self._observe_rtf()

    async def _take_model(self, model_id: str) -> bool:
        """Hold the start's model for the session, loading it if it is not (the session waits);
        a failed load ends the session with its error (False)."""
        m = self.state.models.models[model_id]
        try:
            self._engine = await self.state.models.acquire(m)
        except ModelLoadError as exc:
            self.session.model_failed(exc)
            return False
        self._model = m
        return True

    def _too_slow(self) -> bool:
        return self.listener.too_slow(self.settings.send_stall_s)

    def _observe_ttfa(self) -> None:
        n = self.session.n
        if not self._ttfa_seen and n.t_first_audio is not None and n.t_first_segment is not None:
            self._ttfa_seen = True
            self.state.metrics.ttfa.observe(n.t_first_audio - n.t_first_segment)

    def _observe_rtf(self) -> None:
        n = self.session.n
        if n.frames and n.t_last_audio is not None and n.t_first_segment is not None:
            self.state.metrics.rtf.observe((n.t_last_audio - n.t_first_segment) / (n.frames / FRAME_RATE))


async def websocket_endpoint(ws: WebSocket) -> None:
    state: ServerState = ws.app.state.streamtts
    client = ws.client.host if ws.client else ""
    if not state.origin_ok(ws.headers):
        origin = ws.headers.get("origin")
        state.metrics.errors_total.inc(code=ErrorCode.FORBIDDEN_ORIGIN)
        REFUSALS.log("refused WebSocket from %s: origin %r", client, origin)
        await deny_websocket(ws, 403, ErrorCode.FORBIDDEN_ORIGIN, f"origin {origin!r} is not allowed")
        return
    if not state.token_ok(ws.headers, ws.query_params):
        state.metrics.errors_total.inc(code=ErrorCode.UNAUTHORIZED)
        REFUSALS.log("refused WebSocket from %s: no valid token", client)
        await deny_websocket(ws, 401, ErrorCode.UNAUTHORIZED, state.TOKEN_REFUSED)
        return
    if state.drain.active:
        await refuse_websocket(ws, state.drain)
        return
    refused = state.try_acquire("ws", client)
    if refused is not None:
        # Accept, then refuse: browsers cannot see a handshake's HTTP status, but they see
        # the error message and the close code.
        state.metrics.errors_total.inc(code=refused)
        REFUSALS.log("refused WebSocket from %s: %s", client, refused)
        await ws.accept()
        msg = Error(code=refused, message=state.refusal_message(refused), fatal=True)
        with contextlib.suppress(Exception):
            await ws.send_text(encode(msg))
            await ws.close(CloseCode.TRY_AGAIN_LATER, refused)
        return
    try:
        await ws.accept()
        conn = WsConnection(ws, state)
        with state.drain.tracking(conn):
            await conn.run()
    finally:
        state.release(client)
