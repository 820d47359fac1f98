"""One ``/v1/stream`` session as a sans-I/O state machine.

Like ``websockets``' ``protocol.py``: no sockets, no tasks, no engine. The
I/O layer (``app.py``) feeds it what happened (a text frame arrived, the
pipeline produced audio, a segment finished, the client went quiet, the
send buffer stalled) and executes the actions it returns, in order:
send a text or binary frame, configure the speech pipeline, synthesise a
segment, end the input, abort generation, close the connection. Tests drive
it directly (tests/server/test_server_session.py).

States::

    idle --start/text/flush/end--> streaming --end--> ended --last segment done--> closed
      \\______ cancel / fatal error / first-message or idle timeout / slow client ______/

A refused `start` (or a message that may have been one: unreadable, too large)
leaves the session idle until a corrected `start`; text before that is refused, and `end`
ends the session at once (`done`, close 1000).

**Contexts.** A session holds independent streams, its *contexts*: the implicit one (messages
without a ``context_id``) and up to ``max_contexts`` named ones open at once. Each has its own
segmenter, encoder, counts and ``done``, and shares the session's voice, format and options.
A named context is opened by its first message, finished by ``end`` with its id (its ``done``
follows its last audio) and stopped by ``cancel`` with its id (an :class:`Abort` for it alone,
then its ``done``); the session goes on. Its id may not be used again after its ``done``.
``end`` / ``cancel`` without an id still finish / stop the whole session (every context).

Text is cut into segments by :class:`streamtts.text.segmenter.Segmenter`; each
segment becomes a :class:`Synthesize` action. Audio comes back as float32 at
24 kHz and is encoded here (one :class:`StreamEncoder` per context, so the
resampler sees one continuous signal across segment joins).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from ..audio.formats import AudioFormat, StreamEncoder, get_format
from ..constants import FRAME_RATE
from ..errors import (
    ConfigError,
    FieldError,
    InputError,
    VoiceStoreUnavailableError,
)
from ..request import LexiconLayer, StreamStats, Voice, WordTime
from ..request.voices import check_speaker_texts, speaker_number
from ..text.segmenter import (
    DEFAULT_CLAUSE_MIN_CHARS,
    DEFAULT_MAX_CHARS,
    DEFAULT_MIN_CHARS,
    Segmenter,
    SegmenterConfig,
)
from ..timing.modes import check_timestamps
from .actions import Abort, Action, Close, Configure, EndInput, SendAudio, SendText, Synthesize
from .alignment import ContextWords
from .model_names import DEFAULT_MODEL_ID, pick_model
from .protocol import (
    PROTOCOL_VERSION,
    AudioHeader,
    Cancel,
    CloseCode,
    Decoded,
    Done,
    End,
    Error,
    ErrorCode,
    Flush,
    Limits,
    Ready,
    SegmentInfo,
    Sent,
    ServerMessage,
    Start,
    Text,
    decode_client,
    encode,
    error_for_exception,
)
from .start import check_voice_fields, request_options

log = logging.getLogger(__name__)

__all__ = [
    "Abort",
    "Action",
    "Close",
    "Configure",
    "EndInput",
    "SendAudio",
    "SendText",
    "Session",
    "SessionSettings",
    "Synthesize",
]


@dataclass(frozen=True, slots=True)
class SessionSettings:
    max_message_bytes: int = 64 * 1024
    max_text_chars: int = 10_000  # per text message
    max_session_chars: int = 200_000
    idle_timeout_s: float = 60.0
    # Connected and silent this long: closed (a socket that never speaks must not hold a slot
    # for the whole idle timeout).
    first_message_timeout_s: float = 5.0
    default_format: str = "pcm_s16le_24000"
    min_chars: int = DEFAULT_MIN_CHARS
    clause_min_chars: int = DEFAULT_CLAUSE_MIN_CHARS
    max_chars: int = DEFAULT_MAX_CHARS
    max_new_tokens: int | None = None  # cap per segment (a client may ask for less)
    max_contexts: int = 4  # named contexts open at once (each generates on its own)
    # ids of finished named contexts remembered (a reused one is refused with context_closed)
    remembered_contexts: int = 1024
    # voice names that mean the model's own voice (no reference): `default`, or those the
    # config's `voices:` table maps to null
    own_voice_names: frozenset[str] = frozenset({"default"})
    model_ids: tuple[str, ...] = (DEFAULT_MODEL_ID,)  # the served models (the first: default)


State = Literal["idle", "streaming", "ended", "closed"]


@dataclass(slots=True)
class _Numbers:
    chars: int = 0
    segments: int = 0  # cut and submitted
    finished: int = 0  # done or failed
    frames: int = 0
    samples_in: int = 0
    t_first_segment: float | None = None
    t_first_audio: float | None = None
    t_last_audio: float | None = None
    segment_ttfa: list[float] = field(default_factory=list)


@dataclass(slots=True)
class _Context:
    """One stream of the session: the implicit one (id None) or a named one."""

    id: str | None
    segmenter: Segmenter
    encoder: StreamEncoder
    n: _Numbers = field(default_factory=_Numbers)
    words: ContextWords = field(default_factory=ContextWords)  # word times sent (timestamps)
    ended: bool = False  # `end` received: EndInput sent, waiting for pipeline_finished
    finished: bool = False  # the implicit context's pipeline is done (named ones are removed)

    @property
    def busy(self) -> bool:
        return self.n.finished < self.n.segments


class Session:
    """The protocol logic of one connection. Call the ``receive_*``/event methods,
    then :meth:`actions` to get what to do."""

    def __init__(
        self,
        settings: SessionSettings | None = None,
        *,
        voices: Callable[[str], Voice | None] | None = None,
        session_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        sent_audio: Callable[[str | None], float] | None = None,
        unknown_voice: Callable[[str], str] | None = None,
        model: str | None = None,
        model_header: str | None = None,
        lexicons: Callable[[object], tuple[LexiconLayer, ...]] | None = None,
    ) -> None:
        self.settings = settings or SessionSettings()
        # the URL's ?model= and the X-Model header (a balancer routes on them without reading frames)
        self._url_model = model
        self._header_model = model_header
        self.id = session_id or secrets.token_hex(8)
        self._voices = voices or (lambda _id: None)
        # a `start`'s `lexicon` -> the compiled lexicons its text is read with (the server's
        # LexiconStore.layers; raises FieldError naming the entry, or the store's error)
        self._lexicons = lexicons
        # what a `start` naming no voice is told (the server lists the voices it has)
        self._unknown_voice = unknown_voice or (
            lambda name: f"no voice {_clip(name)!r} on this server (upload it with POST /v1/voices)"
        )
        self._clock = clock
        self.state: State = "idle"
        self.format: AudioFormat = get_format(self.settings.default_format)
        self._seg_cfg: SegmenterConfig | None = None
        self._contexts: dict[str | None, _Context] = {}  # open (and the implicit one)
        self._closed_ids: set[str] = set()  # finished named contexts (bounded, oldest dropped)
        self._closed_order: deque[str] = deque()
        self._out: list[Action] = []
        self.n = _Numbers()  # the whole session (every context)
        self.close_code: int | None = None
        self.heard = False  # a first message (any frame) arrived
        self._start_refused = False
        self.timestamps = "none"  # from `start`: "words" | "chars" sends `alignment` messages
        self._sound = False  # `start` had ambient_sound: a context ended without text makes one sound
        # seconds of a context's audio the I/O layer has handed to the socket (cancel's done)
        self._sent_audio = sent_audio or (lambda _cid: 0.0)

    # -- outputs ---------------------------------------------------------------------------------
    def actions(self) -> list[Action]:
        """The actions produced since the last call, in order."""
        out, self._out = self._out, []
        return out

    @property
    def busy(self) -> bool:
        """Segments are being generated (the session is not idle even if the client is quiet)."""
        return any(c.busy for c in self._contexts.values())

    @property
    def has_pending_text(self) -> bool:
        """Some context holds text not yet cut into a segment (waiting for more)."""
        return any(c.segmenter.pending.strip() for c in self._contexts.values())

    @property
    def open_contexts(self) -> list[str]:
        """Ids of the named contexts open now (not yet done)."""
        return [c for c in self._contexts if c is not None]

    @property
    def closed(self) -> bool:
        return self.state == "closed"

    @property
    def quiet(self) -> bool:
        """Nothing the client asked for is outstanding: no segment generating and no partial
        text waiting for more (a drain may close the session now without losing anything)."""
        if self.state not in ("idle", "streaming") or self.busy:
            return False
        return not self.has_pending_text

    # -- client input ----------------------------------------------------------------------------
    def receive_text(self, data: str) -> None:
        """One text frame from the client: :meth:`read_text`, then :meth:`receive_message`."""
        decoded = self.read_text(data)
        if decoded is not None:
            self.receive_message(decoded)

    def read_text(self, data: str) -> Decoded | None:
        """Decode one text frame (the only decode it gets); None when it is refused already
        (the session is closed, or the frame is over the size limit)."""
        if self.closed:
            return None
        self.heard = True
        limit = self.settings.max_message_bytes
        if len(data) * 4 > limit and len(data.encode("utf-8", "surrogatepass")) > limit:
            self._refuse(
                Error(
                    code=ErrorCode.MESSAGE_TOO_LARGE,
                    message=f"message is over the {limit}-byte limit; send text in smaller pieces",
                ),
                may_be_start=True,
            )
            return None
        return decode_client(data)

    def receive_message(self, decoded: Decoded) -> None:
        """Act on a frame :meth:`read_text` decoded."""
        if self.closed:
            return
        msg = decoded.message
        if decoded.error is not None:
            self._refuse(decoded.error, decoded.may_be_start)
            return
        if isinstance(msg, Start):
            self._on_start(msg)
        elif isinstance(msg, Text):
            self._on_text(msg)
        elif isinstance(msg, Flush):
            self._on_flush(msg.context_id)
        elif isinstance(msg, End):
            if msg.context_id is None:
                self._on_end()
            else:
                self._on_end_context(msg.context_id)
        elif isinstance(msg, Cancel):
            if msg.context_id is None:
                self._on_cancel()
            else:
                self._on_cancel_context(msg.context_id)

    def receive_bytes(self, data: bytes) -> None:
        if self.closed:
            return
        self.heard = True
        self._error(
            ErrorCode.BINARY_NOT_SUPPORTED,
            f"binary frames ({len(data)} bytes) are not accepted; send JSON text messages "
            "(upload reference voices with POST /v1/voices)",
        )

    # -- I/O layer events ------------------------------------------------------------------------
    def audio(
        self,
        pcm: npt.NDArray[np.float32],
        frames: int = 0,
        context_id: str | None = None,
        words: list[WordTime] | None = None,
        segment: int = 0,
    ) -> None:
        """New audio from a context's pipeline (float32, 24 kHz, joins already faded); with
        ``timestamps``, the estimated ``words`` whose audio starts in it go out first."""
        ctx = self._contexts.get(context_id)
        if self.closed or ctx is None or ctx.finished:
            return
        for n in (ctx.n, self.n):
            n.frames += frames
            n.samples_in += int(pcm.shape[0])
        if words and self.timestamps != "none":
            self._send(ctx.words.message(words, segment, self.timestamps == "chars", context_id))
        self._send_audio(ctx, ctx.encoder.encode(pcm))

    def segment_done(
        self,
        index: int,
        text: str,
        start_frame: int,
        frames: int,
        stats: StreamStats | None,
        context_id: str | None = None,
    ) -> None:
        ctx = self._segment_finished(context_id)
        if ctx is None:
            return
        ttfa = stats.ttfa_s if stats is not None else float("nan")
        if ttfa == ttfa:
            ctx.n.segment_ttfa.append(ttfa)
            self.n.segment_ttfa.append(ttfa)
        self._send(
            SegmentInfo(
                index=index,
                text=text,
                start_frame=start_frame,
                end_frame=start_frame + frames,
                start_s=round(start_frame / FRAME_RATE, 3),
                end_s=round((start_frame + frames) / FRAME_RATE, 3),
                ttfa_ms=round(1000 * ttfa, 2) if ttfa == ttfa else None,
                finish_reason=stats.finish_reason if stats is not None else "",
                context_id=context_id,
            )
        )

    def segment_failed(
        self, index: int, text: str, exc: BaseException, context_id: str | None = None
    ) -> None:
        ctx = self._segment_finished(context_id)
        if ctx is None:
            return
        code, fatal, close = error_for_exception(exc)
        if not fatal:
            self._error(code, f"segment {index} ({_clip(text)!r}) was skipped: {exc}", context_id)
            return
        if code == ErrorCode.INTERNAL_ERROR:
            log.error("session %s: segment %d failed", self.id, index, exc_info=exc)
        self._fatal(code, f"segment {index} failed: {exc}", close)

    def pipeline_finished(self, context_id: str | None = None) -> None:
        """Every segment of the context is done and no more will come (after its ``end``)."""
        ctx = self._contexts.get(context_id)
        if self.closed or ctx is None or not ctx.ended or ctx.finished:
            return
        self._send_audio(ctx, ctx.encoder.flush())
        if context_id is None:
            ctx.finished = True  # its numbers are the session's: reported in the final done
        else:
            self._send(self._done("end", ctx.n, context_id))
            self._forget(context_id)
        self._maybe_finish()

    def idle_timeout(self) -> None:
        """No client message for ``idle_timeout_s`` while nothing was being generated."""
        t = self.settings.idle_timeout_s
        self._fatal_once(ErrorCode.IDLE_TIMEOUT, f"no message for {t:g} s; closing the idle session", CloseCode.POLICY)

    def first_message_timeout(self) -> None:
        """No frame at all within ``first_message_timeout_s`` of connecting."""
        t = self.settings.first_message_timeout_s
        msg = f"no message within {t:g} s of connecting; send `start` or `text` right after connecting"
        self._fatal_once(ErrorCode.FIRST_MESSAGE_TIMEOUT, msg, CloseCode.POLICY)

    def send_stalled(self, seconds: float) -> None:
        """The client fell ``seconds`` behind a real-time listener: it reads too slowly."""
        if self.closed:
            return
        self._out.append(Abort())
        self._send(
            Error(
                code=ErrorCode.SLOW_CLIENT,
                message=f"the client fell {seconds:g} s behind real-time playback "
                "(it reads slower than real time, or stopped); dropped",
                fatal=True,
            )
        )
        self._close(CloseCode.POLICY, "client too slow", immediate=True)

    def draining(self) -> None:
        """The server is draining and the session is :attr:`quiet`: close it (1001); the
        client reconnects, and the balancer sends it to another replica."""
        self._fatal_once(
            ErrorCode.SERVER_DRAINING,
            "the server is draining (shutting down or restarting): this session is closed "
            "between replies; connect again to continue (the balancer picks another replica)",
            CloseCode.GOING_AWAY,
        )

    def shutdown(self, drain_timeout_s: float) -> None:
        """The server's drain time ran out with this session still busy: cut it (1001)."""
        self._fatal_once(
            ErrorCode.SERVER_SHUTDOWN,
            f"the server is shutting down: its drain time ({drain_timeout_s:g} s) ran out "
            "and this stream was cut; connect again to continue",
            CloseCode.GOING_AWAY,
        )

    def internal_error(self, exc: BaseException) -> None:
        code, _, close = error_for_exception(exc)
        self._fatal(code, f"server error: {exc}", close)

    def connection_lost(self) -> None:
        """The client went away: stop generating."""
        if not self.closed:
            self._out.append(Abort())
            self.state = "closed"

    def _segment_finished(self, context_id: str | None) -> _Context | None:
        """Count a segment of the context as finished; None if nothing is to be sent about it
        (the session or the context has ended)."""
        ctx = self._contexts.get(context_id)
        if self.closed or ctx is None or ctx.finished:
            return None
        ctx.n.finished += 1
        self.n.finished += 1
        return ctx

    # -- message handlers ------------------------------------------------------------------------
    def _on_start(self, msg: Start) -> None:
        if self.state != "idle":
            self._error(
                ErrorCode.ALREADY_STARTED, "`start` must be the first message of a session; ignored"
            )
            return
        self._start_refused = not self._begin(msg)

    def _on_text(self, msg: Text) -> None:
        cid = msg.context_id
        if self.state in ("ended", "closed"):
            self._error(
                ErrorCode.TEXT_AFTER_END, "text after `end` is ignored; open a new session", cid
            )
            return
        if len(msg.text) > self.settings.max_text_chars:
            self._error(
                ErrorCode.TEXT_TOO_LONG,
                f"text message is {len(msg.text)} characters; the limit per message is "
                f"{self.settings.max_text_chars} (split it)",
                cid,
            )
            return
        if self.n.chars + len(msg.text) > self.settings.max_session_chars:
            self._error(
                ErrorCode.SESSION_TEXT_LIMIT,
                f"the session's text would exceed {self.settings.max_session_chars} characters; "
                "this text is ignored (end the session and open a new one)",
                cid,
            )
            return
        if self.state == "idle" and not self._implicit_start():
            return
        ctx = self._context(cid)
        if ctx is None:
            return
        if ctx.ended:
            self._error(
                ErrorCode.TEXT_AFTER_END,
                f"text after `end` of context {cid!r} is ignored; use a new context_id",
                cid,
            )
            return
        self.n.chars += len(msg.text)
        ctx.n.chars += len(msg.text)
        self._submit(ctx, ctx.segmenter.feed(msg.text))
        if msg.flush:
            self._submit(ctx, ctx.segmenter.flush())

    def _on_flush(self, cid: str | None) -> None:
        if self.state in ("ended", "closed"):
            return
        if self.state == "idle" and not self._implicit_start():
            return
        ctx = self._context(cid)
        if ctx is None or ctx.ended:
            return
        self._submit(ctx, ctx.segmenter.flush())

    def _on_end(self) -> None:
        """`end` of the session: every context finishes, then the final `done` and the close."""
        if self.state in ("ended", "closed"):
            return
        if self.state == "idle" and self._start_refused:
            # nothing started, so nothing to finish: `done` and the close now (not `not_started`,
            # which left a client that gave up on its `start` waiting for a close)
            self.state = "ended"
            self._maybe_finish()
            return
        if self.state == "idle" and not self._implicit_start():
            return
        self.state = "ended"
        for ctx in list(self._contexts.values()):
            self._end_context(ctx)
        self._maybe_finish()

    def _on_end_context(self, cid: str) -> None:
        if self.state in ("ended", "closed"):
            return
        if self.state == "idle" and not self._implicit_start():
            return
        ctx = self._context(cid)
        if ctx is not None:
            self._end_context(ctx)

    def _on_cancel(self) -> None:
        """`cancel` of the session: every context stops, each named one gets its `done`."""
        if self.closed:
            return
        self._out.append(Abort())
        for cid, ctx in list(self._contexts.items()):
            if cid is not None:
                self._send(self._done("cancelled", ctx.n, cid, self._sent(ctx)))
                self._forget(cid)
        implicit = self._contexts.get(None)
        self._send(self._done("cancelled", self.n, sent=None if implicit is None else self._sent(implicit)))
        self._close(CloseCode.NORMAL, "cancelled")

    def _on_cancel_context(self, cid: str) -> None:
        """`cancel` of one named context: its generation stops, its unsent audio is dropped,
        its `done` follows; the session and its other contexts go on. A context already done
        is left alone (the client's cancel crossed the `done`)."""
        if self.closed or cid in self._closed_ids:
            return
        ctx = self._contexts.get(cid)
        n = _Numbers() if ctx is None else ctx.n
        if ctx is not None:
            self._out.append(Abort(cid))
        self._send(self._done("cancelled", n, cid, None if ctx is None else self._sent(ctx)))
        self._forget(cid)
        self._maybe_finish()

    # -- contexts --------------------------------------------------------------------------------
    def _context(self, cid: str | None) -> _Context | None:
        """The context ``cid`` (opened now if new); None, with an error sent, when it cannot be:
        finished already, or one context over the cap."""
        ctx = self._contexts.get(cid)
        if ctx is not None:
            return ctx
        if cid is not None:
            if cid in self._closed_ids:
                self._error(
                    ErrorCode.CONTEXT_CLOSED,
                    f"context {cid!r} has finished (its `done` was sent); use a new context_id",
                    cid,
                )
                return None
            cap = self.settings.max_contexts
            if len(self.open_contexts) >= cap:
                self._error(
                    ErrorCode.TOO_MANY_CONTEXTS,
                    f"this session already has {cap} contexts open (the limit); end or cancel "
                    "one first",
                    cid,
                )
                return None
        assert self._seg_cfg is not None
        ctx = _Context(cid, Segmenter(self._seg_cfg), StreamEncoder(self.format))
        self._contexts[cid] = ctx
        return ctx

    def _end_context(self, ctx: _Context) -> None:
        if ctx.ended:
            return
        segments = ctx.segmenter.flush()
        if not segments and not ctx.n.segments and self._sound:
            segments = [""]  # a sound with no words (ambient_sound): the prompt's text is None
        self._submit(ctx, segments)
        ctx.ended = True
        self._out.append(EndInput(ctx.id))

    def _forget(self, cid: str) -> None:
        """A named context is done: drop it, remember its id (bounded)."""
        self._contexts.pop(cid, None)
        if cid in self._closed_ids:
            return
        self._closed_ids.add(cid)
        self._closed_order.append(cid)
        while len(self._closed_order) > self.settings.remembered_contexts:
            self._closed_ids.discard(self._closed_order.popleft())

    def _maybe_finish(self) -> None:
        """After the session's `end`: once every context is done, the final `done` and close."""
        if self.state != "ended":
            return
        if any(c.id is not None or not c.finished for c in self._contexts.values()):
            return
        self._send(self._done("end", self.n))
        self._close(CloseCode.NORMAL, "done")

    # -- helpers ---------------------------------------------------------------------------------
    def _implicit_start(self) -> bool:
        """Text before any `start` starts with the defaults; not after a refused `start`."""
        if self._start_refused:
            self._error(
                ErrorCode.NOT_STARTED,
                "the session's `start` (or a message that may have been it) was refused, see the "
                "error before; send a corrected `start` first",
            )
            return False
        return self._begin(Start())

    def _lookup_voice(self, name: str) -> tuple[bool, Voice | None]:
        """(known, reference): a voice id or configured name; a name of the model's own voice
        is known with no reference."""
        if name in self.settings.own_voice_names:
            return True, None
        ref = self._voices(name)
        return ref is not None, ref

    def _begin(self, msg: Start) -> bool:
        """Validate the settings, emit Configure + ready; False (and an error) if unusable."""
        s = self.settings
        try:
            fmt = get_format(msg.format or s.default_format)
        except ValueError as exc:
            self._error(ErrorCode.INVALID_FORMAT, str(exc))
            return False
        model = self._model(msg.model)
        if model is None:
            return False
        reference: Voice | None = None
        if msg.voice is not None:
            try:
                known, reference = self._lookup_voice(msg.voice)
            except VoiceStoreUnavailableError as exc:
                self._error(ErrorCode.VOICE_STORE_UNAVAILABLE, f"{exc}; try again shortly")
                return False
            if not known:
                self._error(
                    ErrorCode.UNKNOWN_VOICE,
                    self._unknown_voice(msg.voice),
                )
                return False
        try:
            speakers, prefix = self._voice_fields(msg)
        except _FieldError as exc:
            self._error(exc.code, exc.message)
            return False
        try:
            check_voice_fields(reference, speakers, msg.prefix, msg.prefix_text)
            if msg.speaker_texts:
                check_speaker_texts(msg.speaker_texts, msg.speakers, msg.prefix, msg.prefix_text)
            seg_cfg = SegmenterConfig(
                min_chars=s.min_chars if msg.min_chars is None else msg.min_chars,
                clause_min_chars=s.clause_min_chars
                if msg.clause_min_chars is None
                else msg.clause_min_chars,
                max_chars=s.max_chars,
            ).validate()
            timestamps = check_timestamps(msg.timestamps)
            layers = None if self._lexicons is None else self._lexicons(msg.lexicon)
            options = request_options(msg, s.max_new_tokens, normalize=msg.normalize, lexicons=layers)
        except (ValueError, ConfigError) as exc:  # FieldError names the field as the client wrote it
            self._error(ErrorCode.INVALID_OPTION, str(exc))
            return False
        except VoiceStoreUnavailableError as exc:  # a stored lexicon the store could not give
            self._error(ErrorCode.VOICE_STORE_UNAVAILABLE, f"lexicon: {exc}; try again shortly")
            return False
        self.format = fmt
        self.timestamps = timestamps
        self._sound = msg.ambient_sound is not None
        self._seg_cfg = seg_cfg
        self._contexts[None] = _Context(None, Segmenter(seg_cfg), StreamEncoder(fmt))
        self.state = "streaming"
        self._out.append(Configure(reference, options, speakers, prefix, msg.prefix_text, msg.speaker_texts or None, model))
        self._send(
            Ready(
                session=self.id,
                protocol=PROTOCOL_VERSION,
                format=fmt.name,
                encoding=fmt.encoding,
                sample_rate=fmt.sample_rate,
                channels=1,
                voice=msg.voice,
                language=msg.language,
                seed=msg.seed,
                min_chars=seg_cfg.min_chars,
                clause_min_chars=seg_cfg.clause_min_chars,
                limits=Limits(
                    max_message_bytes=s.max_message_bytes,
                    max_text_chars=s.max_text_chars,
                    max_session_chars=s.max_session_chars,
                    idle_timeout_s=s.idle_timeout_s,
                    max_contexts=s.max_contexts,
                ),
                model=model,
            )
        )
        return True

    def _model(self, name: str | None) -> str | None:
        """The served model's id the start (or else the URL) names; None (and an error) if none."""
        named = [("the URL's ?model=", self._url_model), ("the X-Model header", self._header_model), ("the start's model", name)]
        try:
            return pick_model(named, self.settings.model_ids)
        except FieldError as exc:
            self._error(ErrorCode.UNKNOWN_MODEL, str(exc))
            return None

    def model_failed(self, exc: BaseException) -> None:
        """The start's model could not be loaded: the session ends with that error."""
        code, _, close = error_for_exception(exc)
        self._fatal(code, str(exc), close)

    def _voice_fields(self, msg: Start) -> tuple[dict[str, Voice] | None, Voice | None]:
        """The `start`'s speakers and prefix as voices (the I/O layer fetched or encoded them
        before; a lookup that failed there raises its error here)."""
        speakers: dict[str, Voice] | None = None
        if msg.speakers:
            speakers = {}
            for key, value in msg.speakers.items():
                try:
                    tag = f"S{speaker_number(key)}"
                except FieldError as exc:
                    raise _FieldError(ErrorCode.INVALID_OPTION, str(exc)) from None
                if tag in speakers:
                    raise _FieldError(ErrorCode.INVALID_OPTION, f"speakers: {tag} is given twice")
                speakers[tag] = self._field_voice(value, f"speakers.{key}")
        prefix = None if msg.prefix is None else self._field_voice(msg.prefix, "prefix")
        return speakers, prefix

    def _field_voice(self, value: str, field: str) -> Voice:
        try:
            known, voice = self._lookup_voice(value)
        except VoiceStoreUnavailableError as exc:
            raise _FieldError(ErrorCode.VOICE_STORE_UNAVAILABLE, f"{field}: {exc}; try again shortly") from None
        except InputError as exc:  # what the I/O layer found wrong with it (voice_fields.py)
            raise _FieldError(getattr(exc, "code", ErrorCode.INVALID_OPTION), str(exc)) from None
        if not known:
            raise _FieldError(ErrorCode.UNKNOWN_VOICE, f"{field}: no voice {_clip(value)!r} on this server (upload it with POST /v1/voices, or send the clip as base64)")
        if voice is None:
            raise _FieldError(ErrorCode.INVALID_OPTION, f"{field}: {value!r} is the model's own voice, which has no audio to give here")
        return voice

    def _submit(self, ctx: _Context, segments: list[str]) -> None:
        for text in segments:
            now = self._clock()
            for n in (ctx.n, self.n):
                if n.t_first_segment is None:
                    n.t_first_segment = now
            ctx.words.texts[ctx.n.segments] = text
            self._out.append(Synthesize(ctx.n.segments, text, ctx.id))
            ctx.n.segments += 1
            self.n.segments += 1

    def _send_audio(self, ctx: _Context, data: bytes) -> None:
        if not data:
            return
        now = self._clock()
        for n in (ctx.n, self.n):
            if n.t_first_audio is None:
                n.t_first_audio = now
            n.t_last_audio = now
        cid = ctx.id
        header = None if cid is None else encode(AudioHeader(context_id=cid, bytes=len(data)))
        self._out.append(SendAudio(data, len(data) / self.format.bytes_per_second, cid, header))

    def _sent(self, ctx: _Context) -> Sent:
        """How far the client was sent ``ctx``'s audio (the unsent rest is dropped now)."""
        seconds = max(0.0, self._sent_audio(ctx.id))
        words, text = ctx.words.heard(seconds) if self.timestamps != "none" else (None, None)
        return Sent(
            audio_s=round(seconds, 3),
            samples=int(round(seconds * self.format.sample_rate)),
            words=words,
            text=text,
        )

    def _done(
        self, reason: str, n: _Numbers, context_id: str | None = None, sent: Sent | None = None
    ) -> Done:
        audio_s = n.frames / FRAME_RATE
        ttfa = None
        rtf = None
        if n.t_first_segment is not None and n.t_first_audio is not None:
            ttfa = round(1000 * (n.t_first_audio - n.t_first_segment), 2)
            if audio_s > 0 and n.t_last_audio is not None:
                rtf = round((n.t_last_audio - n.t_first_segment) / audio_s, 4)
        return Done(
            reason=reason,
            segments=n.segments,
            frames=n.frames,
            audio_s=round(audio_s, 3),
            ttfa_ms=ttfa,
            rtf=rtf,
            chars=n.chars,
            sent=sent,
            context_id=context_id,
        )

    def _refuse(self, err: Error, may_be_start: bool) -> None:
        """Answer a message that could not be read. One rule for every refused `start`: if
        it may have been the session's `start`, the session waits for a corrected one (text
        is refused with `not_started`) rather than starting with settings nobody asked for."""
        if may_be_start and self.state == "idle":
            self._start_refused = True
        self._send(err)

    def _send(self, msg: ServerMessage) -> None:
        code = msg.code if isinstance(msg, Error) else None
        self._out.append(SendText(encode(msg), code))

    def _error(self, code: str, message: str, context_id: str | None = None) -> None:
        self._send(Error(code=code, message=message, context_id=context_id))

    def _fatal(self, code: str, message: str, close_code: int) -> None:
        self._out.append(Abort())
        self._send(Error(code=code, message=message, fatal=True))
        self._close(close_code, code)

    def _fatal_once(self, code: str, message: str, close_code: int) -> None:
        """:meth:`_fatal` for an end the server decides (a timer, a drain), unless the session
        has already ended."""
        if not self.closed:
            self._fatal(code, message, close_code)

    def _close(self, code: int, reason: str, immediate: bool = False) -> None:
        self.state = "closed"
        self.close_code = code
        self._out.append(Close(code, reason, immediate))


class _FieldError(InputError):
    """A `start` voice field that names no usable voice: the error message to send."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _clip(text: str, n: int = 40) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
