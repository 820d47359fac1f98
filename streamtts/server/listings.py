"""Listings that OpenAI-style clients and Kokoro-FastAPI-style UIs call.

* ``GET /v1/models``: OpenAI's list shape; every model this server serves (the first is the
  default), each with the family member it is (``model_kind``), its codebooks (``n_vq``) and
  whether it is loaded now (server/models.py).
* ``GET /v1/audio/voices``: every voice a request may name: the config's ``voices:`` names
  (``kind: "name"``; the model's own voice has ``seconds`` null, and the names that are only
  aliases of it, OpenAI's ``alloy``, ``nova``, ... without a table, say so: ``alias_of:
  "default"``) and the uploaded or stored voices (``kind: "uploaded"``; a request may name
  one by its ``name`` too), each with ``id``, ``name``, ``seconds``, ``n_vq`` and
  ``description``.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import VoiceStoreUnavailableError
from .app_state import ServerState
from .protocol import ErrorCode
from .speech_http import check_access, error_response

__all__ = ["list_audio_voices", "list_models"]

async def list_models(request: Request) -> Response:
    s: ServerState = request.app.state.streamtts
    denied = check_access(s, request)
    if denied is not None:
        return denied
    models = [{"object": "model", "created": 0, "owned_by": "streamtts", **m} for m in s.models.listing()]
    return JSONResponse({"object": "list", "data": models})


async def list_audio_voices(request: Request) -> Response:
    s: ServerState = request.app.state.streamtts
    denied = check_access(s, request)
    if denied is not None:
        return denied
    n_vq = s.models.n_vq(s.models.encoder_id)
    voices: list[dict[str, Any]] = []
    aliases = set(s.voice_names.aliases())
    for name in s.voice_names.names:
        v = s.voice_names.get(name)
        entry: dict[str, Any] = {
            "id": name, "name": name, "kind": "name",
            "seconds": None if v is None else round(v.seconds, 3),
            "n_vq": n_vq if v is None else int(v.codes.shape[1]),
            "description": "a clip of the config's voices" if v is not None else "the model's own voice",
        }  # fmt: skip
        if name in aliases:  # the same audio as `default`: say so, not a voice of its own
            entry.update(alias_of="default", description="an alias of the model's own voice")
        voices.append(entry)
    try:
        infos = await s.voices.infos()
    except VoiceStoreUnavailableError as exc:
        s.metrics.errors_total.inc(code=ErrorCode.VOICE_STORE_UNAVAILABLE)
        return error_response(503, ErrorCode.VOICE_STORE_UNAVAILABLE, str(exc), "server_error")
    for i in infos:  # designed ones (POST /v1/voices/design) say what they were made from
        voices.append({"id": i.voice_id, "name": i.name, "kind": "designed" if i.description else "uploaded",
                       "seconds": i.seconds, "n_vq": i.n_vq, "description": i.description or "an uploaded clip"})  # fmt: skip
    return JSONResponse({"voices": voices})
