"""The ASGI app: Starlette routes, served by uvicorn with the ``websockets`` library.

Why this stack: the WebSocket protocol itself is handled by ``websockets``
(uvicorn's ``websockets-sansio`` implementation drives its sans-I/O
``ServerProtocol``), and streaming HTTP (the OpenAI endpoint) by uvicorn's
HTTP/1.1 server, on one port; Starlette only routes. Nothing here writes HTTP
or WebSocket framing by hand.

Routes::

    GET  /                   the browser page (static/index.html)
    GET  /static/*           its script
    WS   /v1/stream          the streaming protocol (ws.py, docs/protocol.md)
    POST /v1/audio/speech    OpenAI-compatible speech (speech_http.py)
    POST /v1/voices          upload a reference clip -> voice id
    GET  /v1/voices          the cached voices (id, name, seconds)
    DELETE /v1/voices/{id}
    GET  /v1/audio/voices    every voice a request may name (config names + uploaded)
    POST /v1/lexicons        store a pronunciation lexicon -> its id (lexicon_routes.py)
    GET  /v1/lexicons        the stored lexicons; GET /v1/lexicons/{id}: one, with its entries
    DELETE /v1/lexicons/{id}
    GET  /v1/models          the served model (OpenAI shape, with model_kind and n_vq)
    GET  /healthz            liveness: 200 once loaded (also while draining), 503 while
                             loading or closing
    GET  /readyz             readiness: 200 only while a session slot is free and the server
                             is not draining (balancer health checks, Kubernetes readiness);
                             ?model=ID: the same for that model (404 when not served here)
    POST /admin/drain        start a drain (drain.py): the token, or loopback when none is set
    GET  /metrics            Prometheus text
    GET  /v1/info            the model's name, whether it is the demo model (page.py)
    GET  /favicon.ico        the page's icon
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import cast

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from ..engine.client import EngineClient
from ..errors import ReferenceAudioError, StreamTTSError, VoiceStoreUnavailableError
from ..request import Voice
from .app_state import ServerSettings, ServerState
from .hosts import HostAllowList, HostCheckMiddleware
from .lexicon_routes import delete_lexicon, get_lexicon, list_lexicons, upload_lexicon
from .lexicon_store import LexiconStore, SharedLexicons
from .listings import list_audio_voices, list_models
from .logs import UvicornRefusalFilter
from .metrics import CONTENT_TYPE
from .models import ModelSet
from .page import clip_from_body, favicon, info
from .protocol import ErrorCode
from .speech_http import (
    check_access,
    error_response,
    read_request,
    speech_endpoint,
    store_unavailable,
)
from .voice_design import design_voice
from .voice_names import VoiceNames
from .voice_store import redact_url
from .voices import VoiceStore, open_shared_voices
from .ws import websocket_endpoint

log = logging.getLogger(__name__)

__all__ = ["create_app"]

STATIC = Path(__file__).parent / "static"


def create_app(
    engine: EngineClient | ModelSet, settings: ServerSettings | None = None, *, own_engine: bool = True
) -> Starlette:
    """The app around ``engine``, or several models (server/models.py), started in the
    lifespan if they are not yet.

    ``own_engine``: close the engine(s) when the app shuts down.
    """
    settings = (settings or ServerSettings()).validate()
    models = engine if isinstance(engine, ModelSet) else ModelSet.of_engine(engine, warmup=settings.warmup)
    names = VoiceNames(models.default.spec.config.voices)
    # the names of the model's own voice mean "no reference" on the WebSocket too
    session = dataclasses.replace(settings.session, own_voice_names=names.own, model_ids=tuple(models.ids))
    settings = dataclasses.replace(settings, session=session)

    async def encode(data: bytes, name: str = "") -> Voice:
        async with models.lease(models.encoder_id) as e:
            v: Voice = await e.encode_voice(data, name=name)
            return v

    vs = settings.voice_store
    voices = VoiceStore(
        encode,
        settings.voice_cache_size,
        open_shared_voices(vs),
        recheck_s=vs.recheck_s,
        max_stored_bytes=vs.max_stored_bytes,
    )
    # lexicons live beside the voices: in Redis when the voices are (voice_redis.py)
    shared = voices.shared if hasattr(voices.shared, "save_lexicon") else None
    lexicons = LexiconStore(settings.lexicon, cast(SharedLexicons | None, shared), recheck_s=vs.recheck_s)
    state = ServerState(models, settings, voices, names, lexicons)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if voices.shared is not None and not await voices.shared.ping():
            # Not fatal: synthesis without a stored voice works, and the store is retried.
            log.warning("voice store %s unreachable at start", redact_url(vs.url))
        with uvicorn_refusals_quiet():
            # each model not marked on demand loads (and pays its one-off costs) now
            await models.start()
            await names.load(encode)  # the config's `voices:` clips
            state.ready = True
            log.info("streamtts server ready (max %d sessions)", settings.max_sessions)
            try:
                yield
            finally:
                state.closing = True
                state.ready = False
                await voices.aclose()
                if own_engine:
                    await models.aclose()

    def host_refused() -> None:
        state.metrics.errors_total.inc(code=ErrorCode.FORBIDDEN_HOST)

    # Outermost: a request for a foreign Host (DNS rebinding) reaches nothing else.
    hosts = HostAllowList(settings.allowed_hosts, settings.bind_host)
    middleware = [Middleware(HostCheckMiddleware, allow=hosts, on_refused=host_refused)]
    if settings.allowed_origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(settings.allowed_origins),
                allow_methods=["GET", "POST", "DELETE"],
                allow_headers=["authorization", "content-type", "x-model"],
            )
        )
    app = Starlette(
        routes=[
            Route("/", index),
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/admin/drain", admin_drain, methods=["POST"]),
            Route("/metrics", metrics),
            Route("/favicon.ico", favicon),
            Route("/v1/info", info),
            Route("/v1/audio/speech", speech_endpoint, methods=["POST"]),
            Route("/v1/voices", upload_voice, methods=["POST"]),
            Route("/v1/voices/design", design_voice, methods=["POST"]),
            Route("/v1/voices", list_voices, methods=["GET"]),
            Route("/v1/voices/{voice_id}", delete_voice, methods=["DELETE"]),
            Route("/v1/audio/voices", list_audio_voices),
            Route("/v1/lexicons", upload_lexicon, methods=["POST"]),
            Route("/v1/lexicons", list_lexicons, methods=["GET"]),
            Route("/v1/lexicons/{lexicon_id}", get_lexicon, methods=["GET"]),
            Route("/v1/lexicons/{lexicon_id}", delete_lexicon, methods=["DELETE"]),
            Route("/v1/models", list_models),
            WebSocketRoute("/v1/stream", websocket_endpoint),
            Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
        ],
        middleware=middleware,
        lifespan=lifespan,
    )
    app.state.streamtts = state
    return app


@contextlib.contextmanager
def uvicorn_refusals_quiet() -> Iterator[None]:
    """While serving: uvicorn's lines about malformed client requests are rate-limited and
    lose their tracebacks (see logs.py)."""
    uv = logging.getLogger("uvicorn.error")
    f = UvicornRefusalFilter()
    uv.addFilter(f)
    try:
        yield
    finally:
        uv.removeFilter(f)


def _state(request: Request) -> ServerState:
    s: ServerState = request.app.state.streamtts
    return s


async def index(request: Request) -> Response:
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})


async def healthz(request: Request) -> Response:
    s = _state(request)
    models = s.models
    status = "ok" if s.ready else ("closing" if s.closing else "starting")
    if s.ready and s.drain.active:
        status = "draining"  # alive: a liveness probe must not restart a draining replica
    body: dict[str, object] = {
        "status": status,
        "active_streams": models.active_streams(),
        "queued_streams": models.queued_streams(),
        "max_streams": models.max_streams(),
        "sessions": s.sessions,
        "max_sessions": s.settings.max_sessions,
        "voices": len(s.voices),
        "draining": s.drain.active,
    }
    e = models.default.engine
    adm = e.admission_info() if e is not None else {}
    if e is not None and adm:  # the measured capacity (engine/capacity.py)
        body["admission"] = e.config.admission
        body["capacity_streams"] = int(adm["capacity_streams"])
        body["tick_ms_at_capacity"] = adm["tick_ms_at_capacity"]
        body["frames_per_step"] = adm["frames_per_step"]
    return JSONResponse(body, status_code=200 if s.ready else 503)


async def readyz(request: Request) -> Response:
    """200 only while this replica should get the next session: loaded, not draining, and a
    session slot free. A balancer's health check turns a full or draining replica off.

    ``?model=ID``: the same for a session of that model (a balancer routing on the model checks
    each of its backends so): 404 ``unknown_model`` when this server does not serve ``ID``, else
    as above (a model not loaded yet is ready: its first request loads it; the session limit and
    the drain are the server's, for every model alike)."""
    s = _state(request)
    free = max(0, s.settings.max_sessions - s.sessions)
    draining = s.drain.active
    model = request.query_params.get("model")
    if not s.ready:
        status = "closing" if s.closing else "starting"
    elif draining:
        status = "draining"
    else:
        status = "ready" if free else "full"
    if model is not None and model not in s.models.models:
        status = "unknown_model"
    body = {
        "status": status,
        "free_slots": 0 if draining else free,
        "active_streams": s.models.active_streams(),
        "queued_streams": s.models.queued_streams(),
        "sessions": s.sessions,
        "max_sessions": s.settings.max_sessions,
        "draining": draining,
        "voice_store": s.voices.backend,
        "voice_store_up": s.voices.available,
        "models": {str(m["id"]): "loaded" if m["loaded"] else "unloaded" for m in s.models.listing()},
    }
    if model is not None:
        body["model"] = model
    code = 200 if status == "ready" else 404 if status == "unknown_model" else 503
    return JSONResponse(body, status_code=code)


async def admin_drain(request: Request) -> Response:
    """Start a drain, as SIGTERM does (the process exits when it is over)."""
    s = _state(request)
    denied = check_access(s, request)
    if denied is not None:
        return denied
    if not s.settings.token and not _loopback(request):
        s.metrics.errors_total.inc(code=ErrorCode.UNAUTHORIZED)
        return error_response(
            403,
            ErrorCode.UNAUTHORIZED,
            "without a server token, /admin/drain is only allowed from loopback (set --token)",
            "permission_error",
        )
    started = s.drain.start("POST /admin/drain")
    return JSONResponse(
        {
            "draining": True,
            "started": started,
            "timeout_s": s.drain.timeout_s,
            "live_sessions": s.drain.live,
        },
        status_code=202,
    )


def _loopback(request: Request) -> bool:
    host = request.client.host if request.client else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def metrics(request: Request) -> Response:
    return Response(_state(request).metrics.render(), media_type=CONTENT_TYPE)


async def upload_voice(request: Request) -> Response:
    s = _state(request)
    m = s.metrics
    body = await read_request(s, request, s.settings.max_voice_bytes, "clip")
    if isinstance(body, Response):
        return body
    try:
        data, form_name = await clip_from_body(request.headers, body)
    except ReferenceAudioError as exc:
        m.errors_total.inc(code=ErrorCode.INVALID_REFERENCE_AUDIO)
        return error_response(400, ErrorCode.INVALID_REFERENCE_AUDIO, str(exc))
    if not data:
        m.errors_total.inc(code=ErrorCode.INVALID_REFERENCE_AUDIO)
        return error_response(
            400,
            ErrorCode.INVALID_REFERENCE_AUDIO,
            "empty body: send the clip's bytes (wav, flac, ogg)",
        )
    name = request.query_params.get("name", "") or form_name
    refused = s.refuse_name(name)
    if refused is not None:
        m.errors_total.inc(code=ErrorCode.INVALID_REQUEST)
        return error_response(400, ErrorCode.INVALID_REQUEST, refused, param="name")
    try:
        voice = await s.voices.add(data, name=name)
    except ReferenceAudioError as exc:
        m.errors_total.inc(code=ErrorCode.INVALID_REFERENCE_AUDIO)
        return error_response(400, ErrorCode.INVALID_REFERENCE_AUDIO, str(exc))
    except VoiceStoreUnavailableError as exc:
        return store_unavailable(s, exc)
    except StreamTTSError as exc:
        log.exception("voice upload failed")
        m.errors_total.inc(code=ErrorCode.INTERNAL_ERROR)
        return error_response(500, ErrorCode.INTERNAL_ERROR, str(exc), "server_error")
    return JSONResponse(
        {
            "voice_id": voice.voice_id,
            "frames": voice.frames,
            "seconds": voice.seconds,
            "name": voice.name,
            "cached": voice.cached,
        },
        status_code=200 if voice.cached else 201,
    )


async def list_voices(request: Request) -> Response:
    s = _state(request)
    denied = check_access(s, request)
    if denied is not None:
        return denied
    try:
        infos = await s.voices.infos()
    except VoiceStoreUnavailableError as exc:
        return store_unavailable(s, exc)
    voices = [
        {"voice_id": v.voice_id, "name": v.name, "seconds": v.seconds, "frames": v.frames, "n_vq": v.n_vq}
        for v in infos
    ]
    return JSONResponse({"voices": voices, "capacity": s.voices.capacity, "store": s.voices.backend})


async def delete_voice(request: Request) -> Response:
    s = _state(request)
    denied = check_access(s, request)
    if denied is not None:
        return denied
    vid = request.path_params["voice_id"]
    try:
        deleted = await s.voices.delete(vid)
    except VoiceStoreUnavailableError as exc:
        return store_unavailable(s, exc)
    if not deleted:
        return error_response(404, ErrorCode.NOT_FOUND, f"no voice {vid!r}")
    return JSONResponse({"deleted": vid})
