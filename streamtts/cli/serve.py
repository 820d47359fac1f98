"""``streamtts serve``: one asyncio process serving WebSocket + HTTP on one port."""

from __future__ import annotations

import argparse
import logging
import os
import re
import socket
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..server.app_state import ServerSettings
from ..server.session import SessionSettings

if TYPE_CHECKING:
    from ..server.models import ModelSpec

log = logging.getLogger(__name__)

_MODEL_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")

TOKEN_ENV = "STREAMTTS_TOKEN"
VOICE_STORE_ENV = "STREAMTTS_VOICE_STORE"
PORT_ENV = "STREAMTTS_PORT"

# Flags that set one settings field each: flag, the field, type, help; the default is the
# field's own. One table for the parser and for settings_from_args (argparse's dest = the field).
Flags = tuple[tuple[str, str, type[Any], str], ...]
SESSION_FLAGS: Flags = (  # SessionSettings: one WebSocket session's limits and segmenter
    ("--first-message-timeout", "first_message_timeout_s", float,
     "close a WebSocket that sends nothing this long after connecting (s)"),
    ("--idle-timeout", "idle_timeout_s", float, "close a session quiet this long (s)"),
    ("--max-message-bytes", "max_message_bytes", int, "largest client message"),
    ("--max-text-chars", "max_text_chars", int, "largest text per message"),
    ("--max-contexts", "max_contexts", int,
     "named contexts (independent streams) open at once on one WebSocket session"),
    ("--max-session-chars", "max_session_chars", int, "most text per session"),
    ("--min-chars", "min_chars", int, "segmenter: shortest sentence segment"),
    ("--clause-min-chars", "clause_min_chars", int, "segmenter: shortest clause segment"),
    ("--max-chars", "max_chars", int, "segmenter: longest segment"),
    ("--segment-max-new-tokens", "max_new_tokens", int, "cap on generation steps per segment"),
)  # fmt: skip
SERVER_FLAGS: Flags = (  # ServerSettings
    ("--ping-interval", "ping_interval_s", float, "WebSocket ping interval (s)"),
    ("--ping-timeout", "ping_timeout_s", float, "close when a ping is unanswered this long (s)"),
    ("--send-buffer", "send_buffer_s", float, "audio seconds queued per client"),
    ("--send-lead", "send_lead_s", float,
     "audio seconds sent ahead of what a WebSocket client has played or read"),
    ("--send-stall", "send_stall_s", float,
     "drop a client this many seconds behind real-time playback (HTTP: not reading)"),
    ("--lookahead", "lookahead", int, "segments generated ahead of the one playing"),
    ("--continuity-frames", "continuity_frames", int,
     "without a reference: frames of the first segment that become the session's voice"),
    ("--voice-cache", "voice_cache_size", int, "encoded voices kept (LRU)"),
    ("--drain-timeout", "drain_timeout_s", float,
     "on SIGTERM or POST /admin/drain: seconds running streams get to finish before the rest "
     "are cut; then the server exits 0"),
)  # fmt: skip


def _add_flags(p: argparse.ArgumentParser, flags: Flags, defaults: object) -> None:
    for flag, name, typ, text in flags:
        metavar = flag[2:].replace("-", "_").upper()  # as argparse names it, not by the field
        p.add_argument(
            flag, dest=name, metavar=metavar, type=typ, default=getattr(defaults, name), help=text
        )


