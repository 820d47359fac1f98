"""Hostile and clumsy clients against a real ``streamtts serve`` process (issue #18).

Each case sends exactly the input that once hurt the server, over real sockets (a raw
socket and the ``websockets`` sans-I/O client where the framing must be odd), asserts the
documented answer, and then that the server is healthy: ``/healthz`` ok and a normal
synthesis completes. The sans-I/O session is fuzzed in server/test_server_fuzz.py.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import soundfile as sf
import websockets
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import State
from websockets.uri import parse_uri

from benchmarks._common import MAX_VOICE_BYTES, flac_bomb, peak_rss_during
from streamtts.server.hosts import HostAllowList
from streamtts.server.logs import RateLimitedLog

SHORT = "Hello there, this is a short test."
LONG = " ".join(f"This is sentence number {i} of a long text that keeps going." for i in range(12))
BASE = ["--max-streams", "4", "--n-threads", "2", "--segment-max-new-tokens", "44"]
FIRST_MESSAGE_S = 3  # long enough for the test to see the silent sockets hold every slot


@pytest.fixture(scope="module")
def server(serve: Any) -> Any:
    """Four sessions at most, as the default server has; a short first-message timeout."""
    return serve(*BASE, "--max-sessions", "4", "--first-message-timeout", str(FIRST_MESSAGE_S), "--idle-timeout", "30")


@pytest.fixture(scope="module")
def capped(serve: Any) -> Any:
    """Two sessions per client address; one extra Host name allowed."""
    return serve(*BASE, "--max-sessions", "4", "--max-sessions-per-client", "2", "--allowed-host", "app.example", "--no-warmup")


# -- clients ------------------------------------------------------------------------------------


@dataclass
class Result:
    messages: list[dict[str, Any]] = field(default_factory=list)
    audio: int = 0
    close_code: int | None = None

    def codes(self) -> list[str]:
        return [m["code"] for m in self.messages if m["type"] == "error"]

    def types(self) -> list[str]:
        return [m["type"] for m in self.messages]


async def talk_async(url: str, msgs: list[Any], **connect: Any) -> Result:
    """Send ``msgs`` (dicts as JSON, str/bytes as they are), then read until the server closes."""
    r = Result()
    async with websockets.connect(url, max_size=None, **connect) as ws:
        try:
            for m in msgs:
                await ws.send(m if isinstance(m, (str, bytes)) else json.dumps(m))
        except websockets.ConnectionClosed:
            pass
        try:
            async with asyncio.timeout(60):
                async for frame in ws:
                    if isinstance(frame, bytes):
                        r.audio += len(frame)
                    else:
                        r.messages.append(json.loads(frame))
        except websockets.ConnectionClosed:
            pass
        r.close_code = ws.close_code
    return r


def talk(url: str, msgs: list[Any], **connect: Any) -> Result:
    return asyncio.run(talk_async(url, msgs, **connect))


def say(text: str = SHORT, **start: Any) -> list[Any]:
    return [{"type": "start", "seed": 1, **start}, {"type": "text", "text": text}, {"type": "end"}]


def assert_healthy(srv: Any) -> None:
    """/healthz answers ok and a normal session speaks, with nothing left open after it."""
    h = srv.health()
    assert h["status"] == "ok", h
    r = talk(srv.ws, say())
    assert r.codes() == [] and r.types()[-1] == "done" and r.close_code == 1000, (r, srv.log_tail())
    assert r.audio > 0
    srv.wait_idle()


class RawWs:
    """A WebSocket client on a plain socket, framing by hand where a test needs it odd:
    the ``websockets`` sans-I/O client builds the frames, this class moves the bytes."""

    def __init__(
        self, port: int, headers: dict[str, str] | None = None, source: str | None = None, rcvbuf: int = 0
    ) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:  # before connecting: the window the server sees
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        if source is not None:
            self.sock.bind((source, 0))
        self.sock.connect(("127.0.0.1", port))
        self.proto = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/v1/stream"), max_size=None)
        request = self.proto.connect()
        for name, value in (headers or {}).items():
            if name in request.headers:
                del request.headers[name]
            request.headers[name] = value
        self.proto.send_request(request)
        self.sock.sendall(b"".join(self.proto.data_to_send()))
        self.response: Response | None = None
        self.sock.settimeout(30)
        while self.proto.state is State.CONNECTING:  # byte by byte: nothing past the response
            data = self.sock.recv(1)
            if not data:
                break
            self.proto.receive_data(data)
        for ev in self.proto.events_received():
            if isinstance(ev, Response):
                self.response = ev
        self.reset = False

    @property
    def status(self) -> int:
        assert self.response is not None
        return self.response.status_code

    def send_json(self, msg: Any) -> None:
        self.proto.send_text((msg if isinstance(msg, str) else json.dumps(msg)).encode())
        self.flush()

    def send_frame(self, frame: Frame) -> None:
        self.proto.send_frame(frame)
        self.flush()

    def flush(self) -> None:
        try:
            self.sock.sendall(b"".join(self.proto.data_to_send()))
        except ConnectionResetError:
            self.reset = True

    def read_until_closed(self, timeout: float = 60) -> Result:
        """Read (answering the close handshake) until the server ends the TCP connection."""
        r = Result()
        self.sock.settimeout(timeout)
        while True:
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                self.reset = True
                break
            if not data:
                self.proto.receive_eof()
                break
            self.proto.receive_data(data)
            for ev in self.proto.events_received():
                if ev.opcode is Opcode.TEXT:
                    r.messages.append(json.loads(ev.data))
                elif ev.opcode is Opcode.BINARY:
                    r.audio += len(ev.data)
            self.flush()
        r.close_code = self.proto.close_code
        self.sock.close()
        return r

    def close(self) -> None:
        self.sock.close()


def wait_until(what: Any, timeout: float = 60) -> None:
    """Poll ``what`` until true (the event, not a time: the timeout only ends a hung test)."""
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "the moment of the test never came"
        time.sleep(0.01)


def log_text(srv: Any) -> str:
    return srv.log_path.read_text(errors="replace")


# an error line, in the server's style (`streamtts: error: ...`, uvicorn's records too)
ERROR_LINE = re.compile(r"(?m)^(streamtts: error:|ERROR)")


def assert_log_clean(srv: Any) -> None:
    """Refusals are INFO lines: no ERROR, no traceback in the server's log."""
    text = log_text(srv)
    assert "Traceback" not in text and not ERROR_LINE.search(text), text[-3000:]


