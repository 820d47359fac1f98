"""Server-wide settings and state shared by the routes."""

from __future__ import annotations

import hmac
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ..engine.segmented import DEFAULT_CONTINUITY_FRAMES, DEFAULT_FADE_MS
from ..errors import ConfigError
from ..request import Voice
from ..text.lexicon import Lexicon
from .drain import Drain
from .lexicon_store import LexiconStore
from .metrics import ServerMetrics
from .models import ModelSet
from .protocol import ErrorCode
from .session import SessionSettings
from .voice_names import VoiceNames
from .voice_store import VoiceStoreSettings
from .voices import MAX_NAME_CHARS, VoiceStore, valid_voice_name

__all__ = ["ServerSettings", "ServerState"]


@dataclass(frozen=True, slots=True)
class ServerSettings:
    session: SessionSettings = field(default_factory=SessionSettings)
    max_sessions: int = 8  # WebSocket sessions + HTTP speech requests at once; beyond: refused
    # ... of them from one client address (None: no cap but max_sessions; on loopback every
    # local client shares 127.0.0.1, so set it on servers others reach)
    max_sessions_per_client: int | None = None
    token: str | None = None  # bearer token for /v1/*; None = open
    # extra browser origins ("*" = any); the page's own origin is always allowed
    allowed_origins: tuple[str, ...] = ()
    # Host names answered besides IP literals, localhost and bind_host ("*" = any): hosts.py
    allowed_hosts: tuple[str, ...] = ()
    bind_host: str | None = None  # the address or name the server binds (`--host`)
    # audio seconds queued per connection before generation waits (the engine's
    # buffered-ahead pause then holds the stream)
    send_buffer_s: float = 2.0
    send_lead_s: float = 4.0  # audio seconds on the socket ahead of what the listener consumed
    # A WebSocket client this many seconds behind a real-time listener is dropped (pacing.py);
    # an HTTP client whose response waits this long with nothing taken is.
    send_stall_s: float = 10.0
    ws_max_size: int = 1 << 20  # hard message limit enforced by the websockets library (close 1009)
    ping_interval_s: float = 20.0
    ping_timeout_s: float = 20.0
    voice_cache_size: int = 256
    max_voice_bytes: int = 16 << 20
    max_http_body_bytes: int = 1 << 20
    lookahead: int = 1
    continuity_frames: int = DEFAULT_CONTINUITY_FRAMES
    fade_ms: float = DEFAULT_FADE_MS
    warmup: bool = True
    # memory (this process) or redis://host:6379/0 (shared by replicas): voice_store.py
    voice_store: VoiceStoreSettings = field(default_factory=VoiceStoreSettings)
    # SIGTERM / POST /admin/drain: running streams get this long to finish (drain.py)
    drain_timeout_s: float = 30.0
    # the server's pronunciation lexicon (`serve --lexicon FILE`): every request reads with it,
    # under its own entries (lexicon_store.py)
    lexicon: Lexicon | None = None

    def validate(self) -> ServerSettings:
        if self.max_sessions < 1:
            raise ConfigError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if self.max_sessions_per_client is not None and self.max_sessions_per_client < 1:
            raise ConfigError(
                f"max_sessions_per_client must be >= 1 (or None), got {self.max_sessions_per_client}"
            )
        if self.session.first_message_timeout_s <= 0 or self.session.idle_timeout_s <= 0:
            raise ConfigError("first_message_timeout_s and idle_timeout_s must be > 0")
        if self.send_buffer_s <= 0 or self.send_stall_s <= 0 or self.send_lead_s <= 0:
            raise ConfigError("send_buffer_s, send_lead_s and send_stall_s must be > 0")
        if self.session.max_message_bytes > self.ws_max_size:
            raise ConfigError("max_message_bytes must be <= ws_max_size")
        if self.drain_timeout_s <= 0:
            raise ConfigError(f"drain_timeout_s must be > 0, got {self.drain_timeout_s}")
        self.voice_store.validate()
        if self.session.max_contexts < 1:
            raise ConfigError(f"max_contexts must be >= 1, got {self.session.max_contexts}")
        return self


