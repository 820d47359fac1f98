"""The lexicon endpoints (lexicon_store.py keeps them; text/lexicon.py says the rules)::

    POST   /v1/lexicons[?name=NAME]   the body a JSON object {"word": "reading", ...}: 201
                                      (200: stored already) {"lexicon_id", "name", "size"}
    GET    /v1/lexicons               the stored ones, the server's own (its size), the store
    GET    /v1/lexicons/{id or name}  one, with its entries
    DELETE /v1/lexicons/{id or name}

A bad lexicon is a 400 ``invalid_option`` with ``param: "lexicon"`` naming the entry at fault.
"""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import FieldError, VoiceStoreUnavailableError
from .app_state import ServerState
from .lexicon_store import MAX_LEXICON_BODY, MAX_NAME_CHARS, valid_lexicon_name
from .protocol import ErrorCode
from .speech_http import check_access, error_response, read_request, store_unavailable

__all__ = ["delete_lexicon", "get_lexicon", "list_lexicons", "upload_lexicon"]


def _store(request: Request) -> ServerState:
    s: ServerState = request.app.state.streamtts
    return s


async def upload_lexicon(request: Request) -> Response:
    """POST /v1/lexicons[?name=NAME], the body a JSON object: 201 (200: stored already)
    ``{"lexicon_id", "name", "size"}``; 400 naming the entry at fault."""
    s = _store(request)
    m = s.metrics
    body = await read_request(s, request, MAX_LEXICON_BODY, "lexicon")
    if isinstance(body, Response):
        return body
    name = request.query_params.get("name", "")
    if name and not valid_lexicon_name(name):
        m.errors_total.inc(code=ErrorCode.INVALID_REQUEST)
        return error_response(
            400, ErrorCode.INVALID_REQUEST,
            f"name {name[:80]!r}: a lexicon name is 1-{MAX_NAME_CHARS} characters, not in an id's form (lx_...)",
            param="name",
        )  # fmt: skip
    try:
        entries = json.loads(body)
    except (ValueError, RecursionError) as exc:
        m.errors_total.inc(code=ErrorCode.INVALID_REQUEST)
        return error_response(
            400, ErrorCode.INVALID_REQUEST, f"the body is not JSON: {exc}", param="lexicon"
        )
    try:
        info, new = await s.lexicons.add(entries, name=name)
    except FieldError as exc:
        m.errors_total.inc(code=ErrorCode.INVALID_OPTION)
        return error_response(400, ErrorCode.INVALID_OPTION, str(exc), param=exc.field)
    except VoiceStoreUnavailableError as exc:
        return store_unavailable(s, exc)
    return JSONResponse(info.as_dict(), status_code=201 if new else 200)


async def list_lexicons(request: Request) -> Response:
    s = _store(request)
    denied = check_access(s, request)
    if denied is not None:
        return denied
    try:
        infos = await s.lexicons.infos()
    except VoiceStoreUnavailableError as exc:
        return store_unavailable(s, exc)
    base = s.lexicons.base
    return JSONResponse({
        "lexicons": [i.as_dict() for i in infos],
        "server": None if base is None else {"size": len(base)},
        "store": s.lexicons.backend,
    })  # fmt: skip


async def get_lexicon(request: Request) -> Response:
    s = _store(request)
    denied = check_access(s, request)
    if denied is not None:
        return denied
    ref = request.path_params["lexicon_id"]
    try:
        lex = await s.lexicons.fetch(ref)
    except VoiceStoreUnavailableError as exc:
        return store_unavailable(s, exc)
    if lex is None:
        return error_response(404, ErrorCode.NOT_FOUND, f"no lexicon {ref[:80]!r}")
    return JSONResponse({"lexicon_id": lex.id, "name": lex.name, "entries": lex.entries})


async def delete_lexicon(request: Request) -> Response:
    s = _store(request)
    denied = check_access(s, request)
    if denied is not None:
        return denied
    ref = request.path_params["lexicon_id"]
    try:
        deleted = await s.lexicons.delete(ref)
    except VoiceStoreUnavailableError as exc:
        return store_unavailable(s, exc)
    if not deleted:
        return error_response(404, ErrorCode.NOT_FOUND, f"no lexicon {ref[:80]!r}")
    return JSONResponse({"deleted": ref})
