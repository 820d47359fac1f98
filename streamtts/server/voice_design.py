"""``POST /v1/voices/design``: a voice designed from a description, stored, spoken by every member.

MOSS-VoiceGenerator speaks a sample sentence with the description as its instruction; the
audio is stored as a voice (its codes, its name, the description) in the voice store (Redis
when configured), as an uploaded clip would be. The audio is encoded by the server's encoder
(the model with the most codebooks: server/models.py), not kept as VoiceGenerator's own
16-level codes, so a 32-codebook member gets all 32 levels of the voice's audio (never padded
codes) and a member with fewer takes the first levels.
"""

from __future__ import annotations

import io
import logging

import msgspec
import numpy as np
import soundfile as sf
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..constants import SAMPLE_RATE
from ..errors import (
    FieldError,
    ModelLoadError,
    ReferenceAudioError,
    StreamTTSError,
    VoiceStoreUnavailableError,
)
from ..request import StreamOptions
from .app_state import ServerState
from .models import ServedModel
from .protocol import ErrorCode, error_for_exception
from .speech_http import check_access, error_response, read_request

log = logging.getLogger(__name__)

__all__ = ["DesignRequest", "design_voice"]

VOICE_GENERATOR = "moss-voice-generator"
DEFAULT_SAMPLE = "Hello! This is the voice you asked for. I can read anything you like, in this voice."
MAX_DESCRIPTION_CHARS = 2000


class DesignRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    description: str  # the voice, described: VoiceGenerator's instruction
    text: str | None = None  # what the sample says (its audio is the voice); default: DEFAULT_SAMPLE
    model: str | None = None  # a VoiceGenerator model's id when several are served
    name: str = ""  # the name requests may use for it (as an upload's ?name=)
    seed: int | None = None
    language: str | None = None


def _designer(state: ServerState, name: str | None) -> ServedModel:
    """The VoiceGenerator model that designs: the one named, else the first served."""
    models = state.models
    if name is not None:
        m = models.resolve(name)
        if m.spec.kind != VOICE_GENERATOR:
            raise FieldError("model", f"model {m.id!r} is {m.spec.kind or 'moss-tts'}, not MOSS-VoiceGenerator: voices are designed by a VoiceGenerator")
        return m
    for mid in models.ids:
        if models.models[mid].spec.kind == VOICE_GENERATOR:
            return models.models[mid]
    raise FieldError(
        "model",
        "this server serves no MOSS-VoiceGenerator, which designs voices: serve one beside the others "
        "(streamtts serve --model design=VOICEGENERATOR.yaml --model ...; docs/family-service.md)",
    )


def _check(req: DesignRequest, state: ServerState) -> str:
    description = req.description.strip()
    if not description:
        raise FieldError("description", "description is empty: describe the voice (e.g. 'a calm, low male voice')")
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise FieldError("description", f"description is {len(description)} characters; at most {MAX_DESCRIPTION_CHARS}")
    limit = state.settings.session.max_text_chars
    if req.text is not None and (not req.text.strip() or len(req.text) > limit):
        raise FieldError("text", f"text (the sample the voice speaks) must be 1-{limit} characters")
    return description


async def design_voice(request: Request) -> Response:
    s: ServerState = request.app.state.streamtts
    m = s.metrics
    denied = check_access(s, request)
    if denied is not None:
        return denied
    body = await read_request(s, request, s.settings.max_http_body_bytes, "body")
    if isinstance(body, Response):
        return body
    try:
        req = msgspec.json.decode(body, type=DesignRequest)
        description = _check(req, s)
        # the body's model, else the URL's ?model= (a balancer routes on it; not X-Model, which
        # a balancer sets to its default model when the request names none)
        url_model = request.query_params.get("model")
        if req.model and url_model and req.model != url_model:
            raise FieldError("model", f"the body names model {req.model!r}, the URL's ?model= {url_model!r}: name one")
        designer = _designer(s, req.model or url_model)
    except FieldError as exc:
        m.errors_total.inc(code=ErrorCode.INVALID_OPTION)
        return error_response(400, ErrorCode.INVALID_OPTION, str(exc), param=exc.field)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        m.errors_total.inc(code=ErrorCode.INVALID_REQUEST)
        return error_response(400, ErrorCode.INVALID_REQUEST, str(exc))
    refused = s.refuse_name(req.name)
    if refused is not None:
        m.errors_total.inc(code=ErrorCode.INVALID_REQUEST)
        return error_response(400, ErrorCode.INVALID_REQUEST, refused, param="name")
    client = request.client.host if request.client else ""
    busy = s.try_acquire("http", client)
    if busy is not None:
        m.errors_total.inc(code=busy)
        resp = error_response(503, busy, s.refusal_message(busy), "server_error")
        resp.headers["Retry-After"] = "1"
        return resp
    try:
        pcm = await _speak(s, designer, req, description)
        wav = io.BytesIO()
        sf.write(wav, pcm, SAMPLE_RATE, format="WAV", subtype="FLOAT")
        info = await s.voices.add(wav.getvalue(), name=req.name, description=description)
    except ModelLoadError as exc:
        m.errors_total.inc(code=ErrorCode.MODEL_UNAVAILABLE)
        return error_response(503, ErrorCode.MODEL_UNAVAILABLE, str(exc), "server_error", param="model")
    except VoiceStoreUnavailableError as exc:
        m.errors_total.inc(code=ErrorCode.VOICE_STORE_UNAVAILABLE)
        return error_response(503, ErrorCode.VOICE_STORE_UNAVAILABLE, str(exc), "server_error")
    except ReferenceAudioError as exc:  # the sample came out too short or silent to be a voice
        m.errors_total.inc(code=ErrorCode.GENERATION_FAILED)
        return error_response(500, ErrorCode.GENERATION_FAILED, f"the designed sample is no usable voice: {exc}", "server_error")
    except StreamTTSError as exc:
        code, _, _ = error_for_exception(exc)
        m.errors_total.inc(code=code)
        status = 503 if code in (ErrorCode.OVERLOADED, ErrorCode.QUEUE_TIMEOUT) else 500
        return error_response(status, code, str(exc), "server_error")
    finally:
        s.release(client)
    log.info("designed voice %s (%s) from %r", info.voice_id, info.name or "no name", description[:80])
    return JSONResponse({
        "voice_id": info.voice_id, "name": info.name, "seconds": info.seconds, "frames": info.frames,
        "n_vq": info.n_vq, "description": description, "model": designer.id, "kind": "designed",
    })  # fmt: skip


async def _speak(s: ServerState, designer: ServedModel, req: DesignRequest, description: str) -> np.ndarray:
    """The sample, spoken by the VoiceGenerator with the description as its instruction."""
    engine = await s.models.acquire(designer)
    try:
        options = StreamOptions(
            instruction=description, language=req.language, seed=req.seed,
            max_new_tokens=s.settings.session.max_new_tokens,
        )  # fmt: skip
        return await engine.synthesize(req.text or DEFAULT_SAMPLE, options=options)
    finally:
        s.models.release(designer)