class ServerState:
    """What every request sees: the models, the voices, the metrics, the session count."""

    def __init__(
        self,
        models: ModelSet,
        settings: ServerSettings,
        voices: VoiceStore,
        voice_names: VoiceNames | None = None,
        lexicons: LexiconStore | None = None,
    ) -> None:
        self.models = models
        self.settings = settings
        self.voices = voices
        self.lexicons = lexicons or LexiconStore(settings.lexicon)
        self.voice_names = voice_names or VoiceNames()
        default = models.default
        self.metrics = ServerMetrics(
            models.active_streams,
            models.queued_streams,
            lambda: default.engine.prefix_cache_info() if default.engine is not None else {},
            lambda: 1.0 if voices.available else 0.0,
            lambda: dict(default.engine.info) if default.engine is not None else {},
            lambda: default.engine.admission_info() if default.engine is not None else {},
            models.listing,
        )
        self.drain = Drain(self.metrics, settings.drain_timeout_s)
        self.sessions = 0
        self._per_client: Counter[str] = Counter()
        self.ready = False  # engine loaded and warmed up
        self.closing = False

    # -- session slots -----------------------------------------------------------------------
    def try_acquire(self, kind: str, client: str = "") -> str | None:
        """Take a session slot for ``client`` (its address); None when taken, else the error
        code of the refusal: ``overloaded`` (all slots busy) or ``too_many_sessions``."""
        s = self.settings
        if self.sessions >= s.max_sessions or self.closing:
            self.metrics.refused_total.inc(kind=kind)
            return ErrorCode.OVERLOADED
        cap = s.max_sessions_per_client
        if cap is not None and self._per_client[client] >= cap:
            self.metrics.refused_total.inc(kind=kind)
            return ErrorCode.TOO_MANY_SESSIONS
        self.sessions += 1
        self._per_client[client] += 1
        self.metrics.sessions.set(self.sessions)
        self.metrics.sessions_total.inc(kind=kind)
        return None

    def release(self, client: str = "") -> None:
        self.sessions -= 1
        self._per_client[client] -= 1
        if self._per_client[client] <= 0:
            del self._per_client[client]
        self.metrics.sessions.set(self.sessions)

    def refusal_message(self, code: str) -> str:
        if code == ErrorCode.TOO_MANY_SESSIONS:
            return (
                f"this client address already has {self.settings.max_sessions_per_client} "
                "sessions open (the limit per address); close one or try again later"
            )
        return f"the server is at its limit of {self.settings.max_sessions} sessions; try again later"

    # -- voices ---------------------------------------------------------------------------------
    def named_voice(self, name: str) -> Voice | None:
        """A configured name's clip, else an uploaded voice id's voice (None: neither)."""
        return self.voice_names.get(name) or self.voices.get(name)

    def refuse_name(self, name: str) -> str | None:
        """Why a stored voice may not take ``name`` (requests then use the name), or None."""
        if not name:
            return None
        if not valid_voice_name(name):
            return f"name {name[:80]!r}: a voice name is 1-{MAX_NAME_CHARS} characters, not in a voice id's form"
        if name in self.voice_names:
            return f"name {name!r} is one of the config's voice names ({', '.join(self.voice_names.names)}): choose another"
        return None

    def unknown_voice(self, name: str) -> str:
        """The message for a request naming no voice: every voice it could have named."""
        return self.voice_names.unknown_message(name, self.voices.local.names())

    def lookup_voice(self, name: str) -> tuple[bool, Voice | None]:
        """(known, reference) for a request's ``voice``: a name of the model's own voice is
        known without a reference."""
        if name in self.voice_names.own:
            return True, None
        ref = self.named_voice(name)
        return ref is not None, ref

    # -- access checks -------------------------------------------------------------------------
    # what a refused client is told: the flag that set the token, and how to send it
    TOKEN_REFUSED = (
        "missing or wrong bearer token: this server was started with --token; send the same "
        "token as `Authorization: Bearer TOKEN` (streamtts say and the examples: --token TOKEN "
        "or $STREAMTTS_TOKEN; a browser: ?token=TOKEN)"
    )

    def token_ok(self, headers: Any, query: Any) -> bool:
        want = self.settings.token
        if not want:
            return True
        got = ""
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            got = auth[7:].strip()
        elif "token" in query:  # browsers cannot set headers on a WebSocket
            got = query["token"]
        return hmac.compare_digest(got.encode(), want.encode())

    def origin_ok(self, headers: Any) -> bool:
        """Browsers send Origin; other clients don't (and are not subject to this check)."""
        origin = headers.get("origin")
        if not origin:
            return True
        allowed = self.settings.allowed_origins
        if "*" in allowed or origin in allowed:
            return True
        host = headers.get("host", "")
        return bool(urlsplit(origin).netloc == host)
