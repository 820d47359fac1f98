"""A newcomer's mistakes get one line, exit status 2, no traceback, and the next step.

Every command runs as a real ``python -m streamtts`` process. Checks that must happen before
the engine loads are run with ``STREAMTTS_BRIDGE_LIB`` pointing at a file that does not
exist: had the command loaded the engine first, it would have failed with the missing
library instead of the message asserted here (no timing involved).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

NO_ENGINE = {"STREAMTTS_BRIDGE_LIB": "/nonexistent/libstreamtts_bridge.so"}


@pytest.fixture(scope="module")
def demo_cache(tmp_path_factory: pytest.TempPathFactory, bridge_lib: Any) -> Path:
    """A cache folder holding the demo model, as `streamtts` without --config finds it, and
    the built bridge where discovery looks (a link to the one this test run loaded)."""
    from streamtts.demo.model import ensure_demo_model
    from streamtts.model._llama import BRIDGE_NAME, open_bridge

    cache = tmp_path_factory.mktemp("cache")
    ensure_demo_model(cache)
    lib = open_bridge()[1]
    assert lib.name == BRIDGE_NAME
    (cache / "native").mkdir()
    # the whole build folder: the bridge finds libllama beside it ($ORIGIN)
    (cache / "native" / "current-cpu").symlink_to(lib.parent.parent)
    return cache


def run(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 300,
    stdin: str | None = None,
) -> Any:
    full_env = {**os.environ, "COLUMNS": "100", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "streamtts", *args],
        capture_output=True, text=True, env=full_env, cwd=cwd, timeout=timeout, input=stdin,
    )  # fmt: skip


def one_line_error(r: Any, *needles: str) -> str:
    """The process failed with exit status 2 and exactly one stderr line naming the problem."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    line = lines[0]
    assert line.startswith("streamtts: error: "), line
    for n in needles:
        assert n in line, (n, line)
    return line


# -- mistakes caught before the engine loads ------------------------------------------------------
def test_out_into_a_missing_folder(tmp_path: Path) -> None:
    r = run("synth", "--text", "Hello.", "--out", str(tmp_path / "nope" / "x.wav"), env=NO_ENGINE)
    one_line_error(r, "--out", "does not exist", "mkdir -p")
    assert not (tmp_path / "nope").exists()


def test_unknown_output_extension(tmp_path: Path) -> None:
    r = run("synth", "--text", "Hello.", "--out", str(tmp_path / "x.mp4"), env=NO_ENGINE)
    one_line_error(r, "unknown audio file extension .mp4", ".wav")


def test_missing_reference_clip(tmp_path: Path) -> None:
    r = run("synth", "--text", "Hello.", "--reference", "me.wav", "--out", str(tmp_path / "x.wav"), env=NO_ENGINE, cwd=tmp_path)
    one_line_error(r, "--reference me.wav: no such file")


def test_reference_that_is_not_audio(tmp_path: Path) -> None:
    clip = tmp_path / "me.wav"
    clip.write_bytes(b"not audio at all" * 64)
    r = run("synth", "--text", "Hello.", "--reference", str(clip), "--out", str(tmp_path / "x.wav"), env=NO_ENGINE)
    one_line_error(r, "cannot read it as wav/flac/ogg")


@pytest.mark.parametrize(("text", "needle"), [("", "--text is empty"), ("   ", "--text is empty"), ("...", "nothing to say")])
def test_text_with_nothing_to_say(text: str, needle: str, tmp_path: Path) -> None:
    r = run("synth", "--text", text, "--out", str(tmp_path / "x.wav"), env=NO_ENGINE)
    one_line_error(r, needle)


def test_missing_config_file(tmp_path: Path) -> None:
    r = run("synth", "--text", "Hello.", "--config", "weights/streamtts.yaml", env=NO_ENGINE, cwd=tmp_path)
    one_line_error(r, "--config weights/streamtts.yaml: no such file")


