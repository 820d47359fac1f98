"""Voice names: the config's ``voices:`` table, so clients that only know names (OpenAI's
``alloy``, ``echo``, ...; Pipecat's OpenAI service accepts nothing else) get configured voices.

::

    voices:
      alloy: voices/alloy.wav     # a reference clip (resolved like the model paths)
      echo: voices/echo.flac
      default: null               # null: the model's own voice

Each clip is encoded once when the server starts (a missing or unreadable clip stops the
start, naming it). Without a table every OpenAI voice name (and ``default``) is the model's
own voice. A name that is neither in the table nor a voice id from ``POST /v1/voices`` is
refused with the list of the names there are.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path

from ..errors import ConfigError, ReferenceAudioError
from ..request import Voice

log = logging.getLogger(__name__)

__all__ = ["OPENAI_VOICES", "VoiceNames"]

OPENAI_VOICES = (
    "alloy ash ballad coral echo fable onyx nova sage shimmer verse marin cedar".split()
)


class VoiceNames:
    """name -> reference :class:`Voice` (clips, after :meth:`load`) or the model's own voice."""

    def __init__(self, table: Mapping[str, str | None] | None = None) -> None:
        table = dict(table or {})
        if not table:
            table = {name: None for name in ("default", *OPENAI_VOICES)}
        table.setdefault("default", None)
        self.clips = {k: v for k, v in table.items() if v}
        self.own = frozenset(k for k, v in table.items() if not v)
        self._voices: dict[str, Voice] = {}

    @property
    def names(self) -> list[str]:
        return sorted([*self.own, *self.clips])

    def __contains__(self, name: object) -> bool:
        return name in self.own or name in self.clips

    def get(self, name: str) -> Voice | None:
        """The encoded clip of ``name`` (None for the model's own voice or an unknown name)."""
        return self._voices.get(name)

    async def load(self, encode: Callable[[bytes, str], Awaitable[Voice]]) -> None:
        """Encode every clip of the table (at start-up)."""
        for name, path in self.clips.items():
            try:
                data = Path(path).read_bytes()
            except OSError as exc:
                raise ConfigError(f"voices: {name}: cannot read {path}: {exc}") from exc
            try:
                self._voices[name] = await encode(data, name)
            except ReferenceAudioError as exc:
                raise ConfigError(f"voices: {name}: {path}: {exc}") from exc
            log.info("voice %r: %s (%d frames)", name, path, self._voices[name].codes.shape[0])

    def aliases(self) -> list[str]:
        """The names that stand for the model's own voice besides ``default``."""
        return sorted(self.own - {"default"})

    def summary(self, uploaded: Iterable[str] = ()) -> str:
        """Every name, then what each is: ``alloy, default, echo, bob (echo: an alias of
        default, the model's own voice; alloy: the config's voices; bob: uploaded)``."""
        uploaded = list(uploaded)
        aliases = self.aliases()
        kinds = [f"{', '.join(aliases)}: {'aliases' if len(aliases) > 1 else 'an alias'} of default, "
                 "the model's own voice" if aliases else "default: the model's own voice"]  # fmt: skip
        if self.clips:
            kinds.append(f"{', '.join(sorted(self.clips))}: the config's voices")
        if uploaded:
            kinds.append(f"{', '.join(uploaded)}: uploaded")
        return f"{', '.join([*self.names, *uploaded])} ({'; '.join(kinds)})"

    def unknown_message(self, name: str, uploaded: Iterable[str] = ()) -> str:
        """What a request naming no voice is told: the voices there are, and how to add one."""
        return (
            f"unknown voice {name!r}; this server has: {self.summary(uploaded)}; or upload a clip "
            "(POST /v1/voices?name=NAME; `streamtts say --reference clip.wav`) and use its name or id"
        )
