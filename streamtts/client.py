"""Async client of a ``streamtts serve`` server (the ``/v1/stream`` WebSocket protocol).

::

    client = StreamClient("ws://127.0.0.1:8000", seed=1)
    async for pcm in client.stream("Hello there. How are you?"):   # float32 mono
        ...
    async for pcm in client.stream(llm_tokens()):                    # text streamed in
        ...

For more control (segments, stats, flush, cancel), open a session::

    async with client.session() as s:
        await s.send_text("Hello")
        await s.end()
        async for event in s:       # Audio | SegmentInfo | Alignment | Done | Error (non-fatal)
            ...

Several independent streams on one socket (contexts, docs/protocol.md): pass a
``context_id`` to ``send_text``/``flush``/``end``/``cancel``; the events of a named context
carry its id (``Audio.context_id``, ``Done.context_id``, ...), and ``done`` for each
context leaves the session open::

    async with client.session() as s:
        await s.send_text("First answer.", context_id="turn-1")
        await s.end(context_id="turn-1")
        async for event in s:
            if isinstance(event, Done) and event.context_id == "turn-1":
                break

A fatal server error (``error`` with ``fatal: true``) or a close without
``done`` raises :class:`ServerError` with the server's code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from .audio.formats import AudioFormat, decode_audio, get_format
from .config import SamplingParams
from .errors import ServerError
from .server.protocol import Alignment, AudioHeader, Done, Error, Ready, SegmentInfo
from .text.pieces import split_for_messages

log = logging.getLogger(__name__)

__all__ = [
    "Audio",
    "ClientSession",
    "ContextStream",
    "ServerError",
    "SharedSession",
    "StreamClient",
    "stream_url",
]

_ServerMessage = Ready | SegmentInfo | Done | Error | AudioHeader | Alignment
_SERVER_DECODER: msgspec.json.Decoder[_ServerMessage] = msgspec.json.Decoder(_ServerMessage)
_ENCODER = msgspec.json.Encoder()


@dataclass(slots=True)
class Audio:
    """One binary frame: ``pcm`` float32 in [-1, 1] at ``sample_rate``; ``data`` as sent;
    ``context_id`` the named context it belongs to (None: the implicit one)."""

    pcm: npt.NDArray[np.float32]
    data: bytes
    sample_rate: int
    context_id: str | None = None


Event = Audio | SegmentInfo | Done | Error | Alignment


def stream_url(server: str) -> str:
    """``ws://host:port`` (or http://, or a bare host:port) -> the ``/v1/stream`` URL."""
    if "://" not in server:
        server = "ws://" + server
    u = urllib.parse.urlsplit(server)
    scheme = {"http": "ws", "https": "wss"}.get(u.scheme, u.scheme)
    path = u.path if u.path not in ("", "/") else "/v1/stream"
    return urllib.parse.urlunsplit((scheme, u.netloc, path, u.query, ""))


def http_base(server: str) -> str:
    u = urllib.parse.urlsplit(stream_url(server))
    return urllib.parse.urlunsplit(({"ws": "http", "wss": "https"}[u.scheme], u.netloc, "", "", ""))