def test_config_without_its_weights() -> None:
    """configs/default.yaml names weights/ files that a fresh clone does not have."""
    if (Path(__file__).resolve().parents[2] / "weights").exists():
        pytest.skip("this checkout has a weights/ folder")
    r = run("synth", "--text", "Hello.", "--config", "configs/default.yaml", env=NO_ENGINE, cwd=Path(__file__).resolve().parents[2])
    one_line_error(r, "--config configs/default.yaml: backbone_gguf", "does not exist", "streamtts download")
    r = run("serve", "--config", "configs/cpu.yaml", "--port", "0", env=NO_ENGINE, cwd=Path(__file__).resolve().parents[2])
    one_line_error(r, "--config configs/cpu.yaml: backbone_gguf", "streamtts download")


def test_unknown_option_suggests_the_right_one() -> None:
    line = one_line_error(run("synth", "--text", "Hi", "--ot", "x.wav", env=NO_ENGINE), "--ot")
    assert "did you mean --out?" in line and "streamtts synth --help" in line
    line = one_line_error(run("serve", "--prot", "8000", env=NO_ENGINE), "did you mean --port?", "streamtts serve --help")
    line = one_line_error(run("synt", "--text", "Hi", env=NO_ENGINE), "did you mean 'synth'?")


def test_bad_option_value() -> None:
    one_line_error(run("synth", "--text", "Hi", "--n-threads", "-1", env=NO_ENGINE), "--n-threads", ">= 0")


@pytest.mark.parametrize(
    "flag,value,needle",
    [
        ("--audio-temperature", "-1", "--audio-temperature must be a finite number >= 0"),
        ("--text-temperature", "nan", "--text-temperature must be a finite number >= 0"),
        ("--audio-top-p", "1.5", "--audio-top-p must be in (0, 1]"),
        ("--text-top-p", "0", "--text-top-p must be in (0, 1]"),
        ("--audio-top-k", "-3", "--audio-top-k must be >= 0"),
        ("--audio-repetition-penalty", "0", "--audio-repetition-penalty must be > 0"),
    ],
)
@pytest.mark.parametrize("cmd", ["synth", "speak"])
def test_sampling_out_of_range(cmd: str, flag: str, value: str, needle: str, tmp_path: Path) -> None:
    text = ["--text", "Hi.", "--out"] if cmd == "synth" else ["Hi.", "--save"]
    r = run(cmd, *text, str(tmp_path / "x.wav"), flag, value, env=NO_ENGINE)
    one_line_error(r, needle, value)


