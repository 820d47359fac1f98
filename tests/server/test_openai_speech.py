"""``POST /v1/audio/speech`` through the ``openai`` Python SDK itself, against a real server.

Every ``response_format`` is streamed (FLAC: sent whole at the end) and decoded back by two
kept decoders, FFmpeg through PyAV and libsndfile through soundfile (where libsndfile reads
the format: all but AAC), to the right sample rate and duration (±1 frame of 80 ms: the
lossless ones to the very samples of ``pcm``); SSE events parse; ``speed`` stretches by a
kept filter; ``instructions`` reach the prompt; voice names come from the config's
``voices:`` table; each bad input is a 400 with its own code.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
import yaml

from streamtts.client import StreamClient

MAX_NEW = 44
GREEDY = {"text_temperature": 0.0, "audio_temperature": 0.0}
# four segments: the first audio goes out while the last two have not started
TEXT = " ".join(f"Here is sentence number {i}, spoken as its own segment." for i in range(4))
FRAME = 1920  # samples of one 80 ms frame at 24 kHz
AAC_PRIMING = 1024  # AAC's encoder priming: ADTS cannot tell a decoder to skip it
# what libsndfile decodes of ours (the soundfile wheel's has MP3 and Ogg Opus; none has AAC)
SNDFILE_READS = {"wav", "flac"} | ({"mp3"} & {f.lower() for f in sf.available_formats()}) | (
    {"opus"} if "OGG" in sf.available_formats() else set()
)


@pytest.fixture(scope="module")
def voices_config(demo_model_dir: Path, voice_wav: Path) -> Path:
    """The demo model's config with a `voices:` table: alloy = a clip, echo = the model's own."""
    cfg = yaml.safe_load((demo_model_dir / "config.yaml").read_text())
    cfg["voices"] = {"alloy": str(voice_wav), "echo": None}
    path = demo_model_dir / "config-voices.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def server(serve: Any, voices_config: Path) -> Any:
    return serve("--config", str(voices_config), "--max-streams", "4", "--n-threads", "2",
                 "--segment-max-new-tokens", str(MAX_NEW))  # fmt: skip


@pytest.fixture(scope="module")
def client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.http + "/v1", api_key="unused", max_retries=0)


def speech(
    client: openai.OpenAI, server: Any = None, **kw: Any
) -> tuple[bytes, list[float], dict[str, str]]:
    """One streamed response through the SDK: its bytes, the arrival time of each chunk, headers.
    With ``server``: asserts that the first bytes arrived while the server still generated."""
    kw.setdefault("model", "tts-1")
    kw.setdefault("voice", "alloy")
    kw.setdefault("input", TEXT)
    extra = {"seed": 3, "sampling": GREEDY, **kw.pop("extra", {})}
    t0 = time.monotonic()
    times: list[float] = []
    data = bytearray()
    with client.audio.speech.with_streaming_response.create(**kw, extra_body=extra) as r:
        headers = dict(r.headers)
        for chunk in r.iter_bytes():
            if server is not None and not times:
                assert server.generating(), "sent only once generated"
            times.append(time.monotonic() - t0)
            data += chunk
    return bytes(data), times, headers


@pytest.fixture(scope="module")
def reference(client: openai.OpenAI) -> np.ndarray:
    """The `pcm` response: 24 kHz 16-bit samples every other format must match."""
    data, _, headers = speech(client, response_format="pcm")
    assert headers["content-type"] == "audio/pcm" and headers["x-sample-rate"] == "24000"
    pcm = np.frombuffer(data, dtype="<i2")
    assert pcm.size > 20 * FRAME  # both segments spoke
    return pcm


def decode(data: bytes) -> tuple[np.ndarray, int]:
    """All samples (mono float) and the rate, by FFmpeg's decoders through PyAV."""
    with av.open(io.BytesIO(data)) as c:
        frames = [f for f in c.decode(audio=0)]
    rate = frames[0].sample_rate
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]), rate