class ClientSession:
    """One open ``/v1/stream`` session; iterate it for events."""

    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self.ready: Ready | None = None
        self.format: AudioFormat | None = None
        self.segments: list[SegmentInfo] = []
        self.errors: list[Error] = []
        self.done: Done | None = None  # the session's own (final) done
        self._next_context: str | None = None  # named by the `audio` header just read
        self.warn_errors = True  # log each non-fatal error as a warning (besides yielding it)

    @classmethod
    async def open(cls, ws: Any, **settings: Any) -> ClientSession:
        """A session on an open ``websockets`` connection ``ws``: sends ``start`` with
        ``settings`` (None values left out) and waits for ``ready`` (ServerError if refused)."""
        from websockets.exceptions import ConnectionClosed

        s = cls(ws)
        try:
            await s.start(**settings)
        except ConnectionClosed:
            pass  # refused at once (overloaded): its error message is still to be read
        await s._wait_ready()
        return s

    async def _send(self, obj: dict[str, Any], context_id: str | None = None) -> None:
        if context_id is not None:
            obj["context_id"] = context_id
        await self._ws.send(_ENCODER.encode(obj).decode("utf-8"))

    async def start(self, **settings: Any) -> None:
        await self._send({"type": "start", **{k: v for k, v in settings.items() if v is not None}})

    async def send_text(self, text: str, flush: bool = False, context_id: str | None = None) -> None:
        """Text to speak; longer than the server takes in one message (its ``ready`` limits),
        it goes as several, cut at sentence ends (it is spoken the same either way)."""
        pieces = [text]
        limits = self.ready.limits if self.ready is not None else None
        if limits is not None and len(text.encode("utf-8")) > min(
            limits.max_text_chars, limits.max_message_bytes // 8
        ):
            pieces = split_for_messages(text, limits.max_text_chars, limits.max_message_bytes)
        for i, piece in enumerate(pieces):
            msg: dict[str, Any] = {"type": "text", "text": piece}
            if flush and i == len(pieces) - 1:
                msg["flush"] = True
            await self._send(msg, context_id)

    async def flush(self, context_id: str | None = None) -> None:
        await self._send({"type": "flush"}, context_id)

    async def end(self, context_id: str | None = None) -> None:
        """No more text: for the whole session, or (``context_id``) for that context only."""
        await self._send({"type": "end"}, context_id)

    async def cancel(self, context_id: str | None = None) -> None:
        """Stop now: the whole session, or (``context_id``) that context only."""
        await self._send({"type": "cancel"}, context_id)

    async def close(self) -> None:
        """Close the session, at once even mid-stream: the server's answer to the close comes
        after the audio it had sent already, so that audio is read (and dropped) meanwhile; a
        client that stopped reading would otherwise wait out the close timeout (10 s)."""
        drain = asyncio.create_task(self._discard())
        try:
            await self._ws.close()
        finally:
            drain.cancel()
            await asyncio.gather(drain, return_exceptions=True)

    async def _discard(self) -> None:
        with contextlib.suppress(Exception):  # closed, or another task reads it: nothing to do
            while True:
                await self._ws.recv()

    async def _wait_ready(self) -> None:
        """The answer to ``start``: ``ready``, or an error (raised: the settings were refused)."""
        from websockets.exceptions import ConnectionClosed

        try:
            msg = await self._ws.recv()
        except ConnectionClosed as exc:
            raise ServerError(
                "connection_closed", f"closed before `ready`: {exc}", _close_code(exc)
            ) from exc
        ev = _SERVER_DECODER.decode(msg) if isinstance(msg, str) else None
        if isinstance(ev, Ready):
            self.ready = ev
            self.format = get_format(ev.format)
            return
        if isinstance(ev, Error):
            self.errors.append(ev)
            await self._await_close_after(ev)
            raise ServerError(ev.code, ev.message, self._ws.close_code)
        raise ServerError("protocol_error", f"expected `ready`, got {msg!r:.80}")

    async def _await_close_after(self, ev: Error) -> None:
        """The close frame follows a fatal error at once: wait for it, to report its code too."""
        if ev.fatal:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._ws.wait_closed(), 2.0)

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        from websockets.exceptions import ConnectionClosed

        try:
            async for msg in self._ws:
                if isinstance(msg, bytes):
                    fmt = self.format or get_format("pcm_s16le_24000")
                    cid, self._next_context = self._next_context, None
                    yield Audio(decode_audio(msg, fmt), msg, fmt.sample_rate, cid)
                    continue
                ev = _SERVER_DECODER.decode(msg)
                if isinstance(ev, AudioHeader):
                    self._next_context = ev.context_id
                elif isinstance(ev, Ready):
                    self.ready = ev
                    self.format = get_format(ev.format)
                elif isinstance(ev, (SegmentInfo, Alignment)):
                    if isinstance(ev, SegmentInfo):
                        self.segments.append(ev)
                    yield ev
                elif isinstance(ev, Done):
                    if ev.context_id is None:
                        self.done = ev
                    yield ev
                elif isinstance(ev, Error):
                    self.errors.append(ev)
                    if ev.fatal:
                        await self._await_close_after(ev)
                        raise ServerError(ev.code, ev.message, self._ws.close_code)
                    if self.warn_errors:
                        log.warning("server: %s: %s", ev.code, ev.message)
                    yield ev
        except ConnectionClosed as exc:
            if self.done is None:
                raise ServerError(
                    "connection_closed",
                    f"the connection closed before `done`: {exc}",
                    _close_code(exc),
                ) from exc
        if self.done is None:
            code = self._ws.close_code
            raise ServerError(
                "connection_closed",
                f"the server closed the session (code {code}) before `done`",
                code,
            )


def _close_code(exc: Any) -> int | None:
    rcvd = getattr(exc, "rcvd", None)
    return getattr(rcvd, "code", None)