def test_text_over_the_limit_says_what_to_do(tmp_path: Path) -> None:
    from streamtts.constants import MAX_TEXT_CHARS

    long = ("Here is a sentence of a long text. " * (MAX_TEXT_CHARS // 35 + 1))[: MAX_TEXT_CHARS + 1]
    out = str(tmp_path / "x.wav")
    for args, stdin, flag in (
        (["synth", "--text", long, "--out", out], None, "--text"),
        (["speak", long, "--save", out], None, "TEXT"),
        (["speak", "-", "--save", out], long, "stdin"),
    ):
        r = run(*args, env=NO_ENGINE, stdin=stdin)
        one_line_error(r, f"{flag} is {MAX_TEXT_CHARS + 1} characters", f"at most {MAX_TEXT_CHARS}",
                       "split the text", "streamtts say - < text.txt")  # fmt: skip
    # the limit itself passes the checks: the engine is what fails here (no bridge)
    r = run("synth", "--text", long[:MAX_TEXT_CHARS], "--out", out, env=NO_ENGINE)
    assert r.returncode == 2 and "bridge library" in r.stderr and "characters" not in r.stderr, r.stderr


def test_serve_on_a_port_in_use() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run("serve", "--port", str(port), env=NO_ENGINE, timeout=60)
    one_line_error(r, f"port {port} on 127.0.0.1 is in use", "--port 0")


def test_serve_takes_its_port_from_streamtts_port() -> None:
    """The container image sets $STREAMTTS_PORT (its HEALTHCHECK reads the same): without
    --port, serve listens there; a value that is no port is a usage error naming --port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run("serve", env={**NO_ENGINE, "STREAMTTS_PORT": str(port)}, timeout=60)
    one_line_error(r, f"port {port} on 127.0.0.1 is in use")
    r = run("serve", env={**NO_ENGINE, "STREAMTTS_PORT": "eighty"}, timeout=60)
    one_line_error(r, "--port", "'eighty'")


def test_speak_without_a_sound_card_or_save_writes_a_named_file(demo_cache: Path, tmp_path: Path) -> None:
    """The README's first command on a machine without a sound card: it says so before the
    model loads, names the file, writes it, and never overwrites one."""
    if _has_output_device():
        pytest.skip("this machine has an audio output device")
    env = {"STREAMTTS_CACHE": str(demo_cache)}
    (tmp_path / "speak.wav").write_bytes(b"the user's file")
    r = run("speak", "Hello there.", "--n-threads", "1", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    said = "streamtts: no audio output device found (PortAudio reports none): writing the audio to speak-2.wav instead"
    assert lines[0].startswith(said) and "--save FILE" in lines[0], r.stderr
    assert r.stdout.startswith("wrote speak-2.wav: ")
    assert (tmp_path / "speak.wav").read_bytes() == b"the user's file"
    assert (tmp_path / "speak-2.wav").stat().st_size > 1000
    # a device asked for by name is not silently replaced by a file
    r = run("speak", "Hello there.", "--output-device", "nope", env=NO_ENGINE, cwd=tmp_path)
    one_line_error(r, "no audio output device", "--save FILE", "--output-device null")


def test_download_offline_says_what_to_do_and_leaves_no_folder(tmp_path: Path) -> None:
    dest = tmp_path / "new" / "weights"
    r = run("download", "--dest", str(dest), env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_ETAG_TIMEOUT": "5"}, timeout=120)
    from streamtts.convert.download import CODEC_CKPT_REPO, CODEC_REPO, GGUF_REPO

    one_line_error(r, "--from-dir", "hf download", "three repositories", GGUF_REPO, CODEC_REPO, CODEC_CKPT_REPO)
    assert not (tmp_path / "new").exists()


def test_serve_with_a_model_that_does_not_load(demo_cache: Path, tmp_path: Path) -> None:
    """The engine loads before uvicorn starts: a broken GGUF is one line, not uvicorn's
    startup traceback."""
    import yaml

    demo = demo_cache / "demo-model"
    cfg_path = next(demo.glob("*/config.yaml"))
    cfg = yaml.safe_load(cfg_path.read_text())
    for k, v in list(cfg.items()):
        if isinstance(v, str) and (cfg_path.parent / v).exists():
            cfg[k] = str(cfg_path.parent / v)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file" * 300)
    cfg["backbone_gguf"] = str(bad)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    r = run("serve", "--config", str(tmp_path / "config.yaml"), "--port", "0", "--n-threads", "1", timeout=120)
    one_line_error(r, str(bad), "expected a GGUF model")


# -- the examples: the same one-line answers --------------------------------------------------------
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NO_SERVER = "http://127.0.0.1:9"  # nothing listens on the discard port


@pytest.mark.parametrize(
    "args",
    [
        ["ws_client.py", "Hello.", "--server", NO_SERVER],
        ["openai_speech.py", "Hello.", "--server", NO_SERVER],
        ["openai_speech.py", "Hello.", "--server", NO_SERVER, "--sdk"],
        ["llm_stream.py", "--server", NO_SERVER, "--save", "x.wav"],
    ],
    ids=["ws_client", "openai_speech", "openai_speech-sdk", "llm_stream"],
)
def test_example_without_a_server(args: list[str], tmp_path: Path) -> None:
    env = {**os.environ, "OPENAI_MAX_RETRIES": "0"}
    r = subprocess.run([sys.executable, str(EXAMPLES / args[0]), *args[1:]], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=120)  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith(f"{args[0]}: error: cannot reach {NO_SERVER}") and "streamtts serve" in lines[-1]
    assert len(lines) == 1, r.stderr


def test_llm_stream_without_save_or_sound_card(tmp_path: Path) -> None:
    if _has_output_device():
        pytest.skip("this machine has an audio output device")
    env = {k: v for k, v in os.environ.items() if k != "STREAMTTS_OUTPUT_DEVICE"}
    r = subprocess.run([sys.executable, str(EXAMPLES / "llm_stream.py"), "--server", NO_SERVER],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "llm_stream.py: error: no audio output device found (PortAudio reports none); "
        "add --save FILE to write the audio instead"
    )


# -- what a run prints --------------------------------------------------------------------------
def test_synth_prints_one_notice_logs_nothing_and_q_silences_it(demo_cache: Path, tmp_path: Path) -> None:
    env = {"STREAMTTS_CACHE": str(demo_cache)}
    r = run("synth", "--text", "Hello there.", "--out", str(tmp_path / "a.wav"), "--seed", "1", "--n-threads", "1", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"wrote {tmp_path / 'a.wav'}") and len(r.stdout.splitlines()) == 1
    notice = [ln for ln in r.stderr.splitlines() if "demo model" in ln]
    assert len(notice) == 1 and "tones, not words" in notice[0], r.stderr
    assert "info:" not in r.stderr
    q = run("-q", "synth", "--text", "Hello there.", "--out", str(tmp_path / "b.wav"), "--seed", "1", "--n-threads", "1", env=env)
    assert q.returncode == 0 and q.stderr == "" and q.stdout.startswith("wrote"), q.stderr
    v = run("synth", "--text", "Hello there.", "--out", str(tmp_path / "c.wav"), "-v", "--n-threads", "1", env=env)
    assert v.returncode == 0 and "streamtts: info: " in v.stderr and "info:" not in v.stdout


def test_speak_with_save_and_no_sound_card(demo_cache: Path, tmp_path: Path) -> None:
    if _has_output_device():
        pytest.skip("this machine has an audio output device")
    out = tmp_path / "said.wav"
    r = run("speak", "Hello there.", "--save", str(out), "--n-threads", "1", env={"STREAMTTS_CACHE": str(demo_cache)})
    assert r.returncode == 0, r.stderr
    said = [ln for ln in r.stderr.splitlines() if "writing" in ln]
    assert said == [f"streamtts: no audio output device found (PortAudio reports none): writing {out} only"], r.stderr
    assert "--save" not in r.stderr and out.stat().st_size > 1000


def test_speak_to_the_null_device_plays_in_real_time(demo_cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "played.wav"
    r = run("speak", "Hello.", "--output-device", "null", "--save", str(out), "--n-threads", "1", "--seed", "2",
            env={"STREAMTTS_CACHE": str(demo_cache)})  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "played" in r.stderr and out.stat().st_size > 1000


def test_convert_and_build_engine_use_the_demo_model_without_config(demo_cache: Path, tmp_path: Path) -> None:
    env = {"STREAMTTS_CACHE": str(demo_cache)}
    r = run("convert", "--out", str(tmp_path / "fused.gguf"), env=env)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "fused.gguf").stat().st_size > 0 and "demo model" in r.stderr
    # no config of the user's to edit: it is not asked to add a line to one
    assert "add to your config" not in r.stdout and "the demo model needs none of this" in r.stdout
    r = run("build-engine", "--dry-run", env=env)
    assert r.returncode == 0 and "demo model" in r.stderr, r.stderr


# -- --help ---------------------------------------------------------------------------------------
def test_help_shows_defaults() -> None:
    r = run("synth", "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "(default: out.wav)" in text and "-q, --quiet" in text and "-v, --verbose" in text
    assert "(default: None)" not in text and "(default: False)" not in text


def test_every_option_of_every_command_has_help_text() -> None:
    from streamtts.cli.main import build_parser

    parser = build_parser()
    missing = [
        f"streamtts {cmd} {'/'.join(a.option_strings) or a.dest}"
        for cmd, p in parser.commands.items()
        for a in p._actions
        if not a.help
    ]
    assert not missing, f"options without help text (add help=...): {missing}"


def _has_output_device() -> bool:
    try:
        from streamtts.audio.devices import resolve_output_device

        resolve_output_device(None)
    except Exception:
        return False
    return True


def test_pipecat_example_without_pipecat_names_the_extra(tmp_path: Path) -> None:
    """Pipecat not installed (hidden here by a module that fails to import, as a missing one
    does): one line naming the extra, not loguru's traceback."""
    hide = tmp_path / "hide"
    hide.mkdir()
    for name in ("loguru", "pipecat"):
        (hide / f"{name}.py").write_text(f'raise ModuleNotFoundError("No module named {name}", name="{name}")\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hide), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, str(EXAMPLES / "pipecat_agent.py"), "--server", NO_SERVER],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip() == "pipecat_agent.py: error: loguru is missing: pip install 'streamtts[pipecat]'"
