"""``streamtts serve`` end to end: a real server process on loopback, real clients.

The server runs the demo model. Audio is checked byte for byte against the same
text spoken in this process (same segments, seeds, joins and format
conversion). Where several streams run at once the comparison uses greedy
sampling (see GREEDY). Every scenario ends with the server idle: no engine
stream, no session left.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile as sf
import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus

from streamtts.audio.formats import StreamEncoder, get_format
from streamtts.config import SamplingParams
from streamtts.engine.segmented import SegmentAudio, speak_segments
from streamtts.request import StreamOptions
from streamtts.text.segmenter import split_text

MAX_NEW = 44
SERVER_ARGS = [
    "--max-streams", "10", "--max-sessions", "20", "--n-threads", "2",
    "--idle-timeout", "3", "--send-buffer", "1", "--send-stall", "2",
    "--max-message-bytes", "4096", "--max-text-chars", "1000", "--max-session-chars", "3000",
    # Short segments keep the suite quick on 2 cores: 44 steps = 13 frames (1 s) per segment.
    "--segment-max-new-tokens", str(MAX_NEW),
    # A small kernel send buffer: a client that stops reading is noticed after ~1 s of audio,
    # not after the MBs Linux would otherwise buffer on loopback.
    "--socket-send-buffer", "65536",
]  # fmt: skip

SHORT = "Hello there, this is a short test."
TWO = "Hello there, this is the first sentence. And here is the second one, right after it."
LONG = " ".join(f"This is sentence number {i}, which is spoken as its own segment." for i in range(12))


@pytest.fixture(scope="module")
def server(serve: Any) -> Any:
    return serve(*SERVER_ARGS)


@pytest.fixture(scope="module")
def local(demo_model_dir: Path) -> Iterator[Any]:
    """The same model in this process: what the server's bytes must equal."""
    from streamtts.engine.frontend import Engine

    # 20 slots: the 20 expected streams of the concurrency test never wait for one
    eng = Engine.from_config(demo_model_dir / "config.yaml", max_streams=20, n_threads=2)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(eng.start())
    yield eng, loop
    loop.run_until_complete(eng.aclose())
    loop.close()


