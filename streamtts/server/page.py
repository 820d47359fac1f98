"""What the browser page needs besides the protocol: its icon, what the server runs, form uploads.

Routes (added in app.py)::

    GET /favicon.ico, /static/favicon.svg   the page's icon (browsers ask for /favicon.ico)
    GET /v1/info                            the loaded model's name, its n_vq, whether it is the demo

``/v1/info`` is open like ``/healthz``: the page shows it before anyone typed a token, and it
names a model, nothing secret. ``POST /v1/voices`` takes a clip's bytes as the body, or, from
a form or ``curl -F file=@clip.wav``, as the file part of a ``multipart/form-data`` body
(parsed with Starlette's parser, python-multipart underneath).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path

from starlette.datastructures import Headers, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response

from ..constants import N_VQ
from ..errors import ReferenceAudioError

__all__ = ["DEMO_NOTICE", "clip_from_body", "favicon", "info"]

STATIC = Path(__file__).parent / "static"
DEMO_NOTICE = (
    "This server runs the synthetic demo model: random weights in the real model's layout. "
    "It speaks in soft tones, not words; real speech needs the real weights (streamtts download)."
)


async def favicon(request: Request) -> Response:
    return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml")


async def info(request: Request) -> Response:
    state = request.app.state.streamtts
    default = state.models.default
    engine_info = default.engine.info if default.engine is not None else {"n_vq": default.spec.n_vq, "model_kind": default.spec.kind}
    demo = bool(engine_info.get("demo", False))
    return JSONResponse(
        {
            "model": engine_info.get("model", ""),
            "demo": demo,
            "notice": DEMO_NOTICE if demo else None,
            "ready": bool(state.ready),
            "n_vq": int(engine_info.get("n_vq", N_VQ)),  # the model's codebooks per frame
            "model_kind": engine_info.get("model_kind"),  # the family member loaded (core/family.py)
            "models": state.models.listing(),  # every model served (server/models.py), the first the default
            # where the backbone runs, as llama.cpp reported it (model/placement.py)
            "backbone": {
                k: engine_info[k]
                for k in ("backend", "device", "device_description", "layers_offloaded", "layers_total", "device_memory_mib", "cpu_backend")
                if k in engine_info
            },
        }
    )


async def clip_from_body(headers: Headers, body: bytes) -> tuple[bytes, str]:
    """(the clip's bytes, the form's ``name`` field or "") from an upload's body.

    A plain body is the clip itself; a multipart form holds it as its (first) file part.
    """
    if not headers.get("content-type", "").startswith("multipart/form-data"):
        return body, ""

    async def stream() -> AsyncGenerator[bytes, None]:
        yield body

    try:
        form = await MultiPartParser(headers, stream(), max_files=1, max_fields=8).parse()
    except MultiPartException as exc:
        raise ReferenceAudioError(f"cannot read the multipart form: {exc.message}") from exc
    try:
        name = form.get("name")
        for _, value in form.multi_items():
            if isinstance(value, UploadFile):
                return await value.read(), name if isinstance(name, str) else ""
    finally:
        await form.close()
    raise ReferenceAudioError(
        "the multipart form has no file part: send the clip as a file (curl -F file=@clip.wav)"
    )