def add_parser(sub: Any) -> None:
    from .common import add_model_args, chunk_list

    p: argparse.ArgumentParser = sub.add_parser(
        "serve",
        help="serve the streaming WebSocket protocol, OpenAI-compatible HTTP and a browser page",
    )
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument(
        "--port",
        type=int,
        # a string: argparse converts it as it does a typed value (a bad $STREAMTTS_PORT is a
        # usage error naming --port)
        default=os.environ.get(PORT_ENV, "8000"),
        help=f"port (0 = any free port; the bound port is printed; default ${PORT_ENV}, else 8000)",
    )
    p.add_argument("--queue-size", type=int, help="override the engine's queue_size")
    p.add_argument(
        "--admission", choices=["capacity", "slots"],
        help="capacity (default unless the config sets `admission`): a new stream starts only "
        "while every stream stays ahead of real time by the engine's measured tick times, up to "
        "--max-streams; slots: whenever one of --max-streams slots is free",
    )  # fmt: skip
    p.add_argument(
        "--realtime-margin", type=float,
        help="capacity admission: share of a frame's time a tick must leave to spare (default 0.25)",
    )  # fmt: skip
    p.add_argument(
        "--first-audio-deadline", type=float,
        help="capacity admission: seconds a new stream may wait for a slot; refused at once "
        "(overloaded, 1013 / HTTP 503 + Retry-After) when it would wait longer (default 3)",
    )  # fmt: skip
    p.add_argument(
        "--chunk-frames", type=chunk_list, metavar="SIZES",
        help="frames of a stream's first chunk, then the ramp, joined by commas (the last "
        "repeats; e.g. 1,2,4,8): override the config's chunk_frames",
    )  # fmt: skip
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
    _add_flags(p, SESSION_FLAGS, SessionSettings())
    _add_flags(p, SERVER_FLAGS, ServerSettings())
    p.add_argument(
        "--socket-send-buffer",
        type=int,
        help="SO_SNDBUF per connection in bytes (default: the kernel's, which may grow to MBs): "
        "bounds audio buffered in the kernel, so a client that stops reading is noticed sooner",
    )
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
        "--model", action="append", type=model_arg, default=[], metavar="ID=CONFIG",
        help="serve the model of CONFIG under ID (repeatable: several models, one process; the "
        "first is the default). A request picks one by its `model` (GET /v1/models lists them)",
    )  # fmt: skip
    p.add_argument(
        "--on-demand", action="store_true",
        help="with several --model: only the first loads at start; each other loads on its first "
        "request (which waits for it)",
    )  # fmt: skip
    p.add_argument(
        "--idle-unload", type=float, metavar="SECONDS",
        help="unload a model no stream has used for this long (its memory goes back to the OS); "
        "its next request loads it again",
    )  # fmt: skip
    p.add_argument(
        "--lexicon", metavar="FILE.json",
        help='the server\'s pronunciation lexicon, a JSON object {"word or phrase": "how to read it", ...}: '
        "every request reads with it, under the request's own (`lexicon` field; docs/protocol.md)",
    )  # fmt: skip
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-ups at start (the engine's and the server's generation)")
    p.add_argument("--log-level", default="warning", help="uvicorn's log level")
    p.set_defaults(handler=serve, check=_check_serve)


def _models_file(args: argparse.Namespace) -> None:
    """``--config`` naming a server config with a ``models:`` map (server/models_file.py):
    its models become ``--model`` arguments (the command line's flags win)."""
    from ..server.models_file import read_models_file

    f = read_models_file(args.config) if args.config else None
    if f is None:
        return
    if args.model:
        raise UsageError(f"--config {args.config} names models (`models:`) and --model gives more: use one of them")
    for mid in f.models:
        if not _MODEL_ID.fullmatch(mid):
            raise UsageError(f"--config {args.config}: model id {mid!r}: 1-64 letters, digits, '.', '_' or '-'")
    args.model, args.config = list(f.models.items()), None
    args.on_demand = args.on_demand or f.on_demand
    if args.idle_unload is None:
        args.idle_unload = f.idle_unload


def model_arg(text: str) -> tuple[str, str]:
    """``ID=CONFIG`` of ``--model``."""
    mid, sep, path = text.partition("=")
    if not sep or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: expected ID=CONFIG, e.g. tts=weights/streamtts.yaml")
    if not _MODEL_ID.fullmatch(mid):
        raise argparse.ArgumentTypeError(f"{mid!r}: a model id is 1-64 letters, digits, '.', '_' or '-'")
    return mid, path


def _check_serve(args: argparse.Namespace) -> None:
    from .common import check_config, read_lexicon

    _models_file(args)
    check_config(args)
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: ports are 0-65535 (0 = any free one)")
    if args.model and args.config:
        raise UsageError("--config and --model: give every model with --model ID=CONFIG (the first is the default)")
    ids = [mid for mid, _ in args.model]
    if len(set(ids)) != len(ids):
        raise UsageError(f"--model: each id once, got {', '.join(ids)}")
    for mid, path in args.model:
        check_config(argparse.Namespace(config=path), f"--model {mid}")
    if args.idle_unload is not None and args.idle_unload <= 0:
        raise UsageError(f"--idle-unload {args.idle_unload}: seconds > 0")
    args.lexicon_read = read_lexicon(args.lexicon)  # checked before the models load


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


def _beyond_loopback(host: str) -> bool:
    import ipaddress

    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: the machine's own, or another interface's
        return host != "localhost"


def _warn_open(host: str) -> None:
    """Before the model loads: listening beyond loopback with nothing but the network between
    another machine and the model (no --token)."""
    if _beyond_loopback(host):
        log.warning(
            "listening on %s without --token: whoever reaches this machine can use the model; "
            "set --token SECRET (or $%s), or --host 127.0.0.1 to stay local (docs/deploy.md)",
            host, TOKEN_ENV,
        )  # fmt: skip


def _from_elsewhere(host: str, port: int) -> None:
    """Listening beyond loopback: the addresses another machine opens."""
    if not _beyond_loopback(host):
        return
    every = host in ("0.0.0.0", "::")
    urls = ", ".join(f"http://{a if ':' not in a else f'[{a}]'}:{port}" for a in (reachable_addresses() if every else [host]))
    if urls:
        print(f"streamtts: from another machine: {urls} (the page; the API under /v1)", flush=True)