@pytest.mark.parametrize(
    "fmt,mime,rate",
    [
        ("mp3", "audio/mpeg", 24000),
        ("opus", "audio/ogg", 48000),
        ("aac", "audio/aac", 24000),
        ("flac", "audio/flac", 24000),
        ("wav", "audio/wav", 24000),
    ],
)
def test_every_response_format_decodes_to_the_right_rate_and_duration(
    server: Any, client: openai.OpenAI, reference: np.ndarray, fmt: str, mime: str, rate: int
) -> None:
    # streamed as generated, but FLAC, whose header must state the length (libsndfile needs it)
    data, times, headers = speech(client, None if fmt == "flac" else server, response_format=fmt)
    assert headers["content-type"] == mime and headers["x-sample-rate"] == str(rate)
    x, got_rate = decode(data)  # FFmpeg
    assert got_rate == rate
    n = x.size * 24000 // rate  # in 24 kHz samples
    if fmt == "aac":
        n -= AAC_PRIMING
    assert abs(n - reference.size) <= FRAME, f"{fmt}: {n} samples, pcm has {reference.size}"
    if fmt in ("wav", "flac"):  # lossless: the very samples of `pcm`
        with av.open(io.BytesIO(data)) as c:
            y = np.concatenate([f.to_ndarray().reshape(-1) for f in c.decode(audio=0)])
        assert y.dtype == np.int16 and np.array_equal(y, reference)
    if fmt in SNDFILE_READS:  # libsndfile, as `soundfile.read` opens a saved response
        z, sr = sf.read(io.BytesIO(data), dtype="int16")
        assert abs(z.size * 24000 // sr - reference.size) <= FRAME, f"{fmt}: {z.size} at {sr} Hz"
        if fmt in ("wav", "flac"):
            assert sr == 24000 and np.array_equal(z, reference)
    else:  # AAC in ADTS: libsndfile has no AAC decoder
        assert fmt == "aac"
        with pytest.raises(sf.LibsndfileError):
            sf.read(io.BytesIO(data))
    print(f"\n{fmt}: {len(data)} bytes in {len(times)} chunks, first after {times[0]:.2f} s of "
          f"{times[-1]:.2f} s, {n - reference.size:+d} samples vs pcm")


def test_the_sdk_default_format_is_mp3(server: Any, reference: np.ndarray) -> None:
    r = httpx.post(server.http + "/v1/audio/speech", json={"input": TEXT, "voice": "alloy", "seed": 3, "sampling": GREEDY}, timeout=120)
    assert r.status_code == 200 and r.headers["content-type"] == "audio/mpeg"
    x, rate = decode(r.content)
    assert rate == 24000 and abs(x.size - reference.size) <= FRAME


def sse_events(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in data.decode().splitlines() if line.startswith("data: ")]


def test_sse_events_parse(client: openai.OpenAI, reference: np.ndarray) -> None:
    data, _, headers = speech(client, response_format="pcm", stream_format="sse")
    assert headers["content-type"].startswith("text/event-stream")
    events = sse_events(data)
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) > 2 and events[-1]["type"] == "speech.audio.done"
    assert events[-1]["usage"]["output_tokens"] > 0
    audio = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    assert np.array_equal(np.frombuffer(audio, dtype="<i2"), reference)
    # a container's deltas join into the container
    data, _, _ = speech(client, response_format="opus", stream_format="sse")
    ogg = b"".join(base64.b64decode(e["audio"]) for e in sse_events(data) if e["type"] == "speech.audio.delta")
    x, rate = decode(ogg)
    assert rate == 48000 and abs(x.size // 2 - reference.size) <= FRAME


@pytest.mark.parametrize("speed", [0.5, 1.5, 4.0])
def test_speed_stretches_the_audio(client: openai.OpenAI, reference: np.ndarray, speed: float) -> None:
    data, _, _ = speech(client, response_format="pcm", speed=speed)
    n = len(data) // 2
    want = reference.size / speed
    assert abs(n - want) <= FRAME, f"speed {speed}: {n} samples, expected {want:.0f}"
    wav, _, _ = speech(client, response_format="wav", speed=speed)
    y, sr = sf.read(io.BytesIO(wav), dtype="int16")
    assert sr == 24000 and np.array_equal(y, np.frombuffer(data, dtype="<i2"))


def test_instructions_reach_the_prompt(client: openai.OpenAI, demo_model_dir: Path, voice_wav: Path) -> None:
    from streamtts.engine.frontend import Engine
    from streamtts.engine.segmented import SegmentAudio, speak_segments
    from streamtts.request import StreamOptions
    from streamtts.text.segmenter import split_text

    text = "A short one, said with feeling."
    instr = "Whisper, as if telling a secret."
    # sampled, not greedy: the demo model's argmax ignores the prompt's wording
    sampled = {"sampling": None}
    plain, _, _ = speech(client, input=text, voice="echo", response_format="pcm", extra=sampled)
    told, _, _ = speech(client, input=text, voice="echo", response_format="pcm", instructions=instr, extra=sampled)
    assert told != plain

    async def local() -> bytes:
        from streamtts.audio.formats import StreamEncoder, get_format

        enc = StreamEncoder(get_format("pcm"))
        opts = StreamOptions(seed=3, max_new_tokens=MAX_NEW, instruction=instr)
        out = b""
        async with Engine.from_config(demo_model_dir / "config.yaml", max_streams=1, n_threads=2) as eng:
            async for ev in speak_segments(eng, split_text(text), options=opts):
                if isinstance(ev, SegmentAudio):
                    out += enc.encode(ev.pcm)
        return out + enc.flush()

    assert told == asyncio.run(local())  # the same bytes as the engine given that instruction


def test_voice_names_from_the_config(server: Any, client: openai.OpenAI, voice_wav: Path) -> None:
    # alloy is the table's clip: the same audio as that clip uploaded and named by its id
    vid = asyncio.run(StreamClient(server.ws).upload_voice(voice_wav.read_bytes()))
    by_name, _, _ = speech(client, response_format="pcm", voice="alloy")
    by_id, _, _ = speech(client, response_format="pcm", voice=vid)
    assert by_name == by_id
    # echo is null in the table: the model's own voice, as `default`
    echo, _, _ = speech(client, response_format="pcm", voice="echo")
    default, _, _ = speech(client, response_format="pcm", voice="default")
    assert echo == default and echo != by_name
    # a name the table does not have: 400, listing the names there are
    with pytest.raises(openai.BadRequestError) as exc:
        speech(client, voice="nova")
    err = exc.value.body
    assert isinstance(err, dict) and err["code"] == "unknown_voice" and err["param"] == "voice"
    assert "alloy, default, echo" in err["message"]
    # the WebSocket takes the names too
    r = asyncio.run(StreamClient(server.ws, voice="alloy", seed=3).synthesize("Hello there, friend."))
    assert r.size > 0


@pytest.mark.parametrize(
    "body,code,param",
    [
        ({"response_format": "ogg"}, "invalid_format", "response_format"),
        ({"response_format": "mp4"}, "invalid_format", "response_format"),
        ({"speed": 4.5}, "invalid_option", "speed"),
        ({"speed": 0.2}, "invalid_option", "speed"),
        ({"voice": "v_0123456789abcdef01234567"}, "unknown_voice", "voice"),
        ({"stream_format": "chunks"}, "invalid_request", "stream_format"),
        ({"sampling": {"audio_temperature": -1}}, "invalid_option", "sampling.audio_temperature"),
        ({"sampling": {"text_top_p": 1.5}}, "invalid_option", "sampling.text_top_p"),
        ({"input": "Hello there. " * 16000}, "text_too_long", "input"),  # over --max-session-chars
    ],
)
def test_bad_requests_are_400_with_their_code(server: Any, body: dict[str, Any], code: str, param: str) -> None:
    r = httpx.post(server.http + "/v1/audio/speech", json={"input": TEXT, **body}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["param"] == param and err["message"]
    assert param.split(".")[-1] in err["message"] or code == "text_too_long"
    if code == "text_too_long":  # and what to do about it
        assert "split it into several requests" in err["message"]
    # the server goes on serving
    ok = httpx.post(server.http + "/v1/audio/speech", json={"input": "Fine.", "response_format": "pcm"}, timeout=120)
    assert ok.status_code == 200 and len(ok.content) > 0


def test_sdk_raises_the_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        speech(client, speed=9.0)
    assert isinstance(exc.value.body, dict) and exc.value.body["code"] == "invalid_option"


def test_a_client_leaving_mid_stream_frees_the_engine_and_the_encoder(server: Any) -> None:
    """An mp3 response dropped after its first bytes: the generation and the encoder (busy in
    its worker thread) are released, and the server goes on serving."""
    for fmt in ("mp3", "opus", "aac", "mp3", "wav", "mp3"):  # where the cancel lands varies
        body = {"input": TEXT * 2, "response_format": fmt, "seed": 1}
        with httpx.stream("POST", server.http + "/v1/audio/speech", json=body, timeout=120) as r:
            assert r.status_code == 200
            first = next(r.iter_bytes())
            assert first
        server.wait_idle(timeout=10)  # no engine stream, no session slot left
    ok = httpx.post(server.http + "/v1/audio/speech", json={"input": "Fine.", "response_format": "aac"}, timeout=120)
    assert ok.status_code == 200 and decode(ok.content)[1] == 24000
