"""A dialogue tag without a voice, under MOSS-TTSD's template, on every surface: the checkpoint's
processor lists that speaker as ``[S1]: None`` and the model invents its voice, so the WebSocket
and HTTP ``speakers`` map, ``synth --speaker`` and the Python API take ``[S1] .. [S2] ..`` with
only S2's voice (the same requests under the GitHub template are refused: tests/server/
test_fields_server.py, tests/cli/test_cli_fields.py). Real server and CLI processes on the demo
model with ``prompt_template: moss-ttsd`` (the template carries the rule, whichever model)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import websockets

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
    async def session() -> tuple[list[dict[str, Any]], int]:
        msgs: list[dict[str, Any]] = []
        audio = 0
        async with websockets.connect(server.ws, max_size=None) as ws:
            await ws.send(json.dumps({"type": "start", "speakers": {"S2": voice_id}, "seed": 1}))
            await ws.send(json.dumps({"type": "text", "text": TEXT}))
            await ws.send(json.dumps({"type": "end"}))
            async for m in ws:
                if isinstance(m, bytes):
                    audio += len(m)
                    continue
                msgs.append(json.loads(m))
                if msgs[-1]["type"] == "done":
                    break
        return msgs, audio

    msgs, audio = asyncio.run(session())
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