# -- 1. nesting depth ----------------------------------------------------------------------------


def test_deep_nesting_over_websocket_is_an_invalid_message_and_the_session_goes_on(server: Any) -> None:
    deep_start = '{"type": "start", "seed": ' + "[" * 30000 + "]" * 30000 + "}"
    r = talk(server.ws, ["[" * 1000, deep_start, *say()])
    assert r.codes() == ["invalid_message", "invalid_message"], r.messages
    assert all("nested too deeply" in m["message"] for m in r.messages[:2])
    assert r.types()[2] == "ready" and r.types()[-1] == "done" and r.audio > 0 and r.close_code == 1000
    assert_healthy(server)
    assert_log_clean(server)


@pytest.mark.parametrize(
    "body",
    [
        "[" * 1000,
        '{"input": "Hello.", "x": ' + "[" * 30000 + "]" * 30000 + "}",
        '{"input": "Hello.", "sampling": ' + '{"a": ' * 5000 + "1" + "}" * 5000 + "}",
    ],
)
def test_deep_nesting_over_http_is_a_400_in_the_openai_shape(server: Any, body: str) -> None:
    r = httpx.post(server.http + "/v1/audio/speech", content=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_request" and err["type"] == "invalid_request_error" and err["message"]
    assert_healthy(server)
    assert_log_clean(server)


# -- 2. decompression bomb ----------------------------------------------------------------------


@pytest.mark.parametrize("known_length", [True, False], ids=["header-length", "no-length"])
def test_a_maximal_decompression_bomb_is_refused_without_decoding_it(server: Any, known_length: bool) -> None:
    bomb = flac_bomb(MAX_VOICE_BYTES, known_length)
    assert MAX_VOICE_BYTES - 300_000 < len(bomb) <= MAX_VOICE_BYTES
    info = sf.info(io.BytesIO(bomb))
    assert info.samplerate == 48000 and info.channels == 2
    # warm the upload path once (a small clip), so the measurement is the bomb's alone
    assert httpx.post(server.http + "/v1/voices", content=flac_bomb(300_000), timeout=60).status_code == 400

    def upload() -> httpx.Response:
        return httpx.post(server.http + "/v1/voices", content=bomb, timeout=120)

    idle, peak, r = peak_rss_during(server.proc.pid, upload)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_reference_audio" and "too long" in err["message"]
    if known_length:  # refused from the header: "1200.0 s by its FLAC/PCM_16 header"
        assert "by its FLAC/PCM_16 header" in err["message"], err
    print(f"\nbomb upload ({len(bomb) / 2**20:.1f} MiB, header length {known_length}): "
          f"server RSS idle {idle:.1f} MiB, peak {peak:.1f} MiB (+{peak - idle:.1f} MiB)")
    assert peak - idle < 50, f"RSS rose {peak - idle:.1f} MiB during the upload (idle {idle:.1f})"
    assert_healthy(server)
    assert_log_clean(server)


# -- 3. DNS rebinding ---------------------------------------------------------------------------


def test_dns_rebinding_a_foreign_host_is_refused(server: Any) -> None:
    evil = {"Host": f"evil.example:{server.port}", "Origin": f"http://evil.example:{server.port}"}
    r = httpx.get(server.http + "/v1/voices", headers=evil)
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden_host", r.text
    r = httpx.post(server.http + "/v1/voices", content=b"RIFF", headers=evil)
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden_host"
    r = httpx.post(server.http + "/v1/audio/speech", json={"input": SHORT}, headers=evil)
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden_host"
    assert httpx.get(server.http + "/", headers=evil).status_code == 403  # the page too
    ws = RawWs(server.port, evil)
    assert ws.status == 403 and json.loads(ws.response.body)["error"]["code"] == "forbidden_host"  # type: ignore[union-attr]
    ws.close()
    # the names a local server is reached by still work, with or without the page's origin
    for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}", "localhost", f"[::1]:{server.port}", f"app.localhost:{server.port}"):
        r = httpx.get(server.http + "/v1/voices", headers={"Host": host})
        assert r.status_code == 200, (host, r.text)
        ws = RawWs(server.port, {"Host": host})
        assert ws.status == 101, host
        ws.send_json({"type": "cancel"})
        assert ws.read_until_closed().types() == ["done"]
    assert server.metric('streamtts_errors_total{code="forbidden_host"}') >= 5
    assert_healthy(server)
    assert_log_clean(server)


