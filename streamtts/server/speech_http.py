"""``POST /v1/audio/speech``: OpenAI-compatible, streamed as it is generated.

Accepts OpenAI's request body (``model``, ``input``, ``voice``,
``instructions``, ``response_format``, ``speed``, ``stream_format``) plus our
``seed``, ``language``, ``sampling`` and ``max_new_tokens``. ``response_format``: every
one of OpenAI's (``mp3``, the default, ``opus``, ``aac``, ``wav``, ``pcm``) streamed as
it is produced, ``flac`` whole at the end (openai_formats.py), or any name of
:data:`streamtts.audio.formats.FORMATS`. ``speed`` 0.25 to 4.0 (FFmpeg's ``atempo``).
``stream_format: "sse"`` sends ``speech.audio.delta`` events (base64 audio) and a final
``speech.audio.done``; with ``timestamps: "words"`` (SSE only) a ``speech.alignment`` event
with the estimated times of the words goes before the audio that holds them. ``voice``: a name of the config's ``voices:`` table (by default
OpenAI's names, the model's own voice; voice_names.py) or an id from ``POST /v1/voices``.
``instructions`` go to the prompt's instruction field. The prompt's other fields come as
extras: ``language`` (an ISO code or a name), ``quality``, ``tokens``, ``ambient_sound``
(then ``input`` may be empty: a sound), ``sound_event``; a dialogue's ``speakers``
(``{"S1": voice, ...}``, instead of ``voice``) and a continuation's ``prefix`` and
``prefix_text`` (voice_fields.py says what a voice value may be).

Long input is cut by the same segmenter as the WebSocket and spoken by the
same pipeline (one voice, clean joins). Errors before the first audio get a
proper status (400, 404, 503); after it the stream ends early (SSE: an
``error`` event first).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Send

from ..constants import FRAME_RATE, SAMPLE_RATE
from ..core.prompt import check_template_fields
from ..core.speakers import check_speakers
from ..engine.client import EngineClient
from ..engine.segmented import (
    SegmentAudio,
    SegmentDone,
    SegmentedSpeech,
    SegmentEvent,
    SegmentFailed,
)
from ..errors import (
    FieldError,
    InputError,
    ModelLoadError,
    OverloadedError,
    VoiceStoreUnavailableError,
)
from ..request import GenerationFields, StreamOptions, Voice, WordTime
from ..request.voices import check_speaker_texts, speaker_number, speaker_tuple, tagged_text
from ..text.segmenter import Segmenter, SegmenterConfig
from ..timing.modes import check_timestamps
from .app_state import ServerState
from .drain import RETRY_AFTER_S, HttpStream
from .logs import REFUSALS
from .model_names import MODEL_HEADER, pick_model
from .openai_formats import (
    SpeechFormat,
    SpeechOutput,
    SpeechRequestError,
    check_speed,
    resolve_format,
)
from .protocol import ErrorCode, error_for_exception
from .start import check_voice_fields, http_error, request_options
from .voice_fields import VoiceFieldError, resolve_voices

log = logging.getLogger(__name__)

__all__ = ["SpeechRequest", "speech_endpoint"]


class SpeechRequest(GenerationFields, frozen=True, kw_only=True):
    """OpenAI's body and the request's fields (request/fields.py); the prompt's instruction
    field comes as OpenAI's ``instructions``."""

    input: str
    model: str = "streamtts"
    voice: str | None = None
    instructions: str | None = None
    response_format: str = "mp3"  # OpenAI's default
    speed: float = 1.0
    stream_format: str = "audio"
    # ours
    speakers: dict[str, str] | None = None
    prefix: str | None = None
    prefix_text: str | None = None
    # continue the speakers' own clips (MOSS-TTSD's app): {"S1": what S1's clip says, ...}
    speaker_texts: dict[str, str] | None = None


def error_response(
    status: int,
    code: str,
    message: str,
    kind: str = "invalid_request_error",
    param: str | None = None,
) -> JSONResponse:
    """OpenAI's error shape, with our stable code (and the request field at fault)."""
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": code}},
        status_code=status,
    )


_STATUS = {
    ErrorCode.INVALID_TEXT: 400,
    ErrorCode.PROMPT_TOO_LONG: 400,
    ErrorCode.OVERLOADED: 503,
    ErrorCode.QUEUE_TIMEOUT: 503,
    ErrorCode.SERVER_SHUTDOWN: 503,
}


