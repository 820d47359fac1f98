"""MOSS-TTSD's requests on every surface (WebSocket, HTTP, ``synth``, the Python API), real server
and CLI processes on the demo model with ``prompt_template: moss-ttsd`` (the template carries the
rules, whichever model):

- a dialogue tag without a voice: the checkpoint's processor lists that speaker as ``[S1]: None``
  and the model invents its voice, so ``[S1] .. [S2] ..`` with only S2's voice is taken (the
  same requests under the GitHub template are refused: tests/server/test_fields_server.py,
  tests/cli/test_cli_fields.py);
- a continuation of the speakers' own clips: each speaker's clip and its transcript
  (``speaker_texts`` / ``--speaker-text``); the clips joined are the prefix (the prompt itself is
  checked against MOSS-TTSD's app in tests/engine/test_ttsd_exact.py)."""

from __future__ import annotations

import asyncio
import base64
import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile as sf
from test_fields_server import ws_run  # one WebSocket session: its messages and audio bytes

from streamtts.client import StreamClient
from streamtts.core.prompt import HFTokenizer
from streamtts.request import StreamOptions, Voice
from streamtts.sync import SyncEngine

TEXT = "[S1] Hi there, who is this? [S2] Only my voice is given."
MAX_NEW = 48  # the demo model has 32 codebooks: its first frame takes 32 steps


