"""Drain: the session's part (sans-I/O), the coordinator with stand-in sessions, and a real
``streamtts serve`` whose drain time runs out (streams cut, metrics, exit 0).

The cluster scenarios (SIGTERM behind HAProxy) are in deploy/test_deploy_cluster.py.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import httpx
import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from streamtts.config import EngineConfig
from streamtts.errors import VoiceStoreUnavailableError
from streamtts.server.app_state import ServerSettings, ServerState
from streamtts.server.drain import EXIT_GRACE_S, FLUSH_GRACE_S, Drain
from streamtts.server.models import ModelSet
from streamtts.server.pacing import PING_EXTENSION, Listener
from streamtts.server.protocol import CloseCode, ErrorCode
from streamtts.server.session import Abort, Close, SendText, Session, SessionSettings
from streamtts.server.voices import VoiceStore
from streamtts.server.ws import WsConnection

# -- the session (sans-I/O) -------------------------------------------------------------------


def send(s: Session, obj: dict[str, Any]) -> list[Any]:
    s.receive_text(json.dumps(obj))
    return s.actions()


def errors(actions: list[Any]) -> list[dict[str, Any]]:
    out = [json.loads(a.data) for a in actions if isinstance(a, SendText)]
    return [m for m in out if m["type"] == "error"]


def test_a_session_is_quiet_only_with_nothing_outstanding() -> None:
    s = Session(SessionSettings())
    assert s.quiet  # connected, nothing asked
    send(s, {"type": "start"})
    assert s.quiet
    send(s, {"type": "text", "text": "Half a sente"})
    assert not s.quiet  # partial text waits for more
    send(s, {"type": "flush"})
    assert not s.quiet  # a segment is generating
    s.segment_done(0, "Half a sente", 0, 10, None)
    assert s.quiet  # replied: between two replies
    send(s, {"type": "end"})
    assert not s.quiet  # ended: it finishes by itself


def test_draining_closes_a_quiet_session_with_1001() -> None:
    s = Session(SessionSettings())
    send(s, {"type": "start"})
    s.draining()
    acts = s.actions()
    assert isinstance(acts[0], Abort)
    [err] = errors(acts)
    assert err["code"] == ErrorCode.SERVER_DRAINING and err["fatal"]
    assert isinstance(acts[-1], Close) and acts[-1].code == CloseCode.GOING_AWAY and not acts[-1].immediate
    assert s.closed
    s.shutdown(5)
    assert s.actions() == []  # already closed: nothing more


def test_shutdown_cuts_a_busy_session_with_1001() -> None:
    s = Session(SessionSettings())
    send(s, {"type": "text", "text": "Speak this now.", "flush": True})
    s.shutdown(7.5)
    acts = s.actions()
    [err] = errors(acts)
    assert err["code"] == ErrorCode.SERVER_SHUTDOWN and "7.5 s" in err["message"]
    assert isinstance(acts[0], Abort) and acts[-1].code == 1001


def test_an_unreachable_voice_store_refuses_the_start_with_its_own_code() -> None:
    def lookup(vid: str) -> Any:
        raise VoiceStoreUnavailableError("the voice store (redis://x) is unreachable")

    s = Session(SessionSettings(), voices=lookup)
    acts = send(s, {"type": "start", "voice": "v_" + "1" * 24})
    [err] = errors(acts)
    assert err["code"] == ErrorCode.VOICE_STORE_UNAVAILABLE and not err["fatal"]
    assert s.state == "idle"  # as for an unknown voice: send a corrected start


# -- the coordinator ---------------------------------------------------------------------------


class FakeEngine:
    active_streams = 0
    queued_streams = 0
    info: dict[str, Any] = {}
    config = EngineConfig()


class Stand:
    """A stand-in session: quiet or busy; records what the drain did to it."""

    kind = "ws"

    def __init__(self, drain: Drain, quiet: bool) -> None:
        self.drain, self.quiet, self.did = drain, quiet, ""

    def leave(self) -> None:
        self.did = "left"
        self.quiet = False
        asyncio.get_running_loop().call_later(0.05, self.drain.discard, self)

    def cut(self, timeout_s: float) -> None:
        self.did = f"cut after {timeout_s:g}"
        asyncio.get_running_loop().call_later(0.05, self.drain.discard, self)


async def _encode(data: bytes) -> Any:  # pragma: no cover - no upload here
    raise AssertionError


def test_drain_closes_quiet_sessions_waits_for_busy_ones_and_cuts_at_the_timeout() -> None:
    async def run() -> tuple[Any, ...]:
        state = ServerState(ModelSet.of_engine(FakeEngine()), ServerSettings(drain_timeout_s=0.6), VoiceStore(_encode))
        drain = state.drain
        finished: list[float] = []
        drain.on_finished = lambda: finished.append(time.monotonic())
        idle, busy, ends = Stand(drain, True), Stand(drain, False), Stand(drain, False)
        for s in (idle, busy, ends):
            drain.add(s)
        t0 = time.monotonic()
        assert drain.start("test") and not drain.start("again")
        asyncio.get_running_loop().call_later(0.2, drain.discard, ends)  # finishes by itself
        await asyncio.wait_for(drain.finished.wait(), 5)
        return state, idle, busy, ends, finished[0] - t0, drain.flush_grace_s()

    state, idle, busy, ends, took, grace = asyncio.run(run())
    assert (idle.did, busy.did, ends.did) == ("left", "cut after 0.6", "")
    assert grace == EXIT_GRACE_S  # a stream was cut: nothing more to wait for
    assert 0.6 <= took < 2.0
    text = state.metrics.render()
    assert "streamtts_draining 1" in text
    assert 'streamtts_drain_sessions_closed_total{kind="ws"} 1' in text
    assert 'streamtts_drain_streams_cut_total{kind="ws"} 1' in text


def test_a_drain_with_nothing_live_finishes_at_once() -> None:
    async def run(timeout_s: float) -> tuple[float, int]:
        state = ServerState(ModelSet.of_engine(FakeEngine()), ServerSettings(drain_timeout_s=timeout_s), VoiceStore(_encode))
        t0 = time.monotonic()
        state.drain.start("test")
        await asyncio.wait_for(state.drain.finished.wait(), 5)
        return time.monotonic() - t0, state.drain.flush_grace_s()

    took, grace = asyncio.run(run(30))
    assert took < 1.0
    # every stream ended by itself: connections may take what is left of the drain timeout to
    # close (a client reading its last audio at real-time pace), at least FLUSH_GRACE_S
    assert FLUSH_GRACE_S <= grace <= 30
    assert asyncio.run(run(2))[1] == FLUSH_GRACE_S


# -- the WebSocket sender: a cut is not held behind paced audio ---------------------------------


class RecordingWs:
    """The parts of a Starlette WebSocket the sender uses; what it sends is recorded."""

    client = None
    headers: dict[str, str] = {}
    query_params: dict[str, str] = {}

    def __init__(self) -> None:
        # acknowledgement pings that never come back: a listener that has read nothing yet
        self.scope = {"extensions": {PING_EXTENSION: lambda: asyncio.get_running_loop().create_future()}}
        self.sent: list[Any] = []

    async def send_bytes(self, data: bytes) -> None:
        self.sent.append(data)

    async def send_text(self, data: str) -> None:
        self.sent.append(json.loads(data)["code"])

    async def close(self, code: int, reason: str = "") -> None:
        self.sent.append(code)


def test_a_cut_goes_out_at_once_while_audio_waits_for_the_listener() -> None:
    async def run() -> list[Any]:
        settings = ServerSettings(send_lead_s=1.0)
        state = ServerState(ModelSet.of_engine(FakeEngine()), settings, VoiceStore(_encode))
        ws = RecordingWs()
        conn = WsConnection(ws, state)  # type: ignore[arg-type]
        # a listener whose clock stands still: the audio beyond the lead waits until acked
        conn.listener = Listener(1.0, acks=True, clock=lambda: 100.0)
        for chunk in (b"a", b"b", b"c"):
            conn.outbox.put(chunk, 1.0)
        sender = asyncio.create_task(conn._send_loop())
        while len(ws.sent) < 2:
            await asyncio.sleep(0.01)
        conn.session.shutdown(2)  # the drain's cut: abort, error, close 1001
        await conn._apply(conn.session.actions())
        await asyncio.wait_for(sender, 5)  # the sender returns after the close
        return ws.sent

    # "c" was paced (2 s sent, none consumed, lead 1 s); the cut dropped it, not waited for it
    assert asyncio.run(run()) == [b"a", b"b", ErrorCode.SERVER_SHUTDOWN, CloseCode.GOING_AWAY]


# -- a real server whose drain time runs out ---------------------------------------------------

TOKEN = "drain-secret"
# about 40 s of speech: at 4-8x real time every listener is still taking audio when the cut comes
LONG = " ".join(f"This is sentence number {i}, spoken as its own segment." for i in range(40))


@pytest.fixture(scope="module")
def server(serve: Any) -> Any:
    return serve(
        "--n-threads", "1", "--max-streams", "6", "--max-sessions", "4", "--token", TOKEN,
        "--segment-max-new-tokens", "44", "--send-buffer", "1", "--send-stall", "30",
        "--drain-timeout", "2", "--send-lead", "1",
        # small kernel buffers: generation waits for the listener, so streams are still running
        "--socket-send-buffer", "16384",
    )  # fmt: skip


def small_buffer_socket(port: int, rcvbuf: int) -> socket.socket:
    """A connected socket with a small receive buffer: audio the client has not played stays
    on the server (the kernel would otherwise take in megabytes on loopback)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", port))
    return s


