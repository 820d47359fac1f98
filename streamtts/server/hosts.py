"""The ``Host`` allow-list: the defence against DNS rebinding.

A page on ``http://evil.example:8000`` can make its name resolve to 127.0.0.1
after loading; the browser then sends its requests to this server with
``Host: evil.example:8000`` and ``Origin: http://evil.example:8000``. The
origin check cannot tell (origin and host agree), so the Host itself must be
one this server answers to, as Jupyter's ``local_hostnames`` does:

- an IP address literal (``127.0.0.1``, ``[::1]``, the address the server
  binds or any of the machine's): rebinding needs a name the attacker
  controls, and a page whose URL holds an address was loaded from that address;
- ``localhost`` and names under ``.localhost`` (they resolve to loopback only);
- the name the server was told to bind (``--host myhost.lan``);
- the names given with ``--allowed-host`` (``*`` turns the check off, e.g.
  behind a proxy that checks Host itself).

Anything else gets 403 ``forbidden_host`` (HTTP) or has its WebSocket
handshake refused with 403. A request without a Host header (HTTP/1.0, not a
browser) passes.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable

from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from .logs import REFUSALS
from .protocol import CloseCode, ErrorCode

__all__ = ["HostAllowList", "HostCheckMiddleware", "deny_websocket"]


def _name(host: str) -> str | None:
    """The host name of a Host header (port and IPv6 brackets removed, lower case); None
    when the header is malformed."""
    host = host.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        if end < 0 or (host[end + 1 :] and not _is_port(host[end + 1 :])):
            return None
        return host[1:end]
    name, sep, port = host.rpartition(":")
    if not sep:
        name = host
    elif not _is_port(":" + port):
        return None
    return name.rstrip(".") or None


def _is_port(s: str) -> bool:
    return s.startswith(":") and s[1:].isdigit() and len(s) <= 6


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostAllowList:
    """Which Host headers this server answers (see the module doc)."""

    def __init__(self, allowed: Iterable[str] = (), bind_host: str | None = None) -> None:
        names = {n.strip().lower().rstrip(".") for n in allowed if n.strip()}
        self.any = "*" in names
        if bind_host:
            names.add(bind_host.strip().lower().strip("[]").rstrip("."))
        self.names = frozenset(names - {"*", ""})

    def allows(self, host: str | None) -> bool:
        if host is None or self.any:
            return True
        name = _name(host)
        if name is None:
            return False
        return (
            _is_ip(name)
            or name == "localhost"
            or name.endswith(".localhost")
            or name in self.names
        )


class HostCheckMiddleware:
    """ASGI middleware: refuse HTTP requests and WebSocket handshakes with a foreign Host."""

    def __init__(
        self, app: ASGIApp, allow: HostAllowList, on_refused: Callable[[], None] | None = None
    ) -> None:
        self.app = app
        self.allow = allow
        self.on_refused = on_refused  # counts the refusal (metrics)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = HTTPConnection(scope).headers.get("host")
        if self.allow.allows(host):
            await self.app(scope, receive, send)
            return
        if self.on_refused is not None:
            self.on_refused()
        client = scope.get("client") or ("?", 0)
        REFUSALS.log("refused %s from %s: Host %r is not allowed", scope["type"], client[0], host)
        message = (
            f"Host {host!r} is not one this server answers to (allow it with --allowed-host)"
        )
        if scope["type"] == "websocket":
            await deny_websocket(WebSocket(scope, receive, send), 403, ErrorCode.FORBIDDEN_HOST, message)
            return
        body = {
            "error": {
                "message": message,
                "type": "permission_error",
                "param": None,
                "code": ErrorCode.FORBIDDEN_HOST,
            }
        }
        await JSONResponse(body, status_code=403)(scope, receive, send)


async def deny_websocket(ws: WebSocket, status: int, code: str, message: str) -> None:
    """Refuse a WebSocket handshake with an HTTP status and an error body (close 1008 where
    the server cannot send a response to a handshake)."""
    resp = JSONResponse({"error": {"code": code, "message": message}}, status_code=status)
    try:
        await ws.send_denial_response(resp)
    except RuntimeError:
        await ws.close(CloseCode.POLICY)