def store_unavailable(s: ServerState, exc: VoiceStoreUnavailableError) -> Response:
    """503 for a voice or lexicon route whose shared store cannot be reached."""
    s.metrics.errors_total.inc(code=ErrorCode.VOICE_STORE_UNAVAILABLE)
    resp = error_response(503, ErrorCode.VOICE_STORE_UNAVAILABLE, str(exc), "server_error")
    resp.headers["Retry-After"] = "5"
    return resp


def check_access(state: ServerState, request: Request) -> Response | None:
    """403 for a browser on a foreign origin, 401 without the token; None when allowed."""
    m = state.metrics
    client = request.client.host if request.client else "?"
    if not state.origin_ok(request.headers):
        m.errors_total.inc(code=ErrorCode.FORBIDDEN_ORIGIN)
        origin = request.headers.get("origin")
        REFUSALS.log("refused %s %s from %s: origin %r", request.method, request.url.path, client, origin)
        return error_response(
            403, ErrorCode.FORBIDDEN_ORIGIN, f"origin {origin!r} is not allowed", "permission_error"
        )
    if not state.token_ok(request.headers, request.query_params):
        m.errors_total.inc(code=ErrorCode.UNAUTHORIZED)
        REFUSALS.log("refused %s %s from %s: no valid token", request.method, request.url.path, client)
        return error_response(
            401, ErrorCode.UNAUTHORIZED, state.TOKEN_REFUSED, "authentication_error"
        )
    return None