def speech_at_real_time(port: int, body: dict[str, Any]) -> tuple[bytes, bool]:
    """POST a speech request on a raw socket read at about 4x real time: (the body, whether
    its chunked encoding was complete). 4096 bytes every 10 ms (~400 KB/s) for SSE (base64 in
    JSON events), every 20 ms (~200 KB/s) for raw 24 kHz s16le audio."""
    pause = 0.01 if body.get("stream_format") == "sse" else 0.02
    data = json.dumps(body).encode()
    s = small_buffer_socket(port, 8192)
    s.sendall(
        f"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
        + data
    )
    raw = b""
    while chunk := s.recv(4096):
        raw += chunk
        time.sleep(pause)
    s.close()
    rest = raw.partition(b"\r\n\r\n")[2]
    text = b""
    while rest:  # chunked transfer encoding
        size, _, rest = rest.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            return text, True
        text, rest = text + rest[:n], rest[n + 2 :]
    return text, False


def test_admin_drain_cuts_what_is_still_running_at_the_timeout_and_exits_0(server: Any) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}

    async def ws_session(out: dict[str, Any]) -> None:
        out.update(errors=[], audio=0, close=None)
        sock = small_buffer_socket(server.port, 16384)
        async with websockets.connect(
            server.ws, sock=sock, additional_headers=auth, max_size=None, max_queue=1
        ) as ws:
            await ws.send(json.dumps({"type": "start", "seed": 1}))
            await ws.send(json.dumps({"type": "text", "text": LONG}))
            await ws.send(json.dumps({"type": "end"}))
            try:
                async for frame in ws:
                    if isinstance(frame, bytes):
                        out["audio"] += len(frame)
                        # a listener taking audio at 8x real time: what the server wrote
                        # ahead of it (--send-lead 1: about 1.6 s of audio with the chunk in
                        # flight) takes 0.2 s, so the cut's error and close reach it well within
                        # the server's close grace (drain.CLOSE_GRACE_S, 0.75 s; with the 4 s
                        # default lead a loaded machine missed it)
                        await asyncio.sleep(len(frame) / 384000)
                    elif json.loads(frame)["type"] == "error":
                        out["errors"].append(json.loads(frame))
            except ConnectionClosed:
                pass
            out["close"] = ws.close_code

    async def run() -> tuple[dict[str, Any], Any, Any, list[int], float, str]:
        ws_out: dict[str, Any] = {}
        sse = {"input": LONG, "stream_format": "sse", "response_format": "pcm", "seed": 1}
        raw = {"input": LONG, "response_format": "pcm", "seed": 1}
        tasks = [
            asyncio.create_task(ws_session(ws_out)),
            asyncio.create_task(asyncio.to_thread(speech_at_real_time, server.port, sse)),
            asyncio.create_task(asyncio.to_thread(speech_at_real_time, server.port, raw)),
        ]
        async with httpx.AsyncClient(timeout=10) as client:
            while (await client.get(server.http + "/healthz")).json()["sessions"] < 3:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            codes = [(await client.post(server.http + "/admin/drain")).status_code]  # no token
            t0 = time.monotonic()
            r = await client.post(server.http + "/admin/drain", headers=auth)
            codes.append(r.status_code)
            assert r.json()["draining"] and r.json()["timeout_s"] == 2
            metrics = (await client.get(server.http + "/metrics")).text
            codes.append((await client.get(server.http + "/readyz")).status_code)
            codes.append((await client.get(server.http + "/healthz")).status_code)
        _, sse_out, raw_out = await asyncio.wait_for(asyncio.gather(*tasks), 30)
        while server.proc.poll() is None:
            await asyncio.sleep(0.05)
        return ws_out, sse_out, raw_out, codes, time.monotonic() - t0, metrics

    ws_out, (sse_body, sse_complete), (raw_body, raw_complete), codes, exit_after, metrics = asyncio.run(run())
    events = [json.loads(ln[6:]) for ln in sse_body.decode().splitlines() if ln.startswith("data: ")]
    assert codes == [401, 202, 503, 200]  # token needed; draining: not ready, still alive
    assert "streamtts_draining 1" in metrics
    assert ws_out["audio"] > 0 and ws_out["close"] == 1001
    assert [e["code"] for e in ws_out["errors"]] == ["server_shutdown"]
    kinds = [e["type"] for e in events]
    assert "speech.audio.delta" in kinds and kinds[-1] == "error" and "speech.audio.done" not in kinds
    assert events[-1]["error"]["code"] == "server_shutdown" and sse_complete
    # raw audio has no room for a message: the body is left incomplete (no final chunk)
    assert len(raw_body) > 0 and not raw_complete
    assert server.proc.returncode == 0 and exit_after <= 2 + 2
    log = " ".join(server.log_path.read_text().split())  # the log handler wraps lines
    assert "0 quiet session(s) closed, 3 stream(s) cut at the 2 s timeout" in log