def test_allowed_hosts_are_answered(capped: Any) -> None:
    r = httpx.get(capped.http + "/v1/voices", headers={"Host": f"app.example:{capped.port}", "Origin": f"http://app.example:{capped.port}"})
    assert r.status_code == 200, r.text
    assert httpx.get(capped.http + "/v1/voices", headers={"Host": "evil.example"}).status_code == 403


def test_host_allow_list_rules() -> None:
    hosts = HostAllowList(["App.Example", "other.example."], bind_host="myhost.lan")
    for ok in (None, "127.0.0.1", "127.0.0.1:80", "[::1]:8000", "[::1]", "10.1.2.3:9", "LOCALHOST:1",
               "localhost.", "a.localhost", "app.example:443", "other.example", "myhost.lan:8000"):
        assert hosts.allows(ok), ok
    for bad in ("evil.example", "evil.example:8000", "localhost.evil.example", "127.0.0.1.evil.example",
                "app.example.evil", "", ":80", "[::1", "[::1]x", "host:port", "evil.example:99999999"):
        assert not hosts.allows(bad), bad
    assert HostAllowList(["*"]).allows("anything.example")


# -- 4. one rule for every refused start ----------------------------------------------------------


@pytest.mark.parametrize(
    "bad,code",
    [
        ({"type": "start", "seed": "7", "format": "ulaw_8000"}, "invalid_message"),  # wrong type
        ({"type": "start", "format": "nope"}, "invalid_format"),  # bad value
    ],
)
def test_a_refused_start_leaves_the_session_waiting(server: Any, bad: dict[str, Any], code: str) -> None:
    text = {"type": "text", "text": SHORT, "flush": True}
    r = talk(server.ws, [bad, text, {"type": "start", "seed": 7, "format": "ulaw_8000"}, text, {"type": "end"}])
    assert r.codes() == [code, "not_started"], r.messages
    ready = next(m for m in r.messages if m["type"] == "ready")
    assert ready["format"] == "ulaw_8000"  # the corrected start's format, never the default
    assert r.types()[-1] == "done" and r.close_code == 1000 and r.audio > 0
    assert_healthy(server)