@pytest.fixture(autouse=True)
def ends_idle(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every scenario: no slot, queue entry or session left on the server."""
    yield
    if "server" in request.fixturenames:
        request.getfixturevalue("server").wait_idle(timeout=10)


# Greedy sampling where several streams run at once: llama.cpp's numbers differ in the last bits
# with the batch's composition, which can flip a *sampled* code (rarely: a draw must land within
# that noise of a probability boundary) but not an argmax. Greedy keeps those comparisons exact.
GREEDY = {"text_temperature": 0.0, "audio_temperature": 0.0}


async def expected_async(eng: Any, text: str, seed: int, fmt: str = "pcm_s16le_24000", greedy: bool = False) -> bytes:
    enc = StreamEncoder(get_format(fmt))
    out = []
    sampling = SamplingParams.greedy() if greedy else None
    opts = StreamOptions(seed=seed, max_new_tokens=MAX_NEW, sampling=sampling)
    async for ev in speak_segments(eng, split_text(text), options=opts):
        if isinstance(ev, SegmentAudio):
            out.append(enc.encode(ev.pcm))
    return b"".join(out) + enc.flush()


def expected(local: Any, text: str, seed: int, fmt: str = "pcm_s16le_24000", greedy: bool = False) -> bytes:
    eng, loop = local
    return bytes(loop.run_until_complete(expected_async(eng, text, seed, fmt, greedy)))


def assert_same_audio(got: bytes, want: bytes, what: str = "audio") -> None:
    """The server's bytes equal what this process computed (said where they first differ)."""
    assert len(got) == len(want), f"{what}: {len(got)} bytes, expected {len(want)}"
    if got != want:
        first = next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
        raise AssertionError(f"{what}: bytes differ from byte {first} of {len(want)}")


@dataclass
class Result:
    ready: dict[str, Any] | None = None
    audio: bytes = b""
    chunks: int = 0
    segments: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    done: dict[str, Any] | None = None
    close_code: int | None = None
    close_reason: str = ""
    t_first_audio: float | None = None
    order: list[str] = field(default_factory=list)


async def talk(url: str, msgs: list[Any], *, timeout: float = 90.0, connect: dict[str, Any] | None = None) -> Result:
    """Send ``msgs`` (dicts as JSON, str/bytes as they are), then read until the server closes."""
    r = Result()
    t0 = time.monotonic()
    async with websockets.connect(url, max_size=None, compression=None, **(connect or {})) as ws:
        try:  # the server may close before everything is sent (a refused session)
            for m in msgs:
                await ws.send(m if isinstance(m, (str, bytes)) else json.dumps(m))
        except ConnectionClosed:
            pass
        try:
            async with asyncio.timeout(timeout):
                async for frame in ws:
                    collect(r, frame, t0)
        except ConnectionClosed:
            pass
        r.close_code = ws.close_code
        r.close_reason = ws.close_reason or ""
    return r


def collect(r: Result, frame: str | bytes, t0: float) -> None:
    if isinstance(frame, bytes):
        r.audio += frame
        r.chunks += 1
        if r.t_first_audio is None:
            r.t_first_audio = time.monotonic() - t0
        r.order.append("audio")
        return
    msg = json.loads(frame)
    r.order.append(msg["type"])
    if msg["type"] == "ready":
        r.ready = msg
    elif msg["type"] == "segment":
        r.segments.append(msg)
    elif msg["type"] == "done":
        r.done = msg
    elif msg["type"] == "error":
        r.errors.append(msg)


def say(text: str, seed: int = 1, greedy: bool = False, **start: Any) -> list[Any]:
    if greedy:
        start["sampling"] = GREEDY
    return [{"type": "start", "seed": seed, **start}, {"type": "text", "text": text}, {"type": "end"}]


# -- the protocol, happy path ---------------------------------------------------------------------


def test_stream_whole_text(server: Any, local: Any) -> None:
    r = asyncio.run(talk(server.ws, say(TWO, seed=5, greedy=True)))
    assert r.errors == [] and r.close_code == 1000
    assert r.ready is not None and r.ready["format"] == "pcm_s16le_24000" and r.ready["sample_rate"] == 24000
    assert [s["text"] for s in r.segments] == split_text(TWO) and len(r.segments) == 2
    # segments tile the audio: frame ranges back to back, seconds = frames x 80 ms
    assert r.segments[0]["start_frame"] == 0
    assert r.segments[1]["start_frame"] == r.segments[0]["end_frame"]
    frames = r.segments[-1]["end_frame"]
    assert r.segments[1]["end_s"] == pytest.approx(frames * 0.08)
    assert r.done is not None and r.done["reason"] == "end" and r.done["frames"] == frames
    assert r.done["segments"] == 2 and r.done["ttfa_ms"] > 0 and r.done["rtf"] > 0
    assert len(r.audio) == frames * 1920 * 2
    assert_same_audio(r.audio, expected(local, TWO, seed=5, greedy=True))
    # each segment's message follows its audio; done is last
    assert r.order[0] == "ready" and r.order[-1] == "done"
    assert r.order.index("segment") > r.order.index("audio")


def test_text_streamed_token_by_token_gives_the_same_segments_and_audio(server: Any) -> None:
    whole = asyncio.run(talk(server.ws, say(TWO, seed=9, greedy=True)))
    words = [w + " " for w in TWO.split(" ")]
    words[-1] = words[-1].rstrip()
    tokens = [{"type": "text", "text": w} for w in words]
    start = {"type": "start", "seed": 9, "sampling": GREEDY}
    streamed = asyncio.run(talk(server.ws, [start, *tokens, {"type": "end"}]))
    assert [s["text"] for s in streamed.segments] == [s["text"] for s in whole.segments]
    assert len(whole.audio) > 0
    assert_same_audio(streamed.audio, whole.audio)


def test_flush_speaks_pending_text_before_end(server: Any) -> None:
    async def scenario() -> Result:
        r = Result()
        t0 = time.monotonic()
        async with websockets.connect(server.ws) as ws:
            await ws.send(json.dumps({"type": "text", "text": "Half a thought"}))
            await ws.send(json.dumps({"type": "flush"}))
            while not r.segments:  # the flushed segment is spoken before any end
                collect(r, await asyncio.wait_for(ws.recv(), 30), t0)
            await ws.send(json.dumps({"type": "text", "text": "and the rest of it."}))
            await ws.send(json.dumps({"type": "end"}))
            async for frame in ws:
                collect(r, frame, t0)
            r.close_code = ws.close_code
        return r

    r = asyncio.run(scenario())
    assert [s["text"] for s in r.segments] == ["Half a thought", "and the rest of it."]
    assert r.done is not None and r.close_code == 1000


@pytest.mark.parametrize(
    "fmt,rate,width", [("pcm_f32le_24000", 24000, 4), ("pcm_s16le_16000", 16000, 2), ("pcm_s16le_8000", 8000, 2), ("ulaw_8000", 8000, 1)]
)
def test_audio_formats(server: Any, local: Any, fmt: str, rate: int, width: int) -> None:
    r = asyncio.run(talk(server.ws, say(SHORT, seed=2, format=fmt)))
    assert r.ready is not None and r.ready["format"] == fmt and r.ready["sample_rate"] == rate
    assert r.done is not None
    assert len(r.audio) == r.done["frames"] * 1920 * rate // 24000 * width
    assert_same_audio(r.audio, expected(local, SHORT, seed=2, fmt=fmt))


# -- HTTP: OpenAI-compatible speech, health, metrics, voices --------------------------------------


def test_openai_speech_streams_wav(server: Any, local: Any) -> None:
    body = {"model": "tts-1", "input": LONG, "voice": "alloy", "response_format": "wav", "seed": 5, "sampling": GREEDY}
    chunks = []
    with httpx.stream("POST", server.http + "/v1/audio/speech", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"] == "audio/wav"
        body_iter = resp.iter_bytes()
        # Streamed as generated, not at the end: before the body is over, the engine is seen
        # working on this request. A server that sent the body only after generating it all
        # would be idle all along. (No wall-clock ratio: CI timing is noisy.)
        chunks += read_until_generating(server, body_iter)
        chunks.extend(body_iter)
    data = b"".join(chunks)
    assert len(chunks) > 4
    pcm = expected(local, LONG, seed=5, greedy=True)
    assert_same_audio(data[44:], pcm)  # same audio as the WebSocket and in-process
    x, sr = sf.read(io.BytesIO(data), dtype="int16")
    assert sr == 24000 and x.size == len(pcm) // 2


def test_openai_speech_pcm_and_sse(server: Any, local: Any) -> None:
    r = httpx.post(server.http + "/v1/audio/speech", json={"input": SHORT, "response_format": "pcm", "seed": 2}, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"] == "audio/pcm"
    want = expected(local, SHORT, seed=2)
    assert_same_audio(r.content, want)
    body = {"input": SHORT, "response_format": "pcm", "stream_format": "sse", "seed": 2}
    r = httpx.post(server.http + "/v1/audio/speech", json=body, timeout=60)
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    assert_same_audio(audio, want)
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["output_tokens"] > 0


@pytest.mark.parametrize(
    "body,status,code",
    [
        ({"input": "hi", "response_format": "ogg"}, 400, "invalid_format"),
        ({"input": "hi", "speed": 5.0}, 400, "invalid_option"),
        ({"input": "hi", "voice": "v_nope"}, 400, "unknown_voice"),
        ({"input": "..."}, 400, "invalid_text"),
        ({"model": "tts-1"}, 400, "invalid_request"),
        ({"input": 5}, 400, "invalid_request"),
    ],
)
def test_openai_speech_errors(server: Any, body: dict[str, Any], status: int, code: str) -> None:
    r = httpx.post(server.http + "/v1/audio/speech", json=body, timeout=30)
    assert r.status_code == status
    err = r.json()["error"]
    assert err["code"] == code and err["message"]


def test_healthz_and_metrics(server: Any) -> None:
    asyncio.run(talk(server.ws, ["{oops", *say(SHORT)]))
    h = server.health()
    assert h["status"] == "ok" and h["max_sessions"] == 20 and h["max_streams"] == 10
    text = server.metrics()
    for name in (
        "streamtts_active_streams 0",
        "streamtts_queued_streams 0",
        "# TYPE streamtts_prefix_cache_hits gauge",
        "streamtts_sessions 0",
        "# TYPE streamtts_ttfa_seconds histogram",
        "# TYPE streamtts_rtf histogram",
        'streamtts_ttfa_seconds_bucket{le="+Inf"}',
        'streamtts_errors_total{code="invalid_json"}',
        'streamtts_sessions_total{kind="ws"}',
    ):
        assert name in text, name
    assert server.metric("streamtts_ttfa_seconds_count") >= 1


def voice_clip(seconds: float = 2.0, hz: float = 220.0) -> bytes:
    t = np.arange(int(24000 * seconds)) / 24000
    x = (0.3 * np.sin(2 * np.pi * hz * t) * (1 + 0.3 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, x, 24000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def test_voice_upload_and_use(server: Any) -> None:
    clip = voice_clip()
    r1 = httpx.post(server.http + "/v1/voices?name=tone", content=clip, timeout=60)
    assert r1.status_code == 201, r1.text
    v = r1.json()
    assert v["voice_id"].startswith("v_") and v["frames"] == 25 and v["name"] == "tone" and not v["cached"]
    r2 = httpx.post(server.http + "/v1/voices", content=clip, timeout=60)
    assert r2.status_code == 200 and r2.json()["voice_id"] == v["voice_id"] and r2.json()["cached"]
    listed = httpx.get(server.http + "/v1/voices").json()["voices"]
    assert {"voice_id": v["voice_id"], "name": "tone", "seconds": v["seconds"], "frames": v["frames"], "n_vq": 32} in listed
    hits, misses = server.metric("streamtts_prefix_cache_hits"), server.metric("streamtts_prefix_cache_misses")
    r = asyncio.run(talk(server.ws, say(SHORT, voice=v["voice_id"])))
    assert r.ready is not None and r.ready["voice"] == v["voice_id"] and r.done is not None
    assert server.metric("streamtts_prefix_cache_misses") == misses + 1  # voice + template computed once
    # the same voice over HTTP: its prompt prefix (template + voice block) is loaded, not recomputed
    h = httpx.post(server.http + "/v1/audio/speech", json={"input": SHORT, "voice": v["voice_id"], "response_format": "pcm"}, timeout=60)
    assert h.status_code == 200 and len(h.content) > 0
    assert server.metric("streamtts_prefix_cache_hits") == hits + 1
    assert server.metric("streamtts_prefix_cache_bytes") > 0
    assert httpx.request("DELETE", server.http + f"/v1/voices/{v['voice_id']}").status_code == 200
    r = asyncio.run(talk(server.ws, [{"type": "start", "voice": v["voice_id"]}, {"type": "cancel"}]))
    assert r.errors[0]["code"] == "unknown_voice"


def test_voice_upload_errors(server: Any) -> None:
    r = httpx.post(server.http + "/v1/voices", content=b"this is not audio", timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_reference_audio"
    r = httpx.post(server.http + "/v1/voices", content=b"", timeout=30)
    assert r.status_code == 400


# -- bad input: one test each ---------------------------------------------------------------------


def bad_then_good(server: Any, bad: Any) -> Result:
    """Send one bad message, then a good session's worth: the error comes, the session goes on."""
    r = asyncio.run(talk(server.ws, [bad, *say(SHORT)]))
    assert r.done is not None and r.done["reason"] == "end" and r.close_code == 1000, r
    assert len(r.audio) > 0
    return r


def test_bad_invalid_json(server: Any) -> None:
    r = bad_then_good(server, '{"type": "text", "text": ')
    assert [e["code"] for e in r.errors] == ["invalid_json"]


def test_bad_unknown_type(server: Any) -> None:
    r = bad_then_good(server, {"type": "speak", "text": "hi"})
    assert [e["code"] for e in r.errors] == ["unknown_type"] and "speak" in r.errors[0]["message"]


def test_bad_wrong_field_types(server: Any) -> None:
    r = bad_then_good(server, {"type": "text", "text": ["not", "a", "string"]})
    assert [e["code"] for e in r.errors] == ["invalid_message"] and "text" in r.errors[0]["message"]


def test_bad_binary_from_client(server: Any) -> None:
    r = bad_then_good(server, b"\x00\x01\x02")
    assert [e["code"] for e in r.errors] == ["binary_not_supported"]


def test_bad_text_after_end(server: Any) -> None:
    msgs = [*say(SHORT), {"type": "text", "text": "too late"}]
    r = asyncio.run(talk(server.ws, msgs))
    assert [e["code"] for e in r.errors] == ["text_after_end"]
    assert r.done is not None and [s["text"] for s in r.segments] == [SHORT]


def test_bad_oversize_message(server: Any) -> None:
    # over max_message_bytes (4096): an error, the session goes on
    r = bad_then_good(server, {"type": "text", "text": "x" * 5000})
    assert [e["code"] for e in r.errors] == ["message_too_large"]
    # over the hard limit (1 MiB): the websockets library closes with 1009
    r = asyncio.run(talk(server.ws, [{"type": "text", "text": "y" * (1 << 21)}]))
    assert r.close_code == 1009


def test_bad_text_too_long_and_session_limit(server: Any) -> None:
    r = bad_then_good(server, {"type": "text", "text": "z " * 600})  # 1200 chars > 1000 per message
    assert [e["code"] for e in r.errors] == ["text_too_long"]
    msgs = [{"type": "start", "max_new_tokens": 40}] + [{"type": "text", "text": "w" * 900}] * 4 + [{"type": "cancel"}]
    r = asyncio.run(talk(server.ws, msgs))
    assert [e["code"] for e in r.errors] == ["session_text_limit"]  # 3 x 900 fit in 3000, the 4th not
    assert r.close_code == 1000


def test_bad_start_then_retry(server: Any) -> None:
    r = bad_then_good(server, {"type": "start", "format": "mp3"})
    assert [e["code"] for e in r.errors] == ["invalid_format"]


@pytest.mark.parametrize(
    "sampling,field",
    [({"audio_temperature": -1}, "audio_temperature"), ({"audio_top_p": 1.5}, "audio_top_p")],
)
def test_bad_sampling_in_start_names_the_field(server: Any, sampling: dict[str, Any], field: str) -> None:
    r = bad_then_good(server, {"type": "start", "sampling": sampling})
    assert [e["code"] for e in r.errors] == ["invalid_option"]
    assert r.errors[0]["message"].startswith(f"sampling.{field} must be"), r.errors


def test_idle_session_is_closed(server: Any) -> None:
    t0 = time.monotonic()
    r = asyncio.run(talk(server.ws, [{"type": "start"}], timeout=20))
    assert [e["code"] for e in r.errors] == ["idle_timeout"] and r.errors[0]["fatal"]
    assert r.close_code == 1008 and 2.5 < time.monotonic() - t0 < 10


def test_an_idle_timeout_shorter_than_the_first_message_timeout_applies(server: Any) -> None:
    """`--idle-timeout 3` below the default 5 s first-message timeout: a client silent from
    its handshake is closed by the idle timeout, which names its own 3 s."""
    r = asyncio.run(talk(server.ws, [], timeout=20))
    assert [e["code"] for e in r.errors] == ["idle_timeout"] and r.errors[0]["fatal"], r.errors
    assert "no message for 3 s" in r.errors[0]["message"]
    assert r.close_code == 1008 and r.close_reason == "idle_timeout"


def test_end_after_a_refused_start_ends_the_session(server: Any) -> None:
    """The client gives up on a refused `start`: `end` gets `done` and the close (1000), not
    `not_started` with the socket left open."""
    bad = {"type": "start", "format": "mp3"}
    r = asyncio.run(talk(server.ws, [bad, {"type": "text", "text": SHORT}, {"type": "end"}], timeout=20))
    assert [e["code"] for e in r.errors] == ["invalid_format", "not_started"], r.errors
    assert r.done is not None and r.done["reason"] == "end" and r.done["segments"] == 0
    assert r.close_code == 1000 and r.close_reason == "done" and not r.audio


def test_the_client_closing_after_a_refused_start_ends_the_session(server: Any) -> None:
    """The client closes the socket itself while the session waits for a corrected `start`:
    the server answers the close (1000, not a dropped connection) and frees the session."""

    async def go() -> tuple[int | None, list[str]]:
        async with websockets.connect(server.ws, close_timeout=5) as ws:
            await ws.send(json.dumps({"type": "start", "format": "mp3"}))
            err = json.loads(await ws.recv())
            await ws.close()
        return ws.close_code, [err["code"]]

    code, errors = asyncio.run(go())
    assert errors == ["invalid_format"] and code == 1000
    server.wait_idle(timeout=10)
    assert server.health()["sessions"] == 0


# -- cancel, disconnect, slow readers, overload ----------------------------------------------------


def wait_streams_free(server: Any, timeout: float) -> float:
    t0 = time.monotonic()
    while server.health()["active_streams"] or server.health()["queued_streams"]:
        assert time.monotonic() - t0 < timeout, server.health()
        time.sleep(0.01)
    return time.monotonic() - t0


def test_cancel_stops_generation_and_frees_the_slot(server: Any) -> None:
    async def scenario() -> Result:
        r = Result()
        async with websockets.connect(server.ws) as ws:
            for m in say(LONG):
                await ws.send(json.dumps(m))
            while not r.audio:
                collect(r, await asyncio.wait_for(ws.recv(), 30), 0)
            assert server.generating()
            await ws.send(json.dumps({"type": "cancel"}))
            async for frame in ws:
                collect(r, frame, 0)
            r.close_code = ws.close_code
        return r

    r = asyncio.run(scenario())
    assert r.done is not None and r.done["reason"] == "cancelled" and r.close_code == 1000
    assert r.done["frames"] < 12 * 13  # LONG is 12 segments x 13 frames
    assert wait_streams_free(server, 2.0) < 2.0
    assert asyncio.run(talk(server.ws, say(SHORT))).done is not None  # a new session works at once


def test_disconnect_frees_the_slot_at_once(server: Any) -> None:
    async def scenario() -> float:
        ws = await websockets.connect(server.ws)
        for m in say(LONG):
            await ws.send(json.dumps(m))
        while not isinstance(await asyncio.wait_for(ws.recv(), 30), bytes):
            pass
        assert server.generating()
        t0 = time.monotonic()
        ws.transport.abort()  # vanish without a close frame
        await asyncio.sleep(0)
        return t0

    t0 = asyncio.run(scenario())
    wait_streams_free(server, 2.0)
    freed = time.monotonic() - t0
    assert freed < 1.0, f"slot freed {freed:.3f} s after the disconnect"
    r = asyncio.run(talk(server.ws, say(SHORT)))
    assert r.done is not None


def read_until_generating(server: Any, body: Iterator[bytes]) -> list[bytes]:
    """Read a streamed response until the engine is seen generating; the chunks read.

    A segmented text runs at most ``lookahead`` segments ahead of what the client has read,
    so right after the first bytes a fast engine may be waiting for the client; reading on
    starts the next segment. Fails if the body ends first (nothing was generated while
    the response was open)."""
    chunks = []
    for chunk in body:
        chunks.append(chunk)
        if server.generating(polls=2):
            return chunks
    raise AssertionError("the response ended without the engine generating while it was open")


def stalled_client(port: int, msgs: list[Any]) -> socket.socket:
    """Open a session on a raw socket, send ``msgs``, and never read: a client that hung."""
    from websockets.client import ClientProtocol
    from websockets.protocol import State
    from websockets.uri import parse_uri

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.connect(("127.0.0.1", port))
    proto = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/v1/stream"))
    proto.send_request(proto.connect())
    sock.sendall(b"".join(proto.data_to_send()))
    while proto.state is State.CONNECTING:  # read the handshake response, byte by byte
        proto.receive_data(sock.recv(1))
    for m in msgs:
        proto.send_text(json.dumps(m).encode())
    sock.sendall(b"".join(proto.data_to_send()))
    return sock


def test_http_client_that_leaves_frees_the_slot(server: Any) -> None:
    with httpx.stream("POST", server.http + "/v1/audio/speech", json={"input": LONG, "response_format": "pcm"}, timeout=60) as resp:
        assert resp.status_code == 200
        read_until_generating(server, resp.iter_bytes())  # leave while a segment generates
        t0 = time.monotonic()
    # leaving the block closed the connection mid-stream
    wait_streams_free(server, 2.0)
    assert time.monotonic() - t0 < 2.0
    server.wait_idle()


def test_slow_reader_is_dropped_and_its_generation_cancelled(server: Any) -> None:
    before = server.metric("streamtts_slow_clients_dropped_total")
    sock = stalled_client(server.port, say(LONG, format="pcm_f32le_24000"))
    try:
        deadline = time.monotonic() + 60
        while server.metric("streamtts_slow_clients_dropped_total") == before:
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.1)
        wait_streams_free(server, 2.0)  # its generation was aborted with it
        server.wait_idle(5.0)  # and its session closed (the close frame may wait 1 s)
    finally:
        sock.close()
    assert asyncio.run(talk(server.ws, say(SHORT))).done is not None


def test_overload_is_refused_cleanly(server: Any) -> None:
    async def scenario() -> tuple[Result, int]:
        conns = []
        for _ in range(20):
            ws = await websockets.connect(server.ws)
            await ws.send(json.dumps({"type": "start"}))
            assert json.loads(await ws.recv())["type"] == "ready"
            conns.append(ws)
        assert server.health()["sessions"] == 20
        refused = await talk(server.ws, say(SHORT))
        status = (await asyncio.to_thread(httpx.post, server.http + "/v1/audio/speech", json={"input": SHORT})).status_code
        for ws in conns:
            await ws.close()
        return refused, status

    refused, status = asyncio.run(scenario())
    assert refused.close_code == 1013 and [e["code"] for e in refused.errors] == ["overloaded"]
    assert refused.errors[0]["fatal"] and refused.audio == b""
    assert status == 503
    server.wait_idle()
    assert asyncio.run(talk(server.ws, say(SHORT))).done is not None
    assert server.metric('streamtts_refused_total{kind="ws"}') >= 1


@pytest.mark.slow
def test_twenty_concurrent_sessions_all_complete_with_correct_audio(server: Any, local: Any) -> None:
    texts = [f"Session {i} says hello to you." for i in range(20)]

    async def all_sessions() -> list[Result]:
        sessions = (talk(server.ws, say(t, seed=100 + i, greedy=True)) for i, t in enumerate(texts))
        return list(await asyncio.gather(*sessions))

    results = asyncio.run(all_sessions())
    eng, loop = local

    async def all_expected() -> list[bytes]:
        return list(await asyncio.gather(*(expected_async(eng, t, 100 + i, greedy=True) for i, t in enumerate(texts))))

    want = loop.run_until_complete(all_expected())
    for i, r in enumerate(results):
        assert r.errors == [] and r.done is not None and r.close_code == 1000, (i, r.errors)
        assert_same_audio(r.audio, want[i], f"session {i}")


# -- access control ---------------------------------------------------------------------------------


def test_token_and_origins(serve: Any) -> None:
    srv = serve("--token", "s3cret", "--allowed-origin", "https://app.example", "--max-streams", "2", "--no-warmup")
    url = srv.ws
    with pytest.raises(InvalidStatus) as exc:
        asyncio.run(talk(url, say(SHORT)))
    assert exc.value.response.status_code == 401
    ok = asyncio.run(talk(url, say(SHORT), connect={"additional_headers": {"Authorization": "Bearer s3cret"}}))
    assert ok.done is not None
    ok = asyncio.run(talk(url + "?token=s3cret", say(SHORT)))  # browsers: token in the query
    assert ok.done is not None
    with pytest.raises(InvalidStatus) as exc:
        asyncio.run(talk(url + "?token=s3cret", say(SHORT), connect={"origin": "https://evil.example"}))
    assert exc.value.response.status_code == 403
    ok = asyncio.run(talk(url + "?token=s3cret", say(SHORT), connect={"origin": "https://app.example"}))
    assert ok.done is not None
    same = f"http://127.0.0.1:{srv.port}"  # the page's own origin is always allowed
    assert asyncio.run(talk(url + "?token=s3cret", say(SHORT), connect={"origin": same})).done is not None
    r = httpx.post(srv.http + "/v1/audio/speech", json={"input": SHORT})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    r = httpx.post(srv.http + "/v1/audio/speech", json={"input": SHORT, "response_format": "pcm"}, headers={"Authorization": "Bearer s3cret"}, timeout=60)
    assert r.status_code == 200 and len(r.content) > 0
    evil = {"Authorization": "Bearer s3cret", "Origin": "https://evil.example"}
    r = httpx.post(srv.http + "/v1/audio/speech", json={"input": SHORT}, headers=evil)
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden_origin"
    assert httpx.get(srv.http + "/healthz").status_code == 200  # health and the page stay open
    assert httpx.get(srv.http + "/").status_code == 200
    srv.wait_idle()
