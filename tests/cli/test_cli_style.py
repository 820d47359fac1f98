"""One message style (issue 40, item 8): every line a command prints on stderr is
``streamtts: ...``, warnings ``streamtts: warning: ...``, on a terminal and off it, and from
the Python API's logging alike; a mistyped config key is one warning with the key meant; a
mistyped option is named as such; ``--version``; each default shown once in ``--help``; the
advice of the errors fits the command that gave it.

Commands run as real ``python -m streamtts`` processes (a terminal is a real pty).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from streamtts.cli.main import build_parser


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "streamtts", *args], capture_output=True, text=True,
        env={**os.environ, "COLUMNS": "100", **(env or {})}, timeout=timeout, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def on_a_terminal(*args: str) -> tuple[int, str]:
    """Run with stderr on a pty (stdout a pipe); returns (exit status, what the terminal got)."""
    from conftest import on_a_terminal as run_on_a_terminal

    return run_on_a_terminal([sys.executable, "-m", "streamtts", *args], {**os.environ, "COLUMNS": "100"})


@pytest.fixture(scope="module")
def typo_config(demo_model_dir: Path, bridge_lib: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model's config with one key mistyped (max_stream)."""
    text = (demo_model_dir / "config.yaml").read_text()
    path = demo_model_dir / "typo.yaml"  # beside it: its paths are relative to the folder
    path.write_text(text + "\nmax_stream: 2\n")
    return path


WARNED = "ignoring unknown config keys: max_stream (did you mean max_streams?)"


def test_a_mistyped_config_key_is_one_warning_with_the_key_meant(typo_config: Path, tmp_path: Path) -> None:
    r = run("synth", "--config", str(typo_config), "--text", "Hello there.", "--out", str(tmp_path / "a.wav"),
            "--n-threads", "1", "-v")  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert [ln for ln in lines if WARNED in ln] == [f"streamtts: warning: {typo_config}: {WARNED}"], r.stderr
    assert all(ln.startswith("streamtts: ") for ln in lines), r.stderr  # -v: info lines too
    assert any(ln.startswith("streamtts: info: ") for ln in lines)
    assert any(ln.startswith("streamtts: info: engine ready: MOSS-TTS 1.0 (moss-tts)") for ln in lines), r.stderr


def test_lines_on_a_terminal_have_the_same_style(typo_config: Path, tmp_path: Path) -> None:
    rc, text = on_a_terminal("synth", "--config", str(typo_config), "--text", "Hello there.",
                             "--out", str(tmp_path / "a.wav"), "--n-threads", "1")  # fmt: skip
    assert rc == 0, text
    # the lines that stay (a progress bar is drawn with escapes, then erased)
    lines = [ln for ln in text.splitlines() if ln.strip() and "\x1b" not in ln]
    assert f"streamtts: warning: {typo_config}: {WARNED}" in lines, text
    assert all(ln.startswith("streamtts: ") for ln in lines), text


def test_the_python_api_warns_in_the_same_style(typo_config: Path) -> None:
    code = f"from streamtts.config import load_config; load_config({str(typo_config)!r})"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [f"streamtts: warning: {typo_config}: {WARNED}"]
    # a program with logging of its own: its handlers print the record, ours stays quiet
    code = "import logging; logging.basicConfig(format='app %(levelname)s %(message)s'); " + code
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stderr.splitlines() == [f"app WARNING {typo_config}: {WARNED}"]


def test_a_mistyped_option_is_named_before_what_it_left_out() -> None:
    r = run("synth", "--txt", "Hello there.")
    assert r.returncode == 2
    assert r.stderr.startswith("streamtts: error: unrecognized arguments: --txt; did you mean --text?"), r.stderr


def test_version() -> None:
    from streamtts import __version__

    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"streamtts {__version__}"


def test_help_shows_each_default_once() -> None:
    parser = build_parser()
    twice = []
    for name, sub in parser.commands.items():
        for action in sub._actions:
            text = " ".join(sub._get_formatter()._format_action(action).split())
            shown = re.search(r"\(default: [^()]*\)$", text)  # what the formatter adds
            if shown and re.search(r"\bdefault\b", text[: shown.start()]):  # the help said it
                twice.append(f"{name} {'/'.join(action.option_strings) or action.dest}: {text}")
    assert not twice, "\n".join(twice)


