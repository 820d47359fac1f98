"""The public names users import and the commands they type stay where they are.

Moving a module is an internal matter; these names are not (the websockets library
keeps the same kind of test for its public API).
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import streamtts
from streamtts.errors import StreamTTSError

PUBLIC = [
    ("streamtts", "Engine"),
    ("streamtts", "EngineConfig"),
    ("streamtts", "SamplingParams"),
    ("streamtts", "AudioChunk"),
    ("streamtts", "load_config"),
    ("streamtts.engine", "Engine"),
    ("streamtts.engine", "AudioStream"),
    ("streamtts.engine", "AudioChunk"),
    ("streamtts.engine", "Voice"),
    ("streamtts.request", "StreamOptions"),
    ("streamtts.request", "AudioChunk"),
    ("streamtts.request", "Voice"),
    ("streamtts.config", "SamplingParams"),
    ("streamtts.config", "EngineConfig"),
    ("streamtts.config", "load_config"),
    ("streamtts.sync", "SyncEngine"),
    ("streamtts.client", "StreamClient"),
    ("streamtts.client", "ServerError"),
    ("streamtts.errors", "StreamTTSError"),
]

COMMANDS = ["synth", "speak", "demo-model", "bench", "serve", "say", "convert", "build-engine", "download"]


@pytest.mark.parametrize(("module", "name"), PUBLIC)
def test_public_name(module: str, name: str) -> None:
    assert hasattr(importlib.import_module(module), name), f"{module}.{name} is gone"


def test_top_level_all_is_importable() -> None:
    for name in streamtts.__all__:
        assert getattr(streamtts, name) is not None


def test_import_streamtts_stays_light() -> None:
    """`import streamtts` loads neither llama.cpp's bridge nor ONNX Runtime."""
    code = "import sys, streamtts; print(sorted(m for m in ('onnxruntime', 'streamtts.model._llama') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_console_script_and_every_subcommand() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "streamtts", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for cmd in COMMANDS:
        assert cmd in out, f"`streamtts {cmd}` is missing from the usage"
        sub = subprocess.run(
            [sys.executable, "-m", "streamtts", cmd, "--help"], capture_output=True, text=True
        )
        assert sub.returncode == 0 and sub.stdout.startswith("usage: streamtts " + cmd), sub.stderr
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["streamtts"] == "streamtts.cli:main"


def test_every_exception_class_is_in_the_tree() -> None:
    """An exception class defined anywhere in the package derives from StreamTTSError."""
    pkg = Path(streamtts.__file__).parent
    stray = []
    for path in pkg.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
            if bases & {"Exception", "ValueError", "RuntimeError", "OSError", "KeyError", "TypeError"}:
                rel = path.relative_to(pkg.parent).with_suffix("")
                mod = importlib.import_module(".".join(rel.parts))
                cls = getattr(mod, node.name)
                if not issubclass(cls, StreamTTSError):
                    stray.append(f"{rel}.{node.name}")
    assert not stray, f"exception classes outside the StreamTTSError tree: {stray}"
