"""What a newcomer meets over HTTP: the model's name and the demo notice, the favicon, voice
uploads from a form (``curl -F``), readable upload errors, voices listed with their names,
OpenAI's SSE without a WAV header and with the input's token count, and "..." refused
the same way everywhere. A real `streamtts serve` on the demo model, real sockets."""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile as sf


@pytest.fixture(scope="module")
def server(serve: Any) -> Any:
    return serve("--max-streams", "2", "--max-sessions", "2", "--n-threads", "1")


def clip(seconds: float = 2.0) -> bytes:
    t = np.arange(int(24000 * seconds)) / 24000
    x = (0.3 * np.sin(2 * np.pi * 240 * t) * (1 + 0.3 * np.sin(2 * np.pi * 2 * t))).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, x, 24000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def test_info_names_the_demo_model(server: Any) -> None:
    r = httpx.get(server.http + "/v1/info", timeout=10)
    assert r.status_code == 200
    info = r.json()
    assert info["demo"] is True and info["ready"] is True
    assert info["model"].startswith("streamtts demo model (tiny")
    assert "tones, not words" in info["notice"]
    assert info["n_vq"] == 32  # the model's codebooks per frame


def test_info_and_metrics_say_where_the_backbone_runs(server: Any) -> None:
    """As llama.cpp reported its load: the suite's process runs the CPU build (auto)."""
    bb = httpx.get(server.http + "/v1/info", timeout=10).json()["backbone"]
    assert bb["backend"] == "cpu" and bb["device"] == "CPU" and bb["layers_offloaded"] == 0
    assert bb["device_memory_mib"] == 0
    text = server.metrics()
    assert 'streamtts_backbone_info{backend="cpu",device="CPU",device_description="' in text
    assert server.metric("streamtts_backbone_layers_offloaded") == 0
    assert server.metric("streamtts_backbone_device_memory_bytes") == 0


def test_favicon(server: Any) -> None:
    for path in ("/favicon.ico", "/static/favicon.svg"):
        r = httpx.get(server.http + path, timeout=10)
        assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml")
        assert r.content.startswith(b"<svg")
    page = httpx.get(server.http + "/", timeout=10).text
    assert 'rel="icon"' in page


def test_multipart_upload_like_curl_f(server: Any) -> None:
    data = clip(2.5)
    r = httpx.post(
        server.http + "/v1/voices", files={"file": ("alice.wav", data, "audio/wav")}, data={"name": "alice"}, timeout=60
    )
    assert r.status_code == 201, r.text
    v = r.json()
    assert v["name"] == "alice" and v["frames"] == 32  # 2.5 s padded to whole 80 ms frames
    # the same bytes as a plain body: the same voice (the id is the clip's digest)
    raw = httpx.post(server.http + "/v1/voices", content=data, timeout=60)
    assert raw.status_code == 200 and raw.json()["voice_id"] == v["voice_id"] and raw.json()["cached"]
    listed = httpx.get(server.http + "/v1/voices", timeout=10).json()["voices"]
    assert {"voice_id": v["voice_id"], "name": "alice", "seconds": v["seconds"], "frames": 32, "n_vq": 32} in listed


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"content": b"this is not audio" * 50}, "cannot read it as wav/flac/ogg audio (Format not recognised)"),
        ({"files": {"file": ("x.wav", b"this is not audio" * 50, "audio/wav")}}, "cannot read it as wav/flac/ogg"),
        (
            {
                "content": b'--b\r\nContent-Disposition: form-data; name="name"\r\n\r\nx\r\n--b--\r\n',
                "headers": {"content-type": "multipart/form-data; boundary=b"},
            },
            "no file part",
        ),
    ],
)
def test_upload_errors_are_readable(server: Any, kw: dict[str, Any], needle: str) -> None:
    r = httpx.post(server.http + "/v1/voices", timeout=30, **kw)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_reference_audio" and needle in err["message"], err
    assert "BytesIO" not in err["message"] and " at 0x" not in err["message"]


def test_sse_sends_no_wav_header_and_counts_input_tokens(server: Any) -> None:
    body = {"input": "Hello there, one two three.", "response_format": "wav", "stream_format": "sse", "seed": 3}
    r = httpx.post(server.http + "/v1/audio/speech", json=body, timeout=120)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    deltas = [base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"]
    assert deltas and not deltas[0].startswith(b"RIFF"), "the first audio event is a WAV header"
    done = events[-1]
    assert done["type"] == "speech.audio.done"
    usage = done["usage"]
    assert usage["input_tokens"] > 0 and usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert sum(len(d) for d in deltas) == usage["output_tokens"] * 1920 * 2  # s16le: all audio, nothing else
    server.wait_idle()


def test_text_with_nothing_to_say_is_refused_over_http_too(server: Any) -> None:
    r = httpx.post(server.http + "/v1/audio/speech", json={"input": "..."}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_text"
