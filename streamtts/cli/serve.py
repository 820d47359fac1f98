"""``streamtts serve``: one asyncio process serving WebSocket + HTTP on one port."""

from __future__ import annotations

import argparse
import logging
import os
import socket
from typing import Any

from ..engine.segmented import DEFAULT_CONTINUITY_FRAMES
from ..errors import UsageError
from ..text.segmenter import DEFAULT_CLAUSE_MIN_CHARS, DEFAULT_MAX_CHARS, DEFAULT_MIN_CHARS

log = logging.getLogger(__name__)

TOKEN_ENV = "STREAMTTS_TOKEN"
VOICE_STORE_ENV = "STREAMTTS_VOICE_STORE"


def add_parser(sub: Any) -> None:
    from .common import add_model_args

    p: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="serve the streaming WebSocket protocol, OpenAI-compatible HTTP and a browser page",
    )
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument(
        "--port", type=int, default=8000, help="port (0 = any free port; the bound port is printed)"
    )
    p.add_argument("--queue-size", type=int, help="override the engine's queue_size")
    p.add_argument(
        "--max-sessions", type=int, help="sessions at once (default: the engine's max_streams)"
    )
    p.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV),
        help=f"bearer token required on /v1/* (or ${TOKEN_ENV})",
    )
    p.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        help="browser origin allowed besides the server's own (repeatable; * = any)",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        help="Host name answered besides IP addresses, localhost and --host (repeatable; "
        "* = any, e.g. behind a proxy that checks Host): the DNS-rebinding defence",
    )
    p.add_argument(
        "--max-sessions-per-client",
        type=int,
        default=0,
        help="sessions at once from one client address (default 0 = no cap but --max-sessions)",
    )
    p.add_argument(
        "--first-message-timeout",
        type=float,
        default=5.0,
        help="close a WebSocket that sends nothing this long after connecting (s)",
    )
    p.add_argument(
        "--idle-timeout", type=float, default=60.0, help="close a session quiet this long (s)"
    )
    p.add_argument("--ping-interval", type=float, default=20.0, help="WebSocket ping interval (s)")
    p.add_argument(
        "--ping-timeout",
        type=float,
        default=20.0,
        help="close when a ping is unanswered this long (s)",
    )
    p.add_argument(
        "--max-message-bytes", type=int, default=64 * 1024, help="largest client message"
    )
    p.add_argument("--max-text-chars", type=int, default=10_000, help="largest text per message")
    p.add_argument(
        "--max-contexts",
        type=int,
        default=4,
        help="named contexts (independent streams) open at once on one WebSocket session",
    )
    p.add_argument("--max-session-chars", type=int, default=200_000, help="most text per session")
    p.add_argument(
        "--send-buffer", type=float, default=30.0, help="audio seconds queued per client"
    )
    p.add_argument(
        "--send-stall",
        type=float,
        default=10.0,
        help="window (s) in which a client with a full buffer must keep reading",
    )
    p.add_argument(
        "--min-read-rate",
        type=float,
        default=0.5,
        help="audio seconds per second such a client must take, or it is dropped",
    )
    p.add_argument(
        "--min-chars",
        type=int,
        default=DEFAULT_MIN_CHARS,
        help="segmenter: shortest sentence segment",
    )
    p.add_argument(
        "--clause-min-chars",
        type=int,
        default=DEFAULT_CLAUSE_MIN_CHARS,
        help="segmenter: shortest clause segment",
    )
    p.add_argument(
        "--max-chars", type=int, default=DEFAULT_MAX_CHARS, help="segmenter: longest segment"
    )
    p.add_argument("--segment-max-new-tokens", type=int, help="cap on generation steps per segment")
    p.add_argument(
        "--lookahead", type=int, default=1, help="segments generated ahead of the one playing"
    )
    p.add_argument(
        "--socket-send-buffer",
        type=int,
        help="SO_SNDBUF per connection in bytes (default: the kernel's, which may grow to MBs): "
        "bounds audio buffered in the kernel, so a client that stops reading is noticed sooner",
    )
    p.add_argument(
        "--continuity-frames",
        type=int,
        default=DEFAULT_CONTINUITY_FRAMES,
        help="without a reference: frames of the first segment that become the session's voice",
    )
    p.add_argument("--voice-cache", type=int, default=256, help="encoded voices kept (LRU)")
    p.add_argument(
        "--voice-store",
        default=os.environ.get(VOICE_STORE_ENV, "memory"),
        help="where uploaded voices live: memory (this process) or redis://HOST:6379/0, shared "
        f"by every replica (or ${VOICE_STORE_ENV})",
    )
    p.add_argument(
        "--voice-ttl",
        type=float,
        default=7 * 24 * 3600.0,
        help="seconds a stored voice is kept after its last use (redis)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="on SIGTERM or POST /admin/drain: seconds running streams get to finish before "
        "the rest are cut; then the server exits 0",
    )
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-ups at start (the engine's and the server's generation)")
    p.add_argument("--log-level", default="warning", help="uvicorn's log level")
    p.set_defaults(handler=serve, check=_check_serve)


