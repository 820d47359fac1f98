"""Voices designed once (``POST /v1/voices/design``, ``streamtts voice design``) and spoken by
every member: the server's MOSS-VoiceGenerator speaks a sample with the description as its
instruction; the audio is stored as a voice (encoded by the 32-level codec) that a
32-codebook member and a dialogue both take."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from conftest import ServerProcess, start_server, stop_server

from streamtts.demo.model import write_demo_model
from streamtts.request import Voice
from streamtts.server.voice_store import decode_voice, encode_voice

MAX_NEW = 48


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory, demo_model_dir: Path) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("family")
    vg = write_demo_model(root / "vg", member="moss-voice-generator")
    ttsd = write_demo_model(root / "ttsd", member="moss-ttsd")
    log = tmp_path_factory.mktemp("server") / "server.log"
    srv = start_server(["--model", f"tts={demo_model_dir / 'config.yaml'}", "--model", f"design={vg}",
                        "--model", f"dialog={ttsd}", "--on-demand", "--n-threads", "1",
                        "--segment-max-new-tokens", str(MAX_NEW), "--no-warmup"], log)  # fmt: skip
    yield srv
    stop_server(srv)


def _design(srv: ServerProcess, **body: Any) -> httpx.Response:
    return httpx.post(srv.http + "/v1/voices/design", json=body, timeout=300)


def _speech(srv: ServerProcess, **body: Any) -> httpx.Response:
    payload = {"response_format": "pcm", "seed": 3, "max_new_tokens": MAX_NEW, **body}
    return httpx.post(srv.http + "/v1/audio/speech", json=payload, timeout=300)


def test_a_designed_voice_is_spoken_by_every_member(family: ServerProcess) -> None:
    r = _design(family, description="a calm, low voice", name="calm", seed=5)
    assert r.status_code == 200, r.text
    got = r.json()
    assert (got["kind"], got["name"], got["model"], got["n_vq"]) == ("designed", "calm", "design", 32)
    assert got["seconds"] > 0 and got["voice_id"].startswith("v_")
    listed = {v["id"]: v for v in httpx.get(family.http + "/v1/audio/voices", timeout=30).json()["voices"]}
    assert listed[got["voice_id"]]["kind"] == "designed"
    assert listed[got["voice_id"]]["description"] == "a calm, low voice"

    plain = _speech(family, model="tts", input="Hello there.")
    voiced = _speech(family, model="tts", input="Hello there.", voice="calm")
    assert plain.status_code == 200 and voiced.status_code == 200, voiced.text
    assert voiced.content != plain.content  # the voice is used
    dialog = _speech(family, model="dialog", input="[S1] Hello. [S2] Hi there.", speakers={"S1": "calm"})
    assert dialog.status_code == 200, dialog.text
    assert len(dialog.content) > 0


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"description": "   "}, "description", "description is empty"),
        ({"description": "x" * 2001}, "description", "at most 2000"),
        ({"description": "calm", "model": "tts"}, "model", "not MOSS-VoiceGenerator"),
        ({"description": "calm", "model": "klingon"}, "model", "unknown model"),
        ({"description": "calm", "text": ""}, "text", "1-"),
        ({"description": "calm", "name": "v_0123456789abcdef01234567"}, "name", "voice name"),
    ],
)
def test_bad_design_requests_are_refused_naming_the_field(family: ServerProcess, body: dict[str, Any], param: str, words: str) -> None:
    r = _design(family, **body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err
    assert httpx.post(family.http + "/v1/voices/design", content=b"not json", timeout=30).status_code == 400
    assert family.health()["status"] == "ok"


def test_the_cli_designs_and_lists(family: ServerProcess) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "streamtts", *args], capture_output=True, text=True, timeout=300)

    res = cli("voice", "design", "a bright, quick voice", "--save", "bright", "--server", family.http, "--seed", "2")
    assert res.returncode == 0, res.stderr
    assert "use it with --voice bright" in res.stdout
    listed = cli("voices", "--server", family.http)
    assert "bright" in listed.stdout and "a bright, quick voice" in listed.stdout, listed.stdout
    bad = cli("voice", "design", "calm", "--model", "tts", "--server", family.http)
    assert bad.returncode == 2 and "not MOSS-VoiceGenerator" in bad.stderr, bad.stderr


def test_a_server_without_a_voice_generator_says_so(serve: Any) -> None:
    srv = serve("--n-threads", "1", "--no-warmup")
    r = _design(srv, description="a calm voice")
    assert r.status_code == 400 and "serves no MOSS-VoiceGenerator" in r.json()["error"]["message"], r.text


def test_the_description_is_stored_with_the_voice() -> None:
    v = Voice(codes=np.arange(64, dtype=np.int64).reshape(2, 32), name="calm", description="a calm voice")
    back = decode_voice(encode_voice(v))
    assert (back.name, back.description) == ("calm", "a calm voice")
    np.testing.assert_array_equal(back.codes, v.codes)
    assert json.dumps(back.description) == '"a calm voice"'


@pytest.mark.browser
def test_the_page_designs_a_voice_and_speaks_with_it(page: Any, family: ServerProcess) -> None:
    page.goto(f"{family.http}/?preroll=1.0")
    page.wait_for_selector("#design-row:not([hidden])", timeout=60_000)  # the server has a VoiceGenerator
    page.fill("#design-text", "a warm, slow voice")
    page.fill("#design-name", "warm")
    page.click("#design")
    page.wait_for_function("window.streamtts.design && window.streamtts.design.state !== 'designing'", timeout=120_000)
    got = page.evaluate("window.streamtts.design")
    assert got["state"] == "done" and got["name"] == "warm" and got["kind"] == "designed", got
    assert page.input_value("#voice") == "warm"
    page.fill("#text", "Spoken in the designed voice.")
    page.click("#speak")
    page.wait_for_function("window.streamtts.state === 'done'", timeout=120_000)
    st = page.evaluate("window.streamtts")
    assert st["ready"]["voice"] == "warm" and st["done"]["frames"] > 0
    page.fill("#design-text", "")
    page.click("#design")
    page.wait_for_function("window.streamtts.design.state === 'error'", timeout=30_000)
    assert "description is empty" in page.evaluate("window.streamtts.design.error")


@pytest.mark.browser
def test_the_page_picks_the_model_that_speaks(page: Any, family: ServerProcess) -> None:
    page.goto(f"{family.http}/?preroll=1.0")
    page.wait_for_selector("#speaker-row:not([hidden])", timeout=60_000)  # several models: a choice
    assert page.eval_on_selector_all("#speaker-model option", "os => os.map(o => o.value)") == ["tts", "design", "dialog"]
    page.select_option("#speaker-model", "dialog")
    page.fill("#text", "[S1] Hello there. [S2] Hi!")
    page.click("#speak")
    page.wait_for_function("window.streamtts.state === 'done'", timeout=120_000)
    st = page.evaluate("window.streamtts")
    assert st["ready"]["model"] == "dialog" and st["done"]["frames"] > 0
