"""Which served model a request's ``model`` names (pure: the session and the HTTP endpoint
both ask; server/models.py holds the models themselves)."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import FieldError

__all__ = ["DEFAULT_MODEL_ID", "OPENAI_NAMES", "resolve_model"]

DEFAULT_MODEL_ID = "streamtts"  # the id of a server's only model when none is given
# OpenAI's model names: clients send them whatever they talk to; with several models they
# mean the first
OPENAI_NAMES = frozenset({"tts-1", "tts-1-hd", "gpt-4o-mini-tts", DEFAULT_MODEL_ID})


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