def test_convert_hf_offline_gives_its_own_advice(tmp_path: Path) -> None:
    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_ETAG_TIMEOUT": "5", "STREAMTTS_CACHE": str(tmp_path)}
    r = run("convert-hf", "OpenMOSS-Team/MOSS-TTS", "--out", str(tmp_path / "out"), env=env, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert "hf download OpenMOSS-Team/MOSS-TTS --local-dir DIR" in line and "streamtts convert-hf DIR" in line
    assert "streamtts download" not in line, line


def test_build_engine_without_tensorrt_says_it_needs_an_nvidia_gpu(
    demo_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamtts.cli.main import main

    monkeypatch.setitem(sys.modules, "tensorrt", None)  # as where it is not installed
    onnx = demo_model_dir / "MOSS-Audio-Tokenizer-ONNX" / "decoder.onnx"
    assert main(["build-engine", "--onnx", str(onnx), "--out", str(tmp_path / "x.engine")]) == 2
    err = capsys.readouterr().err
    assert "runs on an NVIDIA GPU" in err and "pip install tensorrt" in err, err


# -- family fields, before the model loads (issue 40, item 6) -------------------------------------
NO_ENGINE = {"STREAMTTS_BRIDGE_LIB": "/nonexistent/libstreamtts_bridge.so"}


def _before_load(r: Any) -> list[str]:
    """The lines said before the model would have loaded (the missing bridge fails it)."""
    lines = r.stderr.splitlines()
    assert "bridge library is not built" in lines[-1], r.stderr  # it got that far, no further
    return lines[:-1]


@pytest.mark.parametrize(
    "flags,said",
    [
        (["--instruction", "Speak slowly."],
         "streamtts: warning: --instruction: MOSS-TTS 1.0 (moss-tts) does not read this field: its model card's "
         "fields are the text and --reference, --language"),
        (["--language", "englsh"],
         "streamtts: warning: --language englsh: not a language streamtts knows; sent as given (did you mean English (en)?)"),
        (["--language", "klingon"], "streamtts: warning: --language klingon: not a language streamtts knows; sent as given (known: English (en), "),
    ],
    ids=["instruction", "englsh", "klingon"],
)  # fmt: skip
def test_a_field_the_member_does_not_read_is_a_warning_before_the_load(
    typo_config: Path, tmp_path: Path, flags: list[str], said: str
) -> None:
    config = typo_config.with_name("config.yaml")
    r = run("synth", "--config", str(config), "--text", "Hello there.", *flags, "--out", str(tmp_path / "x.wav"), env=NO_ENGINE)
    assert r.returncode == 2
    lines = [ln for ln in _before_load(r) if ln.startswith("streamtts: warning:") and "cores are busy" not in ln]
    assert len(lines) == 1 and lines[0].startswith(said), r.stderr


@pytest.mark.parametrize(
    "flags,text,needle",
    [
        (["--language", ""], "Hello there.", "--language '': language is empty"),
        (["--speaker", "S1={clip}"], "[S1] Hi. [S2] Hello.", "--speaker: the text has the speaker tag [S2] but no voice"),
        (["--scene", "A park."], "Hello there.", "--scene: scene: not a field of the prompt template 'moss'"),
    ],
    ids=["blank-language", "speaker-tags", "template-field"],
)
def test_errors_that_need_no_model_come_before_it(
    typo_config: Path, voice_wav: Path, tmp_path: Path, flags: list[str], text: str, needle: str
) -> None:
    config = typo_config.with_name("config.yaml")
    flags = [f.format(clip=voice_wav) for f in flags]
    r = run("synth", "--config", str(config), "--text", text, *flags, "--out", str(tmp_path / "x.wav"), env=NO_ENGINE)
    assert r.returncode == 2 and "bridge" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(f"streamtts: error: {needle}"), r.stderr


def test_package_main_runs_the_command_after_its_submodule_is_imported(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`import streamtts.cli.main` rebinds the package's `main` to that module: still callable."""
    import importlib

    from streamtts import cli

    importlib.import_module("streamtts.cli.main")
    with pytest.raises(SystemExit) as exit_:  # argparse's --version exits
        cli.main(["--version"])
    assert exit_.value.code == 0 and "streamtts" in capsys.readouterr().out
