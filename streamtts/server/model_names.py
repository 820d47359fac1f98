"""Which served model a request's ``model`` names (pure: the session and the HTTP endpoint
both ask; server/models.py holds the models themselves)."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import FieldError

__all__ = ["DEFAULT_MODEL_ID", "MODEL_HEADER", "OPENAI_NAMES", "pick_model", "resolve_model"]

DEFAULT_MODEL_ID = "streamtts"  # the id of a server's only model when none is given
# OpenAI's model names: clients send them whatever they talk to; with several models they
# mean the first
OPENAI_NAMES = frozenset({"tts-1", "tts-1-hd", "gpt-4o-mini-tts", DEFAULT_MODEL_ID})
# The request header that names the model (beside the URL's ?model=): a balancer routes on
# either without reading the body or the WebSocket's frames (deploy/haproxy.cfg)
MODEL_HEADER = "x-model"


def resolve_model(name: str | None, ids: Sequence[str]) -> str:
    """The id a request's ``model`` names: None or "" the first; with one model, any name (an
    OpenAI client sends ``tts-1``); with several, an id or one of OpenAI's names (the first).
    Anything else is a :class:`FieldError` listing the ids."""
    if not name:
        return ids[0]
    if name in ids:
        return name
    if len(ids) == 1 or name in OPENAI_NAMES:
        return ids[0]
    raise FieldError("model", f"unknown model {name!r}; this server serves: {', '.join(ids)}")


def pick_model(named: Sequence[tuple[str, str | None]], ids: Sequence[str]) -> str:
    """The id a request names in several places at once: ``named`` is (where, name) pairs, e.g.
    the URL's ``?model=``, the ``X-Model`` header, the body's ``model``. Names that are absent,
    empty or one of OpenAI's own (``tts-1``, which OpenAI clients always send) defer to the
    others; two places naming different models are a :class:`FieldError` (a balancer routed on
    one of them); the one left is resolved as :func:`resolve_model` does."""
    specific = [(where, n) for where, n in named if n and n not in OPENAI_NAMES]
    if len({n for _, n in specific}) > 1:
        said = ", ".join(f"{where} {n!r}" for where, n in specific)
        raise FieldError(
            "model",
            f"the request names different models ({said}): name one (behind a balancer that "
            "routes on the model, in the URL's ?model= or the X-Model header: the balancer "
            "passes the model it routed on, the default when the request named none, as X-Model)",
        )
    if specific:
        return resolve_model(specific[0][1], ids)
    return resolve_model(next((n for _, n in named if n), None), ids)
