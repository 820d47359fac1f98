"""Every prompt field, a dialogue's speakers and a continuation prefix through a real server:
the WebSocket ``start`` and ``POST /v1/audio/speech`` extras, over real sockets, on the demo
model; the listings ``GET /v1/models`` and ``GET /v1/audio/voices``. Each bad value is
refused naming its field (WS: an ``error``, the session waits for a corrected ``start``;
HTTP: a 400 with ``param``), and the server carries on.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile as sf
import websockets

from streamtts.client import StreamClient

MAX_NEW = 40
DIALOGUE = "[S1] Hi there, how are you? [S2] Fine, thanks."


@pytest.fixture(scope="module")
def server(serve: Any) -> Any:
    return serve("--max-streams", "2", "--n-threads", "2", "--segment-max-new-tokens", str(MAX_NEW))


@pytest.fixture(scope="module")
def clip() -> bytes:
    """A 0.8 s clip small enough to travel base64 in a `start` (64 KiB messages)."""
    sr = 16000
    t = np.arange(int(0.8 * sr)) / sr
    buf = io.BytesIO()
    sf.write(buf, 0.3 * np.sin(2 * np.pi * 220 * t), sr, format="WAV", subtype="PCM_16")
    return buf.getvalue()


@pytest.fixture(scope="module")
def voice_id(server: Any, voice_wav: Path) -> str:
    return asyncio.run(StreamClient(server.ws).upload_voice(voice_wav.read_bytes(), name="alice"))


async def ws_session(server: Any, start: dict[str, Any], text: str | None, *, end: bool = True) -> tuple[list[dict[str, Any]], int]:
    """One session: its JSON messages and the audio bytes it got (``text`` None: sent none)."""
    msgs: list[dict[str, Any]] = []
    audio = 0
    async with websockets.connect(server.ws, max_size=None) as ws:
        await ws.send(json.dumps({"type": "start", **start}))
        if text is not None:
            await ws.send(json.dumps({"type": "text", "text": text}))
        if end:
            await ws.send(json.dumps({"type": "end"}))
        async for m in ws:
            if isinstance(m, bytes):
                audio += len(m)
                continue
            msgs.append(json.loads(m))
            if msgs[-1]["type"] == "done" or (msgs[-1]["type"] == "error" and not end):
                break
    return msgs, audio


def ws_run(server: Any, start: dict[str, Any], text: str | None = None, **kw: Any) -> tuple[list[dict[str, Any]], int]:
    return asyncio.run(ws_session(server, start, text, **kw))


def test_models_lists_the_served_member(server: Any) -> None:
    r = httpx.get(server.http + "/v1/models", timeout=30)
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list" and len(body["data"]) == 1
    m = body["data"][0]
    assert (m["object"], m["model_kind"], m["n_vq"]) == ("model", "moss-tts", 32) and m["id"]


def test_audio_voices_lists_names_and_uploads(server: Any, voice_id: str) -> None:
    r = httpx.get(server.http + "/v1/audio/voices", timeout=30)
    assert r.status_code == 200
    voices = {v["id"]: v for v in r.json()["voices"]}
    assert voices["default"]["kind"] == "name" and voices["default"]["seconds"] is None
    up = voices[voice_id]
    assert (up["kind"], up["name"], up["n_vq"]) == ("uploaded", "alice", 32) and up["seconds"] > 3


def test_ws_dialogue_with_an_id_and_a_base64_clip(server: Any, voice_id: str, clip: bytes) -> None:
    b64 = base64.b64encode(clip).decode()
    start = {"speakers": {"S1": voice_id, "S2": b64}, "seed": 3, "instruction": "Two friends.",
             "language": "en", "quality": "high", "sound_event": "none", "tokens": 30}  # fmt: skip
    msgs, audio = ws_run(server, start, DIALOGUE)
    assert [m["type"] for m in msgs if m["type"] == "error"] == []
    assert audio > 0 and msgs[-1]["type"] == "done" and msgs[-1]["segments"] >= 1
    # the clip was encoded and stored once, like an upload: it is listed now
    listed = httpx.get(server.http + "/v1/audio/voices", timeout=30).json()["voices"]
    assert sum(v["kind"] == "uploaded" for v in listed) == 2
    _, again = ws_run(server, start, DIALOGUE)
    assert again == audio  # reproducible with the seed (the clip is not encoded again)


def test_ws_sound_without_text(server: Any) -> None:
    msgs, audio = ws_run(server, {"ambient_sound": "rain on a roof", "tokens": 8, "seed": 1}, None)
    assert audio > 0 and msgs[-1]["type"] == "done" and msgs[-1]["segments"] == 1


def test_ws_continuation(server: Any, voice_id: str) -> None:
    msgs, audio = ws_run(server, {"prefix": voice_id, "prefix_text": "Well,", "seed": 2}, "then we go on.")
    assert audio > 0 and msgs[-1]["type"] == "done"
    seg = next(m for m in msgs if m["type"] == "segment")
    assert seg["text"] == "then we go on."  # the transcript goes to the prompt, not the segment list


@pytest.mark.parametrize(
    ("start", "code", "needle"),
    [
        ({"speakers": {"S1": "v_000000000000000000000000"}}, "unknown_voice", "speakers.S1"),
        ({"speakers": {"Bob": "{vid}"}}, "invalid_option", "'Bob' is not a speaker tag"),
        ({"voice": "{vid}", "speakers": {"S1": "{vid}"}}, "invalid_option", "voice and speakers"),
        ({"speakers": {"S1": "default"}}, "invalid_option", "speakers.S1: 'default' is the model's own voice"),
        ({"speakers": {"S1": "!" * 80}}, "invalid_reference_audio", "not valid base64"),
        ({"prefix": base64.b64encode(b"not audio at all" * 8).decode()}, "invalid_reference_audio", "prefix"),
        ({"prefix_text": "Before"}, "invalid_option", "prefix_text is the transcript of a prefix"),
        ({"tokens": 0}, "invalid_option", "tokens (duration in frames) must be >= 1"),
        ({"language": " "}, "invalid_option", "language is empty"),
    ],
)
def test_ws_bad_fields_are_named(server: Any, voice_id: str, start: dict[str, Any], code: str, needle: str) -> None:
    start = json.loads(json.dumps(start).replace("{vid}", voice_id))
    msgs, _ = ws_run(server, start, None, end=False)
    err = msgs[-1]
    assert (err["type"], err["code"], err["fatal"]) == ("error", code, False), err
    assert needle in err["message"], err
    assert server.health()["status"] == "ok"


def test_ws_a_segment_tagging_a_missing_speaker_is_skipped(server: Any, voice_id: str) -> None:
    msgs, _ = ws_run(server, {"speakers": {"S1": voice_id}, "seed": 1}, "[S1] Hi there. [S2] Who is this?")
    errors = [m for m in msgs if m["type"] == "error"]
    assert errors and errors[0]["code"] == "invalid_text" and "[S2]" in errors[0]["message"]
    assert msgs[-1]["type"] == "done"


def speech(server: Any, **body: Any) -> httpx.Response:
    body = {"model": "tts-1", "response_format": "pcm", "seed": 3, "max_new_tokens": MAX_NEW, **body}
    return httpx.post(server.http + "/v1/audio/speech", json=body, timeout=120)


def test_http_every_extra(server: Any, voice_id: str, clip: bytes) -> None:
    b64 = base64.b64encode(clip).decode()
    r = speech(server, input=DIALOGUE, speakers={"S1": voice_id, "S2": b64}, instructions="Two friends.",
               language="English", quality="high", sound_event="none", tokens=30)  # fmt: skip
    assert r.status_code == 200, r.text
    told = r.content
    assert len(told) > 0
    again = speech(server, input=DIALOGUE, speakers={"S1": voice_id, "S2": b64}, instructions="Two friends.",
                   language="English", quality="high", sound_event="none", tokens=30).content  # fmt: skip
    assert again == told
    r = speech(server, input="", ambient_sound="rain on a roof", tokens=8)
    assert r.status_code == 200 and len(r.content) > 0, r.text
    r = speech(server, input="then we go on.", prefix=voice_id, prefix_text="Well,")
    assert r.status_code == 200 and len(r.content) > 0, r.text


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"input": "[S1] Hi. [S2] Yo.", "speakers": {"S1": "{vid}"}}, 400, "invalid_option", "speakers"),
        ({"input": "[S1] Hi.", "speakers": {"S1": "{vid}", "S2": "{vid}"}}, 400, "invalid_option", "speakers"),
        ({"input": "[S1] Hi.", "speakers": {"S1": "v_000000000000000000000000"}}, 400, "unknown_voice", "speakers.S1"),
        ({"input": "[S1] Hi.", "voice": "alloy", "speakers": {"S1": "{vid}"}}, 400, "invalid_option", "speakers"),
        ({"input": "Hi.", "prefix_text": "Before"}, 400, "invalid_option", "prefix_text"),
        ({"input": "Hi.", "prefix": "nope"}, 400, "unknown_voice", "prefix"),
        ({"input": "Hi.", "tokens": 0}, 400, "invalid_option", "tokens"),
        ({"input": "Hi.", "language": ""}, 400, "invalid_option", "language"),
        ({"input": ""}, 400, "invalid_text", None),
    ],
)
def test_http_bad_fields_are_named(server: Any, voice_id: str, body: dict[str, Any], status: int, code: str, param: str | None) -> None:
    body = json.loads(json.dumps(body).replace("{vid}", voice_id))
    r = speech(server, **body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == (code, param), err
    assert server.health()["status"] == "ok"


def test_a_field_the_prompt_template_lacks_is_named(server: Any) -> None:
    """`scene` under the default template (no Scene line): refused naming the field, over
    WebSocket (an error for the segment; the session goes on) and HTTP (a 400)."""
    msgs, _ = ws_run(server, {"scene": "a studio", "seed": 1}, "Hi there.")
    errors = [m for m in msgs if m["type"] == "error"]
    assert errors and "scene: not a field of the prompt template 'moss'" in errors[0]["message"], msgs
    assert not errors[0]["fatal"] and msgs[-1]["type"] == "done"
    r = speech(server, input="Hi there.", scene="a studio")
    assert r.status_code == 400 and "scene: not a field of the prompt template" in r.text, r.text
    assert server.health()["status"] == "ok"