async def read_body(request: Request, limit: int) -> bytes | None:
    """The body, or None when it is over ``limit`` bytes (read no further than that)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        return None
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)


async def read_request(state: ServerState, request: Request, limit: int, what: str) -> bytes | Response:
    """Access check, then the body; an error response (401/403/413) instead when refused."""
    denied = check_access(state, request)
    if denied is not None:
        return denied
    body = await read_body(request, limit)
    if body is None:
        state.metrics.errors_total.inc(code=ErrorCode.MESSAGE_TOO_LARGE)
        return error_response(413, ErrorCode.MESSAGE_TOO_LARGE, f"{what} over {limit} bytes")
    return body


async def speech_endpoint(request: Request) -> Response:
    state: ServerState = request.app.state.streamtts
    m = state.metrics
    body = await read_request(state, request, state.settings.max_http_body_bytes, "body")
    if isinstance(body, Response):
        return body
    try:
        req = msgspec.json.decode(body, type=SpeechRequest)
        # the URL's ?model= and the X-Model header (what a balancer routes on), and the body's
        served = state.models.models[
            pick_model(
                [
                    ("the URL's ?model=", request.query_params.get("model")),
                    ("the X-Model header", request.headers.get(MODEL_HEADER)),
                    ("the body's model", req.model),
                ],
                state.models.ids,
            )
        ]
    except FieldError as exc:
        m.errors_total.inc(code=ErrorCode.UNKNOWN_MODEL)
        return error_response(400, ErrorCode.UNKNOWN_MODEL, str(exc), param="model")
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
        m.errors_total.inc(code=ErrorCode.INVALID_REQUEST)
        return error_response(400, ErrorCode.INVALID_REQUEST, str(exc))
    except RecursionError:  # msgspec's guard against deep nesting
        m.errors_total.inc(code=ErrorCode.INVALID_REQUEST)
        return error_response(400, ErrorCode.INVALID_REQUEST, "the JSON body is nested too deeply")
    try:  # loaded on demand: this request waits; a failed load is its error
        engine = await state.models.acquire(served)
    except ModelLoadError as exc:
        m.errors_total.inc(code=ErrorCode.MODEL_UNAVAILABLE)
        return error_response(503, ErrorCode.MODEL_UNAVAILABLE, str(exc), "server_error", param="model")
    held = [True]

    def done_with_model() -> None:
        if held[0]:
            held[0] = False
            state.models.release(served)

    try:
        resp = await _speech(request, state, req, engine, done_with_model)
    except BaseException:
        done_with_model()
        raise
    if not isinstance(resp, _StreamingSpeech):
        done_with_model()  # else its body's end does (the model stays loaded while it plays)
    return resp


async def _speech(
    request: Request, state: ServerState, req: SpeechRequest, engine: EngineClient, done_with_model: Callable[[], None]
) -> Response:
    m = state.metrics
    try:
        fmt, sse = _format(req)
        if req.voice is not None and req.voice not in state.voice_names:
            await state.voices.fetch(req.voice)  # into this replica's cache (shared store)
        if isinstance(req.lexicon, str):
            await state.lexicons.fetch(req.lexicon)  # likewise a stored lexicon it names
        options, reference = _options(req, state, engine)
        speakers, prefix = await _voice_fields(req, state, reference, engine)
    except SpeechRequestError as exc:  # a field we cannot honour: 400 naming it
        m.errors_total.inc(code=exc.code)
        return error_response(exc.status, exc.code, str(exc), param=exc.param)
    except VoiceFieldError as exc:
        m.errors_total.inc(code=exc.code)
        status = 503 if exc.code == ErrorCode.VOICE_STORE_UNAVAILABLE else 400
        return error_response(status, exc.code, str(exc), param=exc.field)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:  # ConfigError too
        m.errors_total.inc(code=ErrorCode.INVALID_REQUEST)
        return error_response(400, ErrorCode.INVALID_REQUEST, str(exc))
    except RecursionError:  # msgspec's guard against deep nesting
        m.errors_total.inc(code=ErrorCode.INVALID_REQUEST)
        return error_response(400, ErrorCode.INVALID_REQUEST, "the JSON body is nested too deeply")
    except VoiceStoreUnavailableError as exc:
        m.errors_total.inc(code=ErrorCode.VOICE_STORE_UNAVAILABLE)
        return error_response(503, ErrorCode.VOICE_STORE_UNAVAILABLE, str(exc), "server_error")
    limits = state.settings.session
    if len(req.input) > limits.max_session_chars:
        m.errors_total.inc(code=ErrorCode.TEXT_TOO_LONG)
        return error_response(
            400,
            ErrorCode.TEXT_TOO_LONG,
            f"input is {len(req.input)} characters; the limit is {limits.max_session_chars} "
            "(the server's --max-session-chars): split it into several requests",
            param="input",
        )
    seg = Segmenter(SegmenterConfig(limits.min_chars, limits.clause_min_chars, limits.max_chars))
    segments = seg.feed(req.input) + seg.flush()
    if not segments and req.ambient_sound is not None and not req.input.strip():
        segments = [""]  # a sound with no words: the prompt's text is None
    if not segments:
        m.errors_total.inc(code=ErrorCode.INVALID_TEXT)
        return error_response(
            400, ErrorCode.INVALID_TEXT, "input has nothing to say (no letters or digits)"
        )
    if state.drain.active:
        m.refused_total.inc(kind="http")
        m.errors_total.inc(code=ErrorCode.SERVER_DRAINING)
        resp = error_response(
            503, ErrorCode.SERVER_DRAINING, state.drain.refusal_message(), "server_error"
        )
        resp.headers["Retry-After"] = str(RETRY_AFTER_S)
        return resp
    client = request.client.host if request.client else ""
    refused = state.try_acquire("http", client)
    if refused is not None:
        m.errors_total.inc(code=refused)
        per_client = refused == ErrorCode.TOO_MANY_SESSIONS
        resp = error_response(
            429 if per_client else 503,
            refused,
            state.refusal_message(refused),
            "rate_limit_error" if per_client else "server_error",
        )
        resp.headers["Retry-After"] = "1"
        return resp
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            state.release(client)
            done_with_model()

    try:
        sp = SegmentedSpeech(
            engine,
            reference=reference,
            options=options,
            speakers=speakers,
            prefix=prefix,
            prefix_text=req.prefix_text,
            speaker_texts=req.speaker_texts,
            lookahead=state.settings.lookahead,
            continuity_frames=state.settings.continuity_frames,
            fade_ms=state.settings.fade_ms,
        )
        for text in segments:
            sp.add(text)
        sp.end()
        events = sp.events()
        first = await _first_audio(events)
    except BaseException:
        release()
        raise
    if isinstance(first, SegmentFailed):
        release()
        await events.aclose()
        code, _, _ = error_for_exception(first.error)
        m.errors_total.inc(code=code)
        resp = error_response(
            _STATUS.get(code, 500),
            code,
            str(first.error),
            "server_error" if code not in _STATUS else "invalid_request_error",
        )
        if isinstance(first.error, OverloadedError):  # at capacity: when to come back, measured
            resp.headers["Retry-After"] = str(first.error.retry_after_s or 1)
        return resp
    drained = HttpStream()  # what the drain sees of this stream (drain.py)
    output = SpeechOutput(fmt, req.speed)
    body_iter = _body(state, engine, events, first, output, sse, release, drained, req.input, req.speed)
    media = "text/event-stream" if sse else fmt.mime_type
    headers = {
        "Cache-Control": "no-store",
        "X-Sample-Rate": str(fmt.sample_rate),
        "X-Audio-Format": fmt.raw.name if fmt.raw is not None else fmt.name,
    }
    return _StreamingSpeech(
        body_iter,
        state.settings.send_stall_s,
        state,
        drained=None if sse else drained,
        media_type=media,
        headers=headers,
    )


def _format(req: SpeechRequest) -> tuple[SpeechFormat, bool]:
    check_speed(req.speed)
    if req.stream_format not in ("audio", "sse"):
        raise SpeechRequestError(
            ErrorCode.INVALID_REQUEST,
            "stream_format",
            f"stream_format must be 'audio' or 'sse', got {req.stream_format!r}",
        )
    sse = req.stream_format == "sse"
    try:
        mode = check_timestamps(req.timestamps)
    except ValueError as exc:
        raise SpeechRequestError(ErrorCode.INVALID_REQUEST, "timestamps", str(exc)) from None
    if mode == "chars":
        raise SpeechRequestError(
            ErrorCode.INVALID_REQUEST, "timestamps", "timestamps here are 'words' or 'none' (character times: the WebSocket)"
        )
    if mode != "none" and not sse:
        raise SpeechRequestError(
            ErrorCode.INVALID_REQUEST,
            "timestamps",
            "timestamps need stream_format 'sse' (an audio body has nowhere to put them)",
        )
    return resolve_format(req.response_format, sse), sse


def _options(req: SpeechRequest, state: ServerState, engine: EngineClient) -> tuple[StreamOptions, Voice | None]:
    reference: Voice | None = None
    if req.voice is not None:
        known, reference = state.lookup_voice(req.voice)
        if not known:
            raise SpeechRequestError(
                ErrorCode.UNKNOWN_VOICE, "voice", state.unknown_voice(req.voice)
            )
    cap = state.settings.session.max_new_tokens
    try:
        options = request_options(req, cap, instruction=req.instructions, lexicons=state.lexicons.layers(req.lexicon))
        # checked before anything is generated: every segment would fail
        check_template_fields(engine.prompt_template, options)
    except FieldError as exc:
        raise http_error(exc) from None
    return options, reference


async def _voice_fields(
    req: SpeechRequest, state: ServerState, reference: Voice | None, engine: EngineClient
) -> tuple[dict[str, Voice] | None, Voice | None]:
    """The dialogue's speakers and the continuation's prefix; the whole input's speaker
    tags checked against the speakers here (its segments each carry only some)."""
    try:
        check_voice_fields(req.voice, req.speakers, req.prefix, req.prefix_text)
        if req.speaker_texts:
            check_speaker_texts(req.speaker_texts, req.speakers, req.prefix, req.prefix_text)
    except FieldError as exc:
        raise http_error(exc) from None
    keep = {speaker_number(k) for k in req.speaker_texts or {}}  # checked above
    speakers, prefix = await resolve_voices(state, req.speakers, req.prefix, keep)
    for key in req.speaker_texts or {}:
        v = (speakers or {}).get(f"S{speaker_number(key)}")
        if v is not None and v.clip is None:
            raise SpeechRequestError(
                ErrorCode.INVALID_OPTION, "speaker_texts",
                f"speaker_texts.{key}: that speaker's voice is stored as codes; continuing the speakers' "
                "clips needs the clip itself (send it base64 in speakers)",
            )  # fmt: skip
    if speakers:
        try:
            check_speakers(
                tagged_text(req.input, req.speaker_texts, req.prefix_text), speaker_tuple(speakers),
                voiceless=engine.prompt_template.by_position,
            )  # fmt: skip
        except InputError as exc:
            raise SpeechRequestError(ErrorCode.INVALID_OPTION, "speakers", str(exc)) from None
    return speakers, prefix


async def _first_audio(events: AsyncGenerator[SegmentEvent, None]) -> SegmentEvent:
    """Pull events until the first audio (or a failure before any audio)."""
    async for ev in events:
        if isinstance(ev, SegmentAudio) and ev.pcm.shape[0] == 0:
            continue
        if isinstance(ev, SegmentFailed):
            code, fatal, _ = error_for_exception(ev.error)
            if not fatal:  # this segment is skipped; the next may still speak
                log.info("speech: segment %d skipped: %s", ev.index, ev.error)
                continue
        return ev
    return SegmentFailed(-1, "", ValueError("no segment produced audio"))


async def _body(
    state: ServerState,
    engine: EngineClient,
    events: AsyncGenerator[SegmentEvent, None],
    first: SegmentEvent,
    output: SpeechOutput,
    sse: bool,
    release: Any,
    drained: HttpStream,
    text: str = "",
    speed: float = 1.0,
) -> AsyncIterator[bytes]:
    m = state.metrics
    frames = 0
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    def out(data: bytes) -> bytes:
        if not sse:
            return data
        b64 = base64.b64encode(data).decode("ascii")
        return f"data: {json.dumps({'type': 'speech.audio.delta', 'audio': b64})}\n\n".encode()

    state.drain.add(drained)
    finished = False
    try:
        ev: SegmentEvent | None = first
        while ev is not None:
            if isinstance(ev, SegmentAudio):
                frames += ev.frames
                if sse and ev.words:  # before the audio that holds them; `speed` shortens it
                    yield _alignment_event(ev.words, speed)
                data = await output.feed(ev.pcm)
                m.audio_seconds_total.inc(ev.pcm.shape[0] / SAMPLE_RATE)
                if data:
                    yield out(data)
            elif isinstance(ev, SegmentDone):
                m.segments_total.inc()
            elif isinstance(ev, SegmentFailed):
                code, fatal, _ = error_for_exception(ev.error)
                m.errors_total.inc(code=code)
                log.warning("speech: segment %d failed (%s): %s", ev.index, code, ev.error)
                if fatal:
                    if sse:
                        err = {"type": "error", "error": {"code": code, "message": str(ev.error)}}
                        yield f"data: {json.dumps(err)}\n\n".encode()
                    return
            ev = await _next_unless_cut(events, drained)
        if drained.cut_message is not None:  # the server's drain time ran out
            m.errors_total.inc(code=ErrorCode.SERVER_SHUTDOWN)
            if sse:
                err = {
                    "type": "error",
                    "error": {"code": ErrorCode.SERVER_SHUTDOWN, "message": drained.cut_message},
                }
                yield f"data: {json.dumps(err)}\n\n".encode()
            return
        tail = await output.finish()
        finished = True
        if tail:
            yield out(tail)
        if frames:
            m.rtf.observe((loop.time() - t0) / (frames / FRAME_RATE))
        if sse:
            n_in = await asyncio.to_thread(engine.count_text_tokens, text)
            done = {
                "type": "speech.audio.done",
                "usage": {"input_tokens": n_in, "output_tokens": frames, "total_tokens": n_in + frames},
            }
            yield f"data: {json.dumps(done)}\n\n".encode()
    finally:
        state.drain.discard(drained)
        # A client that leaves cancels this inside an anyio cancel scope, which cancels every
        # await from here on again: the slot is released whatever the awaits do.
        try:
            if not finished:
                output.close()
            with contextlib.suppress(Exception):
                await events.aclose()
        finally:
            release()


def _alignment_event(words: list[WordTime], speed: float) -> bytes:
    event = {
        "type": "speech.alignment",
        "words": [
            {"word": w.word, "start": round(w.start / speed, 4), "end": round(w.end / speed, 4)}
            for w in words
        ],
        "estimated": True,
    }
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


async def _next_unless_cut(
    events: AsyncGenerator[SegmentEvent, None], drained: HttpStream
) -> SegmentEvent | None:
    """The next event; None at once when the drain cuts the stream (not at the next event,
    which may be far off)."""
    if drained.cut_message is not None:
        return None
    nxt = asyncio.ensure_future(anext(events, None))
    cut = asyncio.ensure_future(drained.was_cut.wait())
    try:
        done, _ = await asyncio.wait({nxt, cut}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        cut.cancel()
        if not nxt.done():
            nxt.cancel()  # the generator aborts its streams; _body closes it
            await asyncio.gather(nxt, return_exceptions=True)
    return nxt.result() if nxt in done else None


class _StreamingSpeech(StreamingResponse):
    """A StreamingResponse that closes its body generator at once when the client leaves
    (so the engine slot is freed now, not at garbage collection) and gives up on a client
    that does not read for ``stall_s``. A raw audio body cut by a drain (``drained``) is left
    incomplete (no final chunk), so the client sees it was cut, not a finished utterance; SSE
    says so with an ``error`` event instead."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        stall_s: float,
        state: ServerState,
        drained: HttpStream | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(content, **kw)
        self.stall_s = stall_s
        self.state = state
        self.drained = drained

    async def stream_response(self, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        body = self.body_iterator
        try:
            async for chunk in body:
                try:
                    await asyncio.wait_for(
                        send({"type": "http.response.body", "body": chunk, "more_body": True}),
                        self.stall_s,
                    )
                except TimeoutError:
                    self.state.metrics.slow_clients_total.inc()
                    log.warning("speech: client read nothing for %g s; dropping it", self.stall_s)
                    return  # uvicorn closes a response left incomplete
            if self.drained is not None and self.drained.cut_message is not None:
                return  # cut by the drain: incomplete as well
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            aclose = getattr(body, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(BaseException):
                    await aclose()