# -- 5. cancel before start --------------------------------------------------------------------------


def test_cancel_before_start_sends_done_then_closes(server: Any) -> None:
    r = talk(server.ws, [{"type": "cancel"}])
    assert r.types() == ["done"] and r.messages[0]["reason"] == "cancelled" and r.close_code == 1000
    assert_healthy(server)


# -- 6. silent sockets and the per-address cap -----------------------------------------------------


def test_silent_sockets_are_closed_after_the_first_message_timeout(server: Any) -> None:
    silent = [RawWs(server.port) for _ in range(4)]
    assert all(s.status == 101 for s in silent)
    assert server.health()["sessions"] == 4
    # right now they hold every slot: a fifth client is refused ...
    r = talk(server.ws, say())
    assert r.codes() == ["overloaded"] and r.close_code == 1013
    # ... but only until the first-message timeout closes them (not the 30 s idle timeout)
    for s in silent:
        r = s.read_until_closed(timeout=30)
        assert r.codes() == ["first_message_timeout"] and r.messages[0]["fatal"], r.messages
        assert str(FIRST_MESSAGE_S) in r.messages[0]["message"]
        assert r.close_code == 1008 and not s.reset
    server.wait_idle()
    assert_healthy(server)  # the fifth client gets its session
    assert server.metric('streamtts_errors_total{code="first_message_timeout"}') >= 4


def test_the_idle_timeout_during_a_session_is_separate(server: Any) -> None:
    ws = RawWs(server.port)
    ws.send_json({"type": "start", "seed": 3})
    time.sleep(FIRST_MESSAGE_S + 1.5)  # past the first-message timeout, far from the idle one
    ws.send_json({"type": "text", "text": SHORT})
    ws.send_json({"type": "end"})
    r = ws.read_until_closed()
    assert r.codes() == [] and r.types()[0] == "ready" and r.types()[-1] == "done" and r.audio > 0
    assert r.close_code == 1000
    server.wait_idle()


def test_sessions_per_client_address_are_capped(capped: Any) -> None:
    held = [RawWs(capped.port) for _ in range(2)]
    for ws in held:
        ws.send_json({"type": "start"})
    assert capped.health()["sessions"] == 2
    r = talk(capped.ws, say())
    assert r.codes() == ["too_many_sessions"] and r.messages[0]["fatal"] and r.close_code == 1013
    assert "2 sessions" in r.messages[0]["message"]
    r2 = httpx.post(capped.http + "/v1/audio/speech", json={"input": SHORT}, timeout=30)
    assert r2.status_code == 429 and r2.json()["error"]["code"] == "too_many_sessions"
    assert r2.headers["retry-after"] == "1"
    # another address (127.0.0.2 reaches loopback on Linux) is not affected
    other = RawWs(capped.port, source="127.0.0.2")
    for m in say():
        other.send_json(m)
    r = other.read_until_closed()
    assert r.codes() == [] and r.types()[-1] == "done" and r.audio > 0
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2")) as c:
        assert c.post(capped.http + "/v1/audio/speech", json={"input": SHORT, "response_format": "pcm"}, timeout=60).status_code == 200
    for ws in held:
        ws.send_json({"type": "cancel"})
        assert ws.read_until_closed().types()[-1] == "done"
    capped.wait_idle()
    assert_healthy(capped)


# -- 7. clean error closes and quiet logs ----------------------------------------------------------


def test_a_frame_over_the_hard_limit_closes_1009_cleanly_while_the_client_still_sends(server: Any) -> None:
    ws = RawWs(server.port)
    ws.send_json({"type": "start"})
    ws.send_frame(Frame(Opcode.TEXT, b'{"type": "text", "text": "' + b"y" * (3 << 20) + b'"}'))
    for _ in range(20):  # and it goes on sending
        ws.send_frame(Frame(Opcode.TEXT, b'{"type": "flush"}'))
    r = ws.read_until_closed()
    assert not ws.reset, "the server reset the connection"
    assert r.close_code == 1009, r
    assert_healthy(server)
    assert_log_clean(server)


