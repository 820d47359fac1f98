"""Voices by name on every surface (issue 40, item 1): an upload's name works wherever a voice
is named (the WebSocket, the speech endpoint, `say --voice`); OpenAI's names are listed as the
aliases of the model's own voice they are; an unknown voice lists the voices there are;
`synth`/`speak --voice` take the config's voices by name, and say plainly where else to look;
`streamtts voices` / `models` list them, here or on a server.

Real `streamtts serve` processes and real `python -m streamtts` commands.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile as sf

NO_ENGINE = {"STREAMTTS_BRIDGE_LIB": "/nonexistent/libstreamtts_bridge.so"}


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "streamtts", *args], capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "COLUMNS": "100", **(env or {})}, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.fixture(scope="module")
def server(serve: Any) -> Any:
    return serve("--segment-max-new-tokens", "60")


@pytest.fixture(scope="module")
def alice(server: Any, voice_wav: Path) -> str:
    """A voice uploaded with the name alice: its id."""
    r = httpx.post(server.http + "/v1/voices?name=alice", content=voice_wav.read_bytes(), timeout=120)
    assert r.status_code in (200, 201), r.text
    assert r.json()["name"] == "alice"
    return str(r.json()["voice_id"])


def test_say_speaks_an_uploaded_voice_by_its_name(server: Any, alice: str, tmp_path: Path) -> None:
    by_name, by_id = tmp_path / "name.wav", tmp_path / "id.wav"
    for voice, out in (("alice", by_name), (alice, by_id)):
        r = run("say", "--server", server.http, "--voice", voice, "--seed", "3", "--save", str(out), "Hello there.")
        assert r.returncode == 0, r.stderr
    a, b = sf.read(by_name)[0], sf.read(by_id)[0]
    assert a.size > 0 and np.array_equal(a, b)  # the name is that voice
    server.wait_idle()


def test_the_speech_endpoint_takes_the_name_too(server: Any, alice: str) -> None:
    bodies = []
    for voice in ("alice", alice):
        r = httpx.post(server.http + "/v1/audio/speech", timeout=120,
                       json={"input": "Hello there.", "voice": voice, "seed": 3, "response_format": "pcm"})  # fmt: skip
        assert r.status_code == 200, r.text
        bodies.append(r.content)
    assert len(bodies[0]) > 0 and bodies[0] == bodies[1]
    server.wait_idle()


def test_an_unknown_voice_lists_the_voices_on_every_surface(server: Any, alice: str, tmp_path: Path) -> None:
    out = tmp_path / "bob.wav"
    r = run("say", "--server", server.http, "--voice", "bob", "--save", str(out), "Hello there.")
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("streamtts: error: unknown_voice: unknown voice 'bob'"), line
    assert "alice: uploaded" in line and "alloy, ash" in line and "aliases of default" in line, line
    assert "upload it again" not in line and not out.exists()  # nothing was said, no file
    http = httpx.post(server.http + "/v1/audio/speech", json={"input": "Hi.", "voice": "bob"}, timeout=60)
    assert http.status_code == 400 and "alice: uploaded" in http.json()["error"]["message"]
    server.wait_idle()


def test_openai_names_are_listed_as_aliases_of_the_model_s_own_voice(server: Any, alice: str) -> None:
    voices = {v["id"]: v for v in httpx.get(server.http + "/v1/audio/voices", timeout=30).json()["voices"]}
    assert voices["alloy"]["alias_of"] == "default" and voices["nova"]["alias_of"] == "default"
    assert "alias_of" not in voices["default"] and voices["default"]["description"] == "the model's own voice"
    assert voices[alice]["kind"] == "uploaded" and voices[alice]["name"] == "alice"
    # a name that is already a configured one is refused, naming the field
    r = httpx.post(server.http + "/v1/voices?name=alloy", content=b"RIFF", timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "name", r.text


def test_voices_and_models_list_a_server_s(server: Any, alice: str) -> None:
    r = run("voices", "--server", server.http)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert f"alice ({alice}): an uploaded clip" in r.stdout, r.stdout
    assert any(ln.startswith("alloy, ash") and "aliases of default" in ln for ln in lines), r.stdout
    m = run("models", "--server", server.http)
    assert m.returncode == 0 and "moss-tts, 32 codebooks" in m.stdout, m.stderr
    assert httpx.get(server.http + "/v1/info", timeout=30).json()["model_kind"] == "moss-tts"  # the member loaded


@pytest.fixture(scope="module")
def table_config(demo_model_dir: Path, voice_wav: Path, bridge_lib: Any) -> Path:
    """The demo model with a voices table: carol is a clip, default the model's own."""
    path = demo_model_dir / "voices.yaml"
    path.write_text((demo_model_dir / "config.yaml").read_text() + f"\nvoices:\n  carol: {voice_wav}\n  default: null\n")
    return path


