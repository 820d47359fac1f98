"""Choosing the llama.cpp build (STREAMTTS_BACKEND, the config key ``backend``) and its bad
inputs: a build or a device that is missing gives one line naming it and how to get it; a
model larger than the device's memory is our error, with nothing left loaded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamtts.config import EngineConfig
from streamtts.errors import ConfigError, NativeLibraryError
from streamtts.model import _llama, backend

REPO = Path(__file__).resolve().parents[2]


def _child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("STREAMTTS_BRIDGE_LIB", "STREAMTTS_CUDA", "STREAMTTS_BACKEND")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def _error_lines(stderr: str) -> list[str]:
    """The error's lines: after "streamtts: error:", up to the end (warnings come before)."""
    lines = stderr.splitlines()
    first = next((i for i, ln in enumerate(lines) if ln.startswith("streamtts: error:")), len(lines))
    return [ln for ln in lines[first:] if ln.strip()]


def _synth(model: Path, tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamtts", "synth", "--config", str(model / "config.yaml"),
         "--text", "Hi.", "--out", str(tmp / "x.wav")],
        env=_child_env(**env), capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_vulkan_asked_without_the_build_names_the_build_command(demo_model_dir: Path, tmp_path: Path) -> None:
    r = _synth(demo_model_dir, tmp_path, STREAMTTS_BACKEND="vulkan", STREAMTTS_CACHE=str(tmp_path / "empty"))
    assert r.returncode == 2
    lines = _error_lines(r.stderr)
    assert len(lines) == 1, r.stderr
    assert "vulkan build of the llama.cpp bridge is missing" in lines[0]
    assert "STREAMTTS_VULKAN=1 bash native/build.sh" in lines[0]


def test_vulkan_asked_without_a_device_says_so(demo_model_dir: Path, tmp_path: Path) -> None:
    if not _llama._variant_lib("vulkan").is_file():
        pytest.skip("needs the Vulkan build (STREAMTTS_VULKAN=1 bash native/build.sh)")
    empty = tmp_path / "no-icd.json"  # the loader reads no driver from a missing file
    r = _synth(demo_model_dir, tmp_path, STREAMTTS_BACKEND="vulkan", VK_ICD_FILENAMES=str(empty), VK_DRIVER_FILES=str(empty))
    assert r.returncode == 2
    lines = _error_lines(r.stderr)
    assert len(lines) == 1 and "no Vulkan device" in lines[0], r.stderr


def test_model_larger_than_the_device_memory_is_our_error_and_nothing_stays_loaded(demo_model_dir: Path, tmp_path: Path) -> None:
    """The device's buffers capped at 64 KiB (llama.cpp's own knobs, read when its Vulkan
    device starts; lavapipe's memory is the host's): the KV cache cannot be placed, llama.cpp's
    error becomes ours, and the engine has nothing loaded afterwards."""
    if not _llama._variant_lib("vulkan").is_file():
        pytest.skip("needs the Vulkan build (STREAMTTS_VULKAN=1 bash native/build.sh)")
    code = (
        "import asyncio, sys\n"
        "from streamtts import Engine\n"
        "from streamtts.errors import DeviceMemoryError\n"
        "e = Engine.from_config(sys.argv[1], n_gpu_layers=-1, warmup=False)\n"
        "try:\n"
        "    asyncio.run(e.start())\n"
        "except DeviceMemoryError as exc:\n"
        "    print('ERR', exc)\n"
        "print('LOADED', e._backbone is not None)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(demo_model_dir / "config.yaml")],
        env=_child_env(STREAMTTS_BACKEND="vulkan", GGML_VK_FORCE_MAX_ALLOCATION_SIZE="65536", GGML_VK_FORCE_MAX_BUFFER_SIZE="65536"),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    err = next(ln for ln in r.stdout.splitlines() if ln.startswith("ERR"))
    assert "does not fit in the device's memory" in err and "n_gpu_layers" in err, err
    assert "LOADED False" in r.stdout


def test_backend_names_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="backend must be 'auto', 'cpu', 'cuda' or 'vulkan', got 'metal'"):
        EngineConfig(backend="metal").validate()
    monkeypatch.setenv("STREAMTTS_BACKEND", "opencl")
    with pytest.raises(ConfigError, match="STREAMTTS_BACKEND must be one of auto, cpu, cuda, vulkan, got 'opencl'"):
        backend.wanted()


def test_the_variable_wins_over_the_key_and_auto_lists_every_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMTTS_BRIDGE_LIB", raising=False)
    monkeypatch.delenv("STREAMTTS_CUDA", raising=False)
    monkeypatch.setattr(backend, "_configured", "")
    monkeypatch.delenv("STREAMTTS_BACKEND", raising=False)
    assert backend.wanted() == ("auto", "auto")
    assert [v for v, _ in _llama.candidate_paths()] == ["cuda", "vulkan", "cpu"]
    backend.request("cpu")
    assert [v for v, _ in _llama.candidate_paths()] == ["cpu"]
    monkeypatch.setenv("STREAMTTS_BACKEND", "vulkan")
    assert backend.wanted() == ("vulkan", "STREAMTTS_BACKEND=vulkan")
    monkeypatch.delenv("STREAMTTS_BACKEND")
    monkeypatch.setattr(backend, "_configured", "")
    monkeypatch.setenv("STREAMTTS_CUDA", "0")  # the older variable still works
    assert backend.wanted() == ("cpu", "STREAMTTS_CUDA=0")


def test_a_loaded_build_is_not_replaced_in_the_same_process(bridge_lib: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMTTS_BACKEND", raising=False)
    monkeypatch.setattr(backend, "_configured", "")
    other = "vulkan" if _llama.loaded_backend() != "vulkan" else "cpu"
    with pytest.raises(NativeLibraryError, match=f"backend: {other}, but this process already loaded the"):
        _llama.use_backend(other)
    _llama.use_backend("auto")  # auto takes whatever is loaded


def test_the_package_build_comes_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A pip install's libraries (streamtts/lib, variant.txt naming their variant) are tried
    before the cache's builds, when the backend asked for is theirs (or auto)."""
    monkeypatch.delenv("STREAMTTS_BRIDGE_LIB", raising=False)
    monkeypatch.delenv("STREAMTTS_CUDA", raising=False)
    monkeypatch.delenv("STREAMTTS_BACKEND", raising=False)
    monkeypatch.setattr(backend, "_configured", "")
    monkeypatch.setattr(_llama, "PACKAGE_LIB_DIR", tmp_path)
    assert _llama.package_lib() is None  # an editable install: the cache only
    (tmp_path / _llama.BRIDGE_NAME).write_bytes(b"")
    (tmp_path / "variant.txt").write_text("cpu\n")
    paths = _llama.candidate_paths()
    assert paths[0] == ("cpu", tmp_path / _llama.BRIDGE_NAME)
    assert [v for v, _ in paths[1:]] == ["cuda", "vulkan", "cpu"]
    backend.request("cpu")
    assert _llama.candidate_paths()[0] == ("cpu", tmp_path / _llama.BRIDGE_NAME)
    backend.request("cuda")  # the package holds a CPU build: the cache's CUDA build only
    assert [v for v, _ in _llama.candidate_paths()] == ["cuda"]