def test_a_client_close_is_answered_though_a_frame_crosses_it(server: Any) -> None:
    """A client closes mid-stream, with audio it has not read still in the server's socket, and
    sends a pong after its close (it answers a ping that was on its way): the pong reaches the
    server after the server read the close. The client still reads all that was sent, then
    the answer to its close, not a reset that drops them (uvicorn's close: say, 1 run in 8)."""
    ws = RawWs(server.port, rcvbuf=4096)
    sent = server.metric("streamtts_audio_seconds_total")
    ws.send_json({"type": "start", "format": "pcm_f32le_24000"})
    ws.send_json({"type": "text", "text": LONG})
    # 1 s of audio is 96 kB: far more than the client's window, so most of it waits in the server
    wait_until(lambda: server.metric("streamtts_audio_seconds_total") - sent >= 1.0)
    ws.proto.send_close(1000)
    ws.flush()
    wait_until(lambda: server.health()["sessions"] == 0)  # the server has read the close
    ws.proto.send_pong(b"late")
    ws.flush()
    r = ws.read_until_closed()
    assert not ws.reset, "the server reset the connection"
    assert r.close_code == 1000 and r.audio >= 96_000, r
    assert_healthy(server)
    assert_log_clean(server)


def test_a_frame_over_the_hard_limit_closes_1009_for_a_websockets_client(server: Any) -> None:
    r = talk(server.ws, [{"type": "start"}, {"type": "text", "text": "y" * (2 << 20)}, {"type": "flush"}])
    assert r.close_code == 1009


def test_invalid_utf8_closes_1007_cleanly_without_a_traceback(server: Any) -> None:
    before = log_text(server).count("not UTF-8")
    ws = RawWs(server.port)
    ws.send_frame(Frame(Opcode.TEXT, b'{"type": "text", "text": "\xff\xfe"}'))
    ws.send_json({"type": "flush"})
    r = ws.read_until_closed()
    assert r.close_code == 1007 and not ws.reset
    assert_healthy(server)
    assert_log_clean(server)
    # at most one line (none once this minute's refusal budget is spent: see the flood test)
    assert log_text(server).count("not UTF-8") <= before + 1


def test_refusals_are_rate_limited_one_line_info(serve: Any) -> None:
    srv = serve(*BASE, "--max-sessions", "2", "--token", "s3cret", "--no-warmup")
    for i in range(80):  # no token, foreign Host, invalid UTF-8, not HTTP at all
        if i % 4 == 0:
            ws = RawWs(srv.port)
            assert ws.status == 401
            ws.close()
        elif i % 4 == 1:
            assert httpx.get(srv.http + "/v1/voices", headers={"Host": "evil.example"}).status_code == 403
        elif i % 4 == 2:
            ws = RawWs(srv.port, {"Authorization": "Bearer s3cret"})
            ws.send_frame(Frame(Opcode.TEXT, b"\xff"))
            assert ws.read_until_closed().close_code == 1007
        else:
            with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
                sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
                assert sock.recv(1024).startswith(b"HTTP/1.1 400")
    text = log_text(srv)
    refusals = [line for line in text.splitlines() if re.search("refused|closed WebSocket|Invalid HTTP", line)]
    # 10 lines a minute; the flood may straddle one window boundary
    assert 1 <= len(refusals) <= 20, refusals
    assert "Traceback" not in text and not ERROR_LINE.search(text) and "without completing handshake" not in text
    assert_healthy_with_token(srv)


def assert_healthy_with_token(srv: Any) -> None:
    assert srv.health()["status"] == "ok"
    r = talk(srv.ws + "?token=s3cret", say())
    assert r.types()[-1] == "done" and r.audio > 0


def test_rate_limited_log_counts_what_it_leaves_out(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    now = [0.0]
    rl = RateLimitedLog(logging.getLogger("test.refusals"), burst=3, interval_s=10, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="test.refusals"):
        for i in range(10):
            rl.log("refused %d", i)
        assert [r.getMessage() for r in caplog.records] == ["refused 0", "refused 1", "refused 2"]
        now[0] = 10.0
        rl.log("refused %d", 10)
    assert caplog.records[-1].getMessage() == "refused 10 (7 similar lines left out)"
    assert all(r.levelname == "INFO" and "\n" not in r.getMessage() for r in caplog.records)


@pytest.fixture(autouse=True)
def _no_sockets_left(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    for name in ("server", "capped"):
        if name in request.fixturenames:
            request.getfixturevalue(name).wait_idle(timeout=15)