def test_voices_lists_the_config_s(table_config: Path, voice_wav: Path) -> None:
    r = run("voices", "--config", str(table_config), env=NO_ENGINE)  # loads no model
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"carol: a clip: {voice_wav.resolve()}", "default: the model's own voice"]
    m = run("models", "--config", str(table_config), env=NO_ENGINE)
    assert m.returncode == 0 and "moss-tts, 32 codebooks" in m.stdout, m.stderr


def test_synth_takes_a_configured_voice_by_name(table_config: Path, voice_wav: Path, tmp_path: Path) -> None:
    common = ["--config", str(table_config), "--text", "Hello there.", "--seed", "4", "--n-threads", "1"]
    named = run("synth", *common, "--voice", "carol", "--out", str(tmp_path / "n.wav"))
    clip = run("synth", *common, "--reference", str(voice_wav), "--out", str(tmp_path / "c.wav"))
    assert named.returncode == 0 and clip.returncode == 0, (named.stderr, clip.stderr)
    assert np.array_equal(sf.read(tmp_path / "n.wav")[0], sf.read(tmp_path / "c.wav")[0])


def test_synth_with_a_name_found_nowhere_says_where_it_looked(table_config: Path, tmp_path: Path) -> None:
    r = run("synth", "--config", str(table_config), "--text", "Hi.", "--voice", "bob", "--out", str(tmp_path / "x.wav"),
            env={**NO_ENGINE, "STREAMTTS_VOICE_STORE": "memory"})  # fmt: skip
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    line = r.stderr.strip()
    assert line.startswith("streamtts: error: --voice bob: no voice of that name here"), line
    assert "carol, default (default: the model's own voice; carol: the config's voices)" in line, line
    assert "streamtts say --server URL --voice bob" in line
    assert "STREAMTTS_VOICE_STORE" in line


def test_synth_takes_an_upload_s_name_from_the_shared_store(
    serve: Any, redis_server: Any, voice_wav: Path, demo_model_dir: Path, tmp_path: Path
) -> None:
    """A voice uploaded to a server that keeps its voices in Redis: `synth --voice NAME` on
    another machine sharing that store speaks in it (the same codes as the clip itself)."""
    srv = serve("--voice-store", redis_server.url)
    r = httpx.post(srv.http + "/v1/voices?name=dana", content=voice_wav.read_bytes(), timeout=120)
    assert r.status_code in (200, 201), r.text
    common = ["--config", str(demo_model_dir / "config.yaml"), "--text", "Hello there.", "--seed", "4", "--n-threads", "1"]
    named = run("synth", *common, "--voice", "dana", "--out", str(tmp_path / "n.wav"),
                env={"STREAMTTS_VOICE_STORE": redis_server.url})  # fmt: skip
    clip = run("synth", *common, "--reference", str(voice_wav), "--out", str(tmp_path / "c.wav"))
    assert named.returncode == 0 and clip.returncode == 0, (named.stderr, clip.stderr)
    assert np.array_equal(sf.read(tmp_path / "n.wav")[0], sf.read(tmp_path / "c.wav")[0])
    missing = run("synth", *common, "--voice", "erin", "--out", str(tmp_path / "m.wav"),
                  env={"STREAMTTS_VOICE_STORE": redis_server.url, **NO_ENGINE})  # fmt: skip
    assert missing.returncode == 2 and "bridge" not in missing.stderr, missing.stderr  # said before the load
    assert missing.stderr.strip().splitlines()[-1].startswith("streamtts: error: --voice erin: the voice store")