@pytest.fixture(scope="module")
def ttsd_yaml(demo_model_dir: Path) -> Path:
    """The demo model's config with MOSS-TTSD's template (beside it: its paths resolve so)."""
    path = demo_model_dir / "config-ttsd-template.yaml"
    path.write_text((demo_model_dir / "config.yaml").read_text() + "prompt_template: moss-ttsd\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def server(serve: Any, ttsd_yaml: Path) -> Any:
    return serve("--config", str(ttsd_yaml), "--max-streams", "1", "--n-threads", "2",
                 "--segment-max-new-tokens", str(MAX_NEW))  # fmt: skip


@pytest.fixture(scope="module")
def voice_id(server: Any, voice_wav: Path) -> str:
    return asyncio.run(StreamClient(server.ws).upload_voice(voice_wav.read_bytes(), name="bob"))


def test_websocket_speakers_map(server: Any, voice_id: str) -> None:
    msgs, audio = ws_run(server, {"speakers": {"S2": voice_id}, "seed": 1}, TEXT)
    assert not [m for m in msgs if m["type"] == "error"], msgs
    assert msgs[-1]["type"] == "done" and audio > 0, msgs


def test_http_speakers_map(server: Any, voice_id: str) -> None:
    body = {"model": "tts-1", "response_format": "pcm", "seed": 3, "max_new_tokens": MAX_NEW,
            "input": TEXT, "speakers": {"S2": voice_id}}  # fmt: skip
    r = httpx.post(server.http + "/v1/audio/speech", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert len(r.content) > 0
    assert server.health()["status"] == "ok"


def test_synth_speaker_alone(ttsd_yaml: Path, tmp_path: Path) -> None:
    codes = tmp_path / "bob.npy"
    np.save(codes, np.random.default_rng(0).integers(0, 1024, (6, 32)))
    prompt = tmp_path / "prompt.npy"
    res = subprocess.run(
        [sys.executable, "-m", "streamtts", "-q", "synth", "--config", str(ttsd_yaml), "--seed", "1",
         "--max-new-tokens", "48", "--text", TEXT, "--speaker", f"S2={codes}", "--out", str(tmp_path / "x.wav"),
         "--prompt-out", str(prompt)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "100"},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    rows = np.load(prompt)
    from streamtts.config import load_config

    text = HFTokenizer(load_config(ttsd_yaml).tokenizer_dir).decode([int(t) for t in rows[:, 0]])
    assert "- Reference(s):\n[S1]: None\n[S2]:\n" in text


def test_python_api(ttsd_yaml: Path) -> None:
    v = Voice.from_codes(np.random.default_rng(1).integers(0, 1024, (5, 32)))
    with SyncEngine(ttsd_yaml, max_streams=1, n_threads=2, warmup=False) as tts:
        chunks = list(tts.stream(TEXT, speakers={"S2": v}, options=StreamOptions(seed=1, max_new_tokens=MAX_NEW)))
        assert chunks and chunks[-1].is_last
        # a voice no tag uses is still a mistake in the request
        with pytest.raises(Exception, match=r"a voice is given for speaker \[S3\] but the text has no \[S3\] tag"):
            list(tts.stream(TEXT, speakers={"S2": v, "S3": v}, options=StreamOptions(seed=1, max_new_tokens=MAX_NEW)))


def _clip(hz: float, seconds: float = 0.8, rate: int = 8000) -> bytes:
    """A clip small enough for two to travel base64 in a `start` (64 KiB messages)."""
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, 0.3 * np.sin(2 * np.pi * hz * t), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


CLIPS = {"S1": base64.b64encode(_clip(200.0)).decode(), "S2": base64.b64encode(_clip(300.0)).decode()}
SAID = {"S1": "First prompt words.", "S2": "Second prompt words."}


def test_websocket_continues_the_speakers_clips(server: Any) -> None:
    msgs, audio = ws_run(server, {"speakers": CLIPS, "speaker_texts": SAID, "seed": 1}, "[S1] Now the new line.")
    assert not [m for m in msgs if m["type"] == "error"], msgs
    assert msgs[-1]["type"] == "done" and audio > 0, msgs


def test_http_continues_the_speakers_clips(server: Any, voice_id: str) -> None:
    body = {"model": "tts-1", "response_format": "pcm", "seed": 3, "max_new_tokens": MAX_NEW,
            "input": "[S1] Now the new line.", "speakers": CLIPS, "speaker_texts": SAID}  # fmt: skip
    r = httpx.post(server.http + "/v1/audio/speech", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert len(r.content) > 0
    # a stored voice is codes: there is no clip to join
    r = httpx.post(server.http + "/v1/audio/speech", json={**body, "speakers": {"S1": voice_id, "S2": CLIPS["S2"]}}, timeout=120)
    assert r.status_code == 400 and r.json()["error"]["param"] == "speaker_texts", r.text
    assert "stored as codes" in r.json()["error"]["message"]
    r = httpx.post(server.http + "/v1/audio/speech", json={**body, "speaker_texts": {"S3": "x"}}, timeout=120)
    assert r.status_code == 400 and "speakers gives no S3" in r.text, r.text
    assert server.health()["status"] == "ok"


def test_synth_speaker_text(ttsd_yaml: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a.wav", tmp_path / "b.wav"
    a.write_bytes(_clip(200.0))
    b.write_bytes(_clip(300.0))
    prompt = tmp_path / "prompt.npy"

    def synth(*args: str) -> Any:
        return subprocess.run(
            [sys.executable, "-m", "streamtts", "-q", "synth", "--config", str(ttsd_yaml), "--seed", "1",
             "--max-new-tokens", "48", "--out", str(tmp_path / "x.wav"), *args],
            capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "100"},
        )  # fmt: skip

    res = synth("--text", "[S1] Now the new line.", "--speaker", f"S1={a}", "--speaker", f"S2={b}",
                "--speaker-text", "S1=First prompt words.", "--speaker-text", "S2=Second prompt words.",
                "--prompt-out", str(prompt))  # fmt: skip
    assert res.returncode == 0, res.stderr
    from streamtts.config import load_config

    text = HFTokenizer(load_config(ttsd_yaml).tokenizer_dir).decode([int(t) for t in np.load(prompt)[:, 0]])
    assert "[S1]First prompt words.[S2]Second prompt words." in text
    bad = synth("--text", "[S1] Hi.", "--speaker", f"S1={a}", "--speaker-text", "S2=Words.")
    assert bad.returncode == 2 and "--speaker-text S2: the transcript of --speaker S2's clip" in bad.stderr, bad.stderr