class StreamClient:
    """Settings shared by the sessions it opens (each may override them)."""

    def __init__(
        self,
        server: str = "ws://127.0.0.1:8000",
        *,
        token: str | None = None,
        voice: str | None = None,
        language: str | None = None,
        instruction: str | None = None,
        seed: int | None = None,
        sampling: SamplingParams | dict[str, Any] | None = None,
        format: str = "pcm_f32le_24000",
        min_chars: int | None = None,
        clause_min_chars: int | None = None,
        max_new_tokens: int | None = None,
        timestamps: str | None = None,
        open_timeout: float = 10.0,
        model: str | None = None,
        lexicon: dict[str, str] | str | None = None,
    ) -> None:
        self.url = stream_url(server)
        self.token = token
        self.open_timeout = open_timeout
        self.settings: dict[str, Any] = {
            "voice": voice,
            "language": language,
            "instruction": instruction,
            "seed": seed,
            "sampling": msgspec.to_builtins(sampling)
            if isinstance(sampling, SamplingParams)
            else sampling,
            "format": format,
            "min_chars": min_chars,
            "clause_min_chars": clause_min_chars,
            "max_new_tokens": max_new_tokens,
            "timestamps": timestamps,  # "words" | "chars": Alignment events (estimated times)
            "model": model,  # one of the server's models (GET /v1/models); None: its first
            # a pronunciation lexicon: {"word": "reading", ...}, or a stored one's id or name
            "lexicon": lexicon,
        }

    async def connect(self, **overrides: Any) -> ClientSession:
        """Open a session (``start`` sent, ``ready`` received); the caller closes it."""
        import websockets

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        try:
            ws = await websockets.connect(
                self.url,
                additional_headers=headers,
                open_timeout=self.open_timeout,
                max_size=None,
                compression=None,
            )
        except websockets.InvalidStatus as exc:
            status = exc.response.status_code
            raise ServerError(
                "unauthorized" if status == 401 else "refused",
                f"HTTP {status} from {self.url}"
                + (
                    " (the server was started with --token: give the same token, --token TOKEN "
                    "or $STREAMTTS_TOKEN; StreamClient(token=...))"
                    if status == 401
                    else ""
                ),
            ) from exc
        try:
            return await ClientSession.open(ws, **{**self.settings, **overrides})
        except BaseException:
            await ws.close()
            raise

    @contextlib.asynccontextmanager
    async def session(self, **overrides: Any) -> AsyncIterator[ClientSession]:
        """Open a session and send its ``start``; closed when the block is left."""
        s = await self.connect(**overrides)
        try:
            yield s
        finally:
            await s.close()

    async def stream(
        self,
        text: str | Iterable[str] | AsyncIterable[str],
        *,
        strict: bool = False,
        on_segment: Callable[[SegmentInfo], None] | None = None,
        **overrides: Any,
    ) -> AsyncIterator[npt.NDArray[np.float32]]:
        """Speak ``text`` (a string, or pieces such as LLM tokens); yields float32 PCM.

        A server's refusal of a part (an ``error`` that is not fatal: a text over its
        limits, a segment it could not speak) is logged as a warning and the rest is spoken;
        ``strict`` raises it as :class:`ServerError` instead. ``on_segment`` is called with
        each segment's :class:`SegmentInfo` (after its audio: progress)."""
        async with self.session(**overrides) as s:
            s.warn_errors = not strict
            sender = asyncio.create_task(_send_all(s, text))
            try:
                async for ev in s:
                    if isinstance(ev, Audio):
                        yield ev.pcm
                    elif isinstance(ev, Done):
                        break
                    elif isinstance(ev, Error) and strict:
                        raise ServerError(ev.code, ev.message)
                    elif isinstance(ev, SegmentInfo) and on_segment is not None:
                        on_segment(ev)
                await sender  # raises if sending failed
            finally:
                if not sender.done():
                    sender.cancel()
                    await asyncio.gather(sender, return_exceptions=True)

    async def synthesize(self, text: str, **overrides: Any) -> npt.NDArray[np.float32]:
        parts = [pcm async for pcm in self.stream(text, **overrides)]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    async def upload_voice(self, clip: bytes | str | Path, name: str = "") -> str:
        """Upload a reference clip's bytes; returns the voice id for ``voice=``."""
        data = clip if isinstance(clip, bytes) else Path(clip).expanduser().read_bytes()
        url = (
            http_base(self.url)
            + "/v1/voices"
            + (f"?name={urllib.parse.quote(name)}" if name else "")
        )
        headers = {"Content-Type": "application/octet-stream"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"

        def post() -> dict[str, Any]:
            req = urllib.request.Request(url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=60) as resp:
                    out: dict[str, Any] = json.loads(resp.read())
                    return out
            except urllib.error.HTTPError as exc:
                try:
                    err = json.loads(exc.read())["error"]
                except Exception:
                    raise ServerError("http_error", f"HTTP {exc.code} from {url}") from exc
                raise ServerError(err.get("code", "http_error"), err.get("message", "")) from exc

        result = await asyncio.to_thread(post)
        return str(result["voice_id"])


class ContextStream:
    """One context of a :class:`SharedSession`: its own text in, its own events out.

    Iterate it for the context's :class:`Audio`, :class:`SegmentInfo` and non-fatal
    :class:`Error` events; the iteration ends at the context's ``done`` (kept in
    :attr:`done`). A session that fails or closes first raises :class:`ServerError`.
    """

    def __init__(self, shared: SharedSession, session: ClientSession, context_id: str) -> None:
        self.id = context_id
        self._shared = shared
        self._session = session
        self._queue: asyncio.Queue[Event | BaseException] = asyncio.Queue()
        self.done: Done | None = None

    async def send_text(self, text: str, flush: bool = False) -> None:
        await self._session.send_text(text, flush, context_id=self.id)

    async def flush(self) -> None:
        await self._session.flush(context_id=self.id)

    async def end(self) -> None:
        """No more text for this context: it speaks what is pending, then its ``done``."""
        await self._session.end(context_id=self.id)

    async def cancel(self) -> None:
        """Stop this context now (the session and its other contexts go on)."""
        self._shared._release(self.id)
        if self.done is None:
            await self._session.cancel(context_id=self.id)

    def _put(self, item: Event | BaseException) -> None:
        self._queue.put_nowait(item)

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        while self.done is None:
            item = await self._queue.get()
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, Done):
                self.done = item
                self._shared._release(self.id)
                return
            yield item