def reachable_addresses() -> list[str]:
    """This machine's non-loopback IPv4 addresses, best guess first: the one its default
    route leaves from (a UDP socket's connect sends nothing), then the host name's."""
    found: list[str] = []
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed anywhere real
            found.append(s.getsockname()[0])
    except OSError:
        pass
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            found.append(str(info[4][0]))
    except OSError:
        pass
    return [a for a in dict.fromkeys(found) if not a.startswith("127.") and a != "0.0.0.0"]


def _model_spec(args: argparse.Namespace, model_id: str, config: str | None, *, on_demand: bool) -> ModelSpec:
    """One served model: its config read now (its member and codebooks, for listings before it
    loads), its engine made at each load with the command line's engine options."""
    from ..codec import model_n_vq
    from ..config import find_model_config
    from ..engine.assemble import model_member
    from ..engine.frontend import Engine
    from ..server.models import ModelSpec

    def make() -> Engine:
        engine = Engine.from_config(
            config,
            max_streams=args.max_streams,
            n_threads=args.n_threads,
            queue_size=args.queue_size,
            warmup=False if args.no_warmup else None,
            admission=args.admission,
            realtime_margin=args.realtime_margin,
            first_audio_deadline_s=args.first_audio_deadline,
            chunk_frames=list(args.chunk_frames) if args.chunk_frames else None,
        )
        if args.admission is None and not engine.config.is_set("admission"):
            engine.config.admission = "capacity"  # a server keeps what it admits in real time
        return engine

    cfg = make().config  # not loaded: the config only
    return ModelSpec(model_id, cfg, make, model_member(find_model_config(cfg)).kind, model_n_vq(cfg), on_demand=on_demand)


def settings_from_args(args: argparse.Namespace, max_streams: int) -> ServerSettings:
    from ..server.voice_store import VoiceStoreSettings

    session = SessionSettings(**{name: getattr(args, name) for _, name, _, _ in SESSION_FLAGS})
    return ServerSettings(
        session=session,
        **{name: getattr(args, name) for _, name, _, _ in SERVER_FLAGS},
        max_sessions=args.max_sessions or max_streams,
        token=args.token or None,
        max_sessions_per_client=args.max_sessions_per_client or None,
        allowed_origins=tuple(args.allowed_origin),
        allowed_hosts=tuple(args.allowed_host),
        bind_host=args.host,
        ws_max_size=max(1 << 20, 4 * args.max_message_bytes),
        voice_store=VoiceStoreSettings(url=args.voice_store, ttl_s=args.voice_ttl),
        warmup=not args.no_warmup,
        lexicon=getattr(args, "lexicon_read", None),
    ).validate()


async def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from ..server.app import create_app
    from ..server.draining_server import DrainingServer
    from ..server.model_names import DEFAULT_MODEL_ID
    from ..server.models import ModelSet
    from ..server.uvicorn_ws import WebSocketProtocol
    from .common import demo_notice

    # The port first: a taken port is a one-line error before the engine loads, not after.
    sock = listen(args.host, args.port)
    if not args.token:
        _warn_open(args.host)
    demo_notice(args)
    models_log = logging.getLogger("streamtts.server.models")
    several = len(args.model) > 1
    if several and not getattr(args, "quiet", False) and models_log.getEffectiveLevel() > logging.INFO:
        models_log.setLevel(logging.INFO)  # a model loaded on demand or unloaded: the operator sees it
    specs = [_model_spec(args, mid, path, on_demand=args.on_demand and i > 0) for i, (mid, path) in enumerate(args.model or [(DEFAULT_MODEL_ID, args.config)])]
    settings = settings_from_args(args, sum(s.config.max_streams for s in specs))
    models = ModelSet(specs, idle_unload_s=args.idle_unload, warmup=settings.warmup)
    # Load before serving: a model that fails to load is one line here, not a traceback from
    # uvicorn's startup (the app's lifespan then finds the models started).
    await models.start()
    app = create_app(models, settings)
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
        log_config=None,  # uvicorn's records go through ours: one style, `streamtts: error: ...`
        timeout_graceful_shutdown=5,
    )
    # SIGTERM drains first (server/drain.py); Ctrl+C stops at once.
    server = DrainingServer(config, app.state.streamtts.drain)
    # Tests and scripts read this line to find the port (with --port 0).
    print(
        f"streamtts: serving on http://{host}:{port} (WebSocket ws://{host}:{port}/v1/stream)",
        flush=True,
    )
    _from_elsewhere(host, port)
    await server.serve(sockets=[sock])
    return 0
