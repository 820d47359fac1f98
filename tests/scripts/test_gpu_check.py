"""scripts/gpu_check.sh: the lease kit (--make-kit) and its offline rehearsal (--dry-run-cpu --kit).

The rehearsal runs the GPU check's whole pipeline on a tiny model on CPU with no network
(unshare -n), from the kit alone: the llama.cpp build from the kit's trimmed source (cached
by the source's hash, so only the first run on a machine compiles), the kit's wheels in a
scratch folder, and a Python that imports from its environment only what the GPU image has.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
KIT_TOOL = REPO / "scripts" / "gpu_kit.py"
LIMIT = 60 << 20


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kit made the way the docs say (downloads two wheels per Python from PyPI)."""
    out = tmp_path_factory.mktemp("kit") / "kit"
    env = dict(os.environ, PYTHON=sys.executable)
    res = subprocess.run(
        ["bash", str(SCRIPT), "--make-kit", str(out)],
        capture_output=True, text=True, timeout=600, env=env, cwd=REPO,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return out


def _offline_prefix() -> list[str]:
    """unshare -n (root), else in a user namespace; the rehearsal must not run with a network."""
    for cmd in (["unshare", "-n"], ["unshare", "-rn"]):
        try:
            ok = subprocess.run([*cmd, "true"], capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.SubprocessError):
            ok = False
        if ok:
            return cmd
    pytest.fail("neither `unshare -n` nor `unshare -rn` works here: the offline rehearsal needs one")


def test_the_kit_fits_and_its_manifest_lists_every_file_with_a_reason(kit: Path) -> None:
    files = {p.relative_to(kit).as_posix(): p.stat().st_size for p in kit.rglob("*") if p.is_file()}
    assert sum(files.values()) <= LIMIT, files
    manifest = json.loads((kit / "manifest.json").read_text())
    listed = {e["path"]: e for e in manifest["files"]}
    assert set(listed) == set(files) - {"manifest.json"}
    assert all(e["why"] and e["bytes"] == files[p] for p, e in listed.items())
    # every pinned package has a wheel the GPU image's Python 3.12 can install, and one for
    # the Python that made the kit (the rehearsal's)
    here = f"cp{sys.version_info.major}{sys.version_info.minor}"
    for pin in manifest["pins"]:
        name = pin.split("==")[0].replace("-", "_")
        tags = [w.split("-")[2:4] for w in listed if w.startswith(f"wheels/{name}-")]
        for py in ("cp312", here):
            assert any(t[0] in (py, "py3", "py2.py3") or t[1] == "abi3" for t in tags), (pin, py, tags)
    # the source: what CMake needs for the CPU and CUDA backends, none of the bulk
    with tarfile.open(kit / "llama.cpp-src.tar.xz") as tar:
        names = set(tar.getnames())
    for need in ("CMakeLists.txt", "include/llama.h", "ggml/src/ggml-cuda/CMakeLists.txt",
                 "ggml/src/ggml-cpu/CMakeLists.txt", "ggml/src/ggml.c", "src/llama.cpp"):  # fmt: skip
        assert f"llama.cpp/{need}" in names, need
    tops = {n.split("/")[1] for n in names if n.count("/") >= 2}
    assert not tops & {"models", "docs", "tests", "examples", "tools", "common"}, tops
    assert not any(n.startswith("llama.cpp/ggml/src/ggml-vulkan/") for n in names)


def test_every_header_the_cuda_sources_include_is_in_the_kit(kit: Path, tmp_path: Path) -> None:
    """No nvcc here: the CUDA build itself runs only on the GPU machine. What can be checked is
    that every quoted #include of ggml-cuda resolves inside the trimmed tree (as nvcc's -I
    paths do: the file's folder, ggml-cuda, ggml/src, ggml/include)."""
    with tarfile.open(kit / "llama.cpp-src.tar.xz") as tar:
        tar.extractall(tmp_path, filter="data")
    root = tmp_path / "llama.cpp"
    cuda = root / "ggml" / "src" / "ggml-cuda"
    dirs = [cuda, root / "ggml" / "src", root / "ggml" / "include"]
    sources = [f for f in cuda.rglob("*") if f.suffix in (".cu", ".cuh", ".h", ".cpp")]
    assert len(sources) > 100
    missing = set()
    for f in sources:
        for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', f.read_text(errors="replace"), re.M):
            if not any((d / inc).is_file() for d in (f.parent, *dirs)):
                missing.add(inc)
    # ggml-musa/ is Moore Threads' backend (#if defined(GGML_USE_MUSA)), not built for CUDA
    assert missing <= {"ggml-musa/mudnn.cuh"}, missing


def test_a_kit_that_differs_from_its_manifest_is_refused(kit: Path, tmp_path: Path) -> None:
    bad = tmp_path / "kit"
    shutil.copytree(kit, bad)
    (bad / "wheels" / "stray-1.0-py3-none-any.whl").write_bytes(b"x")
    wheel = next(p for p in (bad / "wheels").iterdir() if p.name.startswith("gguf-"))
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    res = subprocess.run([sys.executable, str(KIT_TOOL), "check", str(bad)], capture_output=True, text=True)
    assert res.returncode != 0
    assert "stray-1.0-py3-none-any.whl: in the folder, not in the manifest" in res.stderr
    assert f"wheels/{wheel.name}: size or sha256 differs" in res.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    res = subprocess.run([sys.executable, str(KIT_TOOL), "check", str(empty)], capture_output=True, text=True)
    assert res.returncode != 0 and "manifest.json missing" in res.stderr


@pytest.mark.slow
def test_the_offline_rehearsal_runs_the_whole_pipeline_from_the_kit_alone(kit: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    logs = tmp_path / "logs"
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("OUT", None)
    res = subprocess.run(
        [*_offline_prefix(), "bash", str(SCRIPT), "--dry-run-cpu", "--kit", str(kit),
         "--work", str(work), "--logs", str(logs)],
        capture_output=True, text=True, timeout=1200, env=env, cwd=REPO,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    out = res.stdout
    for needle in (
        "kit ok: ",
        "bare llama.cpp step, fused GGUF",
        "bare llama.cpp step, original GGUF",
        "engine 1 stream, fused: TTFA p50",
        "(logits lent)",
        "engine 1 stream, numpy heads",
        "bench concurrency   1",
        "bench concurrency   2",
        "bench joining   2",
        "load: capacity found",
        "load probe (hard cap's rate)",
        "load 2x ",
        "bench real codec   2",
        "bench null backbone (CPU side)   4",
        "bench null backbone + codec (the tick alone)   4",
        "  the same, --tick-threads 1   4",
        "RSS memory per stream",
        "(kernel ",
        "targets",
        "pytest -m gpu",
        "(fused: 32802 output rows)",
    ):
        assert needle in out, needle + "\n" + out
    assert "not measured" not in out, out
    # the table is the last thing printed, and it is in the logs folder with the JSON
    assert out.rstrip().splitlines()[-1].startswith("targets "), out[-2000:]
    assert (logs / "table.txt").read_text().strip() in out
    result = json.loads((logs / "gpu-check.json").read_text())
    assert result["bench_null"]
    # the load stage: streams offered at twice the capacity the engine found, all answered
    top = result["load"]["levels"][-1]
    assert top["load"] == 2.0 and top["sessions"] == top["done"] + top["refused"] > 0, top
    # llama.cpp was built from the kit's source; the kit's msgspec was the one imported
    kit_log = (work / "kit.log").read_text()
    assert f"{work / 'site'}/msgspec/" in kit_log, kit_log
    build_log = (work / "build.log").read_text()
    assert "kit-llama-" in build_log, build_log[-2000:]
    # and its Python could not have used anything else the image lacks
    probe = subprocess.run(
        [sys.executable, "-c", "import soxr"], capture_output=True, text=True,
        env=dict(os.environ, PYTHONPATH=f"{work / 'site'}:{REPO}"),
    )  # fmt: skip
    assert probe.returncode != 0 and "is not in the GPU image and not in the kit" in probe.stderr