class SharedSession:
    """One ``/v1/stream`` session shared by independent streams, one context each.

    A framework's streams (a LiveKit ``SynthesizeStream``, a turn of an agent) each take a
    :meth:`context`; a reader task routes every event to its context. The session opens on
    first use and again after it closed (the server's idle timeout, a restart)::

        shared = SharedSession(StreamClient("ws://127.0.0.1:8000", voice="alloy"))
        ctx = await shared.context()
        await ctx.send_text("Hello there.")
        await ctx.end()
        async for ev in ctx:            # Audio | SegmentInfo | Error, until its done
            ...
        await shared.aclose()
    """

    def __init__(self, client: StreamClient, **overrides: Any) -> None:
        self.client = client
        self.overrides = overrides
        self._session: ClientSession | None = None
        self._reader: asyncio.Task[None] | None = None
        self._contexts: dict[str, ContextStream] = {}
        self._lock = asyncio.Lock()
        self._n = 0
        self._prefix = secrets.token_hex(4)

    @property
    def session(self) -> ClientSession | None:
        return self._session

    async def context(self, context_id: str | None = None) -> ContextStream:
        """A new context (``context_id`` or a fresh one) on the open session."""
        async with self._lock:
            if self._session is None:
                self._session = await self.client.connect(**self.overrides)
                self._reader = asyncio.create_task(self._read(self._session), name="streamtts-shared")
            if context_id is None:
                self._n += 1
                context_id = f"{self._prefix}-{self._n}"
            ctx = ContextStream(self, self._session, context_id)
            self._contexts[context_id] = ctx
            return ctx

    def _release(self, context_id: str) -> None:
        self._contexts.pop(context_id, None)

    async def _read(self, session: ClientSession) -> None:
        failure: BaseException | None = None
        try:
            async for ev in session:
                cid = getattr(ev, "context_id", None)
                ctx = self._contexts.get(cid) if cid is not None else None
                if ctx is not None:
                    ctx._put(ev)
                elif isinstance(ev, Error):
                    log.warning("server: %s: %s", ev.code, ev.message)
        except ServerError as exc:
            failure = exc
        except Exception as exc:  # the connection broke in some other way
            failure = ServerError("connection_closed", str(exc))
        finally:
            if self._session is session:
                self._session = None
            err = failure or ServerError("connection_closed", "the session ended")
            for ctx in list(self._contexts.values()):
                if ctx._session is session:
                    ctx._put(err)
                    self._release(ctx.id)

    async def aclose(self) -> None:
        session, reader = self._session, self._reader
        self._session = None
        if session is not None:
            with contextlib.suppress(Exception):
                await session.close()
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)


async def _send_all(s: ClientSession, text: str | Iterable[str] | AsyncIterable[str]) -> None:
    if isinstance(text, str):
        await s.send_text(text)
    elif isinstance(text, AsyncIterable):
        async for piece in text:
            await s.send_text(piece)
    else:
        for piece in text:
            await s.send_text(piece)
    await s.end()