def _check_serve(args: argparse.Namespace) -> None:
    from .common import check_config

    check_config(args)
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: ports are 0-65535 (0 = any free one)")


def listen(host: str, port: int) -> socket.socket:
    """The listening socket, or a UsageError that says what to do."""
    import errno

    try:
        return socket.create_server((host, port), reuse_port=False)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(
                f"port {port} on {host} is in use (another streamtts serve?): choose another "
                "with --port, or --port 0 for any free one"
            ) from exc
        if exc.errno == errno.EACCES:
            raise UsageError(f"port {port} needs root: choose one above 1023 with --port") from exc
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc} (check --host)") from exc


def settings_from_args(args: argparse.Namespace, max_streams: int) -> Any:
    from ..server.app_state import ServerSettings
    from ..server.session import SessionSettings
    from ..server.voice_store import VoiceStoreSettings

    session = SessionSettings(
        max_message_bytes=args.max_message_bytes,
        max_text_chars=args.max_text_chars,
        max_session_chars=args.max_session_chars,
        idle_timeout_s=args.idle_timeout,
        first_message_timeout_s=args.first_message_timeout,
        min_chars=args.min_chars,
        clause_min_chars=args.clause_min_chars,
        max_chars=args.max_chars,
        max_new_tokens=args.segment_max_new_tokens,
        max_contexts=args.max_contexts,
    )
    return ServerSettings(
        session=session,
        max_sessions=args.max_sessions or max_streams,
        token=args.token or None,
        max_sessions_per_client=args.max_sessions_per_client or None,
        allowed_origins=tuple(args.allowed_origin),
        allowed_hosts=tuple(args.allowed_host),
        bind_host=args.host,
        send_buffer_s=args.send_buffer,
        send_stall_s=args.send_stall,
        min_read_rate=args.min_read_rate,
        ws_max_size=max(1 << 20, 4 * args.max_message_bytes),
        ping_interval_s=args.ping_interval,
        ping_timeout_s=args.ping_timeout,
        voice_cache_size=args.voice_cache,
        voice_store=VoiceStoreSettings(url=args.voice_store, ttl_s=args.voice_ttl),
        drain_timeout_s=args.drain_timeout,
        lookahead=args.lookahead,
        continuity_frames=args.continuity_frames,
        warmup=not args.no_warmup,
    ).validate()


async def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from ..engine.frontend import Engine
    from ..server.app import create_app
    from ..server.drain import DrainingServer
    from ..server.uvicorn_ws import WebSocketProtocol
    from .common import demo_notice

    # The port first: a taken port is a one-line error before the engine loads, not after.
    sock = listen(args.host, args.port)
    demo_notice(args)
    engine = Engine.from_config(
        args.config,
        max_streams=args.max_streams,
        n_threads=args.n_threads,
        queue_size=args.queue_size,
        warmup=False if args.no_warmup else None,
    )
    settings = settings_from_args(args, engine.config.max_streams)
    # Load before serving: a model that fails to load is one line here, not a traceback from
    # uvicorn's startup (the app's lifespan then finds the engine started).
    await engine.start()
    app = create_app(engine, settings)
    if args.socket_send_buffer:
        # Accepted connections inherit the listening socket's SO_SNDBUF (Linux, BSD, macOS).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, args.socket_send_buffer)
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(
        app,
        ws=WebSocketProtocol,  # uvicorn's websockets-sansio, closing cleanly on errors
        ws_max_size=settings.ws_max_size,
        ws_ping_interval=settings.ping_interval_s,
        ws_ping_timeout=settings.ping_timeout_s,
        ws_per_message_deflate=False,  # compressing audio costs CPU and latency for nothing
        lifespan="on",
        log_level=args.log_level,
        timeout_graceful_shutdown=5,
    )
    # SIGTERM drains first (server/drain.py); Ctrl+C stops at once.
    server = DrainingServer(config, app.state.streamtts.drain)
    # Tests and scripts read this line to find the port (with --port 0).
    print(
        f"streamtts: serving on http://{host}:{port} (WebSocket ws://{host}:{port}/v1/stream)",
        flush=True,
    )
    await server.serve(sockets=[sock])
    return 0
