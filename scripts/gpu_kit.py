"""The GPU lease kit: what a run of scripts/gpu_check.sh needs that the GPU machine's image lacks.

The lent GPU machine has no network and takes at most 64 MiB of files per command, so the
kit holds only what cannot be made there: a trimmed llama.cpp source (what its CMake reads
for the CPU and CUDA builds of libllama) and the wheels of the Python packages the run
imports that the image has not. Models are generated there (streamtts/demo/random_quant.py).

    python3 scripts/gpu_kit.py make DIR       write the kit (needs PyPI; run by --make-kit)
    python3 scripts/gpu_kit.py check DIR      sizes and sha256 against DIR/manifest.json
    python3 scripts/gpu_kit.py install DIR T  the kit's wheels for this Python into T (offline)
    python3 scripts/gpu_kit.py llama-src DIR ROOT
                                              unpack the source into ROOT/kit-llama-<sha>/ (once)
                                              and print that folder
    python3 scripts/gpu_kit.py guard T        write T/sitecustomize.py: a Python that imports,
                                              from its own site-packages, only what the image has

Standard library only: it runs under the image's python3 before anything is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
IMAGE_PACKAGES = HERE / "gpu_image_packages.txt"
LIMIT_BYTES = 60 << 20
CARRY_LIMIT = 64 << 20  # what one device command takes: the working tree and the kit together
IMAGE_PYTHON = "3.12"
MANIFEST = "manifest.json"
SOURCE_NAME = "llama.cpp-src.tar.xz"

# Distributions the run imports that the image lacks: (name, why). Versions are the ones
# installed where the kit is made (what this project's tests ran with). The list is checked
# by the offline rehearsal: its Python hides every package the image has not (`guard`).
WHEELS = [
    ("msgspec", "typed config and messages (streamtts.config, request, core.tokens)"),
    ("gguf", "writing the random 8B GGUF and the fused-heads GGUF (demo/random_quant, convert/fused_writer)"),
]
# Not carried: soxr and soundfile (imported only to read reference voices and write audio
# files, which the run does not), the server's websockets/starlette/uvicorn/python-multipart,
# av (36 MB; output formats), onnxruntime-gpu and TensorRT (far over the 64 MiB a lease takes).
# llama.cpp paths the CMake build of libllama reads (CPU and CUDA); everything else
# (models 75 MB, docs 38 MB, tools, tests, examples, other ggml backends) stays out.
SOURCE_KEEP = [
    "CMakeLists.txt", "LICENSE", "cmake", "include", "src", "vendor",
    "ggml/CMakeLists.txt", "ggml/cmake", "ggml/include", "ggml/src/CMakeLists.txt",
    "ggml/src/ggml-cpu", "ggml/src/ggml-cuda",
]  # fmt: skip
SOURCE_DROP = ["vendor/cpp-httplib"]  # only for llama.cpp's common/ (LLAMA_BUILD_COMMON=OFF)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _llama_cpp_python_version() -> str:
    text = (REPO / "cmake" / "llama_source.cmake").read_text(encoding="utf-8")
    m = re.search(r'^set\(STREAMTTS_LLAMA_CPP_PYTHON_VERSION "([^"]+)"\)$', text, re.M)
    if not m:
        raise SystemExit("error: cmake/llama_source.cmake has no STREAMTTS_LLAMA_CPP_PYTHON_VERSION")
    return m.group(1)


def _cache_root() -> Path:
    env = os.environ.get("STREAMTTS_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "streamtts"


def llama_source() -> Path:
    """The llama.cpp tree native/build.sh uses (the llama-cpp-python sdist), fetched if missing."""
    if os.environ.get("LLAMA_CPP_DIR"):
        src = Path(os.environ["LLAMA_CPP_DIR"])
    else:
        ver = _llama_cpp_python_version()
        src = _cache_root() / "native" / "src" / f"llama_cpp_python-{ver}" / "vendor" / "llama.cpp"
        if not (src / "include" / "llama.h").is_file():
            # build.sh's step 1 downloads and unpacks it; --configure-only stops before compiling
            subprocess.run(["bash", str(REPO / "native" / "build.sh"), "--configure-only"], check=True)
    if not (src / "include" / "llama.h").is_file():
        raise SystemExit(f"error: no llama.cpp source at {src} (include/llama.h missing)")
    return src


def _kept(rel: str) -> bool:
    if any(rel == d or rel.startswith(d + "/") for d in SOURCE_DROP):
        return False
    return any(rel == k or rel.startswith(k + "/") for k in SOURCE_KEEP) or (
        # ggml/src's own files (not the other backends' folders)
        rel.startswith("ggml/src/") and rel.count("/") == 2
    )


def write_source_tarball(src: Path, out: Path) -> int:
    """A deterministic .tar.xz of the kept files (same tree, same bytes: its sha256 keys caches)."""
    files = sorted(
        p.relative_to(src).as_posix()
        for p in src.rglob("*")
        if p.is_file() and not p.is_symlink() and _kept(p.relative_to(src).as_posix())
    )
    with tarfile.open(out, "w:xz", format=tarfile.PAX_FORMAT, preset=9) as tar:
        for rel in files:
            data = (src / rel).read_bytes()
            info = tarfile.TarInfo(f"llama.cpp/{rel}")
            info.size = len(data)
            info.mtime = 0
            info.mode = 0o755 if os.access(src / rel, os.X_OK) else 0o644
            tar.addfile(info, io.BytesIO(data))
    return len(files)


def _installed_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        raise SystemExit(
            f"error: {name} is not installed in {sys.executable}: the kit pins what is "
            "installed here (run with the project's venv, e.g. PYTHON=.venv/bin/python)"
        ) from None


def _download(pins: list[str], py: str, dest: Path) -> None:
    cmd = [
        sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
        "--no-deps", "--only-binary", ":all:", "--python-version", py, "--implementation", "cp",
        "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
        "--platform", "manylinux_2_27_x86_64", "--platform", "manylinux_2_28_x86_64",
        "--platform", "manylinux1_x86_64", "--platform", "manylinux_2_5_x86_64",
        "-d", str(dest), *pins,
    ]  # fmt: skip
    subprocess.run(cmd, check=True)


def _wheel_tag_python(name: str) -> str:
    # name-version(-build)?-python-abi-platform.whl
    parts = name[: -len(".whl")].split("-")
    return f"{parts[-3]}-{parts[-2]}"


def _v(ver: str) -> tuple[int, ...]:
    return tuple(int(x) for x in ver.split("."))


def _for_whom(tag: str, here_py: str) -> str:
    """Which Pythons of the run take a wheel of this python-abi tag."""
    py, abi = tag.split("-")
    if py.startswith("py"):
        return "pure Python: the GPU image and the rehearsal"
    ver = f"{py[2]}.{py[3:]}"
    if abi == "abi3":
        return f"Python >= {ver} (the GPU image's {IMAGE_PYTHON}{' and the rehearsal' if _v(here_py) >= _v(ver) else ''})"
    who = [w for w, v in (("the GPU image", IMAGE_PYTHON), ("the offline rehearsal here", here_py)) if v == ver]
    return f"Python {ver} ({' and '.join(who) or 'unused'})"


def make(kit: Path) -> dict:
    if kit.exists() and any(kit.iterdir()):
        raise SystemExit(f"error: {kit} exists and is not empty (give a new folder)")
    kit.mkdir(parents=True, exist_ok=True)
    entries: list[dict] = []
    src = llama_source()
    tar = kit / SOURCE_NAME
    n = write_source_tarball(src, tar)
    ver = _llama_cpp_python_version()
    entries.append({
        "path": SOURCE_NAME,
        "why": f"llama.cpp source ({n} files) from the llama-cpp-python {ver} sdist that "
        "native/build.sh builds, trimmed to what CMake reads for libllama (CPU and CUDA "
        "backends): no models, docs, tests, examples, tools or other ggml backends",
    })  # fmt: skip
    pins = [f"{name}=={_installed_version(name)}" for name, _ in WHEELS]
    wheels = kit / "wheels"
    wheels.mkdir()
    here_py = f"{sys.version_info.major}.{sys.version_info.minor}"
    pythons = [IMAGE_PYTHON] + ([here_py] if here_py != IMAGE_PYTHON else [])
    for py in pythons:
        _download(pins, py, wheels)
    why = dict(WHEELS)
    for w in sorted(wheels.iterdir()):
        dist = w.name.split("-")[0].replace("_", "-").lower()
        entries.append({
            "path": f"wheels/{w.name}",
            "why": f"{why.get(dist, dist)}; {_for_whom(_wheel_tag_python(w.name), here_py)}",
        })
    for e in entries:
        p = kit / e["path"]
        e["bytes"] = p.stat().st_size
        e["sha256"] = _sha256(p)
    manifest = {
        "what": "scripts/gpu_check.sh --kit: everything the GPU run needs that the image lacks",
        "image_python": IMAGE_PYTHON,
        "pythons": pythons,
        "wheels": [p.split("==")[0] for p in pins],
        "pins": pins,
        "llama_cpp_python": ver,
        "limit_bytes": LIMIT_BYTES,
        "files": entries,
    }
    total = sum(e["bytes"] for e in entries)
    manifest["total_bytes"] = total
    (kit / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    total += (kit / MANIFEST).stat().st_size
    if total > LIMIT_BYTES:
        raise SystemExit(f"error: the kit is {total / 2**20:.1f} MiB, over its {LIMIT_BYTES >> 20} MiB limit")
    return manifest


def tree_bytes() -> int | None:
    """Bytes of the files that travel with the repo (tracked and untracked-not-ignored)."""
    try:
        res = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True, check=True,
        )  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None
    names = [n for n in res.stdout.decode().split("\0") if n]
    return sum((REPO / n).stat().st_size for n in names if (REPO / n).is_file())


def check(kit: Path) -> dict:
    """The manifest lists every file of the kit, each with its size and hash; all under the limit."""
    mf = kit / MANIFEST
    if not mf.is_file():
        raise SystemExit(f"error: {kit} is not a kit ({MANIFEST} missing; make one with --make-kit)")
    manifest = json.loads(mf.read_text(encoding="utf-8"))
    listed = {e["path"] for e in manifest["files"]}
    present = {p.relative_to(kit).as_posix() for p in kit.rglob("*") if p.is_file()} - {MANIFEST}
    problems = [f"{p}: in the folder, not in the manifest" for p in sorted(present - listed)]
    problems += [f"{p}: in the manifest, missing" for p in sorted(listed - present)]
    for e in manifest["files"]:
        p = kit / e["path"]
        if not p.is_file():
            continue
        if p.stat().st_size != e["bytes"] or _sha256(p) != e["sha256"]:
            problems.append(f"{e['path']}: size or sha256 differs from the manifest")
        if not e.get("why"):
            problems.append(f"{e['path']}: no reason given")
    total = sum(p.stat().st_size for p in kit.rglob("*") if p.is_file())
    if total > LIMIT_BYTES:
        problems.append(f"{total / 2**20:.1f} MiB in all, over the {LIMIT_BYTES >> 20} MiB limit")
    if problems:
        lines = "\n  ".join(problems)
        raise SystemExit(f"error: the kit in {kit} is broken:\n  {lines}")
    return manifest


def install(kit: Path, target: Path) -> None:
    """The kit's wheels for the running Python into ``target`` (never the environment itself)."""
    manifest = check(kit)
    cmd = [
        sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
        "--no-index", "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade",
        "--find-links", str(kit / "wheels"), "--target", str(target), *manifest["pins"],
    ]  # fmt: skip
    subprocess.run(cmd, check=True)


def llama_src(kit: Path, root: Path) -> Path:
    """The kit's source unpacked under ``root``, named by the tarball's hash (reused when there)."""
    entry = next(e for e in check(kit)["files"] if e["path"] == SOURCE_NAME)
    dest = root / f"kit-llama-{entry['sha256'][:16]}"
    tree = dest / "llama.cpp"
    if (tree / "include" / "llama.h").is_file():
        return tree
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".kit-llama-", dir=root))
    with tarfile.open(kit / SOURCE_NAME, "r:xz") as tar:
        tar.extractall(tmp, filter="data")
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return tree


_GUARD = '''"""Written by scripts/gpu_kit.py guard: this Python imports, from its own site-packages,
only the distributions the GPU image has (scripts/gpu_image_packages.txt), so a rehearsal
fails here on any package the kit does not carry."""
import importlib.machinery, importlib.metadata, os, site, sys

_ALLOWED = set({ALLOWED!r})
_SITE = tuple(os.path.realpath(p) + os.sep for p in site.getsitepackages())
_DISTS = importlib.metadata.packages_distributions()


def _norm(name):
    return name.replace("_", "-").replace(".", "-").lower()


class _ImageGuard:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if path is not None or name in sys.builtin_module_names:
            return None  # submodules follow their package
        spec = importlib.machinery.PathFinder.find_spec(name)
        where = spec and (spec.origin if spec.has_location else
                          next(iter(spec.submodule_search_locations or []), None))
        if not where or not os.path.realpath(where).startswith(_SITE):
            return None  # stdlib, the repo, the kit's target
        dists = {{_norm(d) for d in _DISTS.get(name, [])}}
        if dists & _ALLOWED or not dists and name.startswith("_"):
            return None
        raise ModuleNotFoundError(
            f"{{name}} ({{', '.join(sorted(dists)) or 'no distribution'}}) is not in the GPU "
            "image and not in the kit", name=name)


sys.meta_path.insert(0, _ImageGuard)
'''


def guard(target: Path) -> Path:
    names = {
        line.strip().replace("_", "-").lower()
        for line in IMAGE_PACKAGES.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    target.mkdir(parents=True, exist_ok=True)
    out = target / "sitecustomize.py"
    out.write_text(_GUARD.format(ALLOWED=sorted(names)), encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("make", "check"):
        sub.add_parser(name).add_argument("kit", type=Path)
    p = sub.add_parser("install")
    p.add_argument("kit", type=Path)
    p.add_argument("target", type=Path)
    p = sub.add_parser("llama-src")
    p.add_argument("kit", type=Path)
    p.add_argument("root", type=Path)
    sub.add_parser("guard").add_argument("target", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "make":
        m = make(args.kit)
        for e in m["files"]:
            print(f"{e['bytes'] / 2**20:7.2f} MiB  {e['path']}")
        print(f"{m['total_bytes'] / 2**20:7.2f} MiB  in all (limit {LIMIT_BYTES >> 20} MiB), "
              f"manifest: {args.kit / MANIFEST}")  # fmt: skip
        tree = tree_bytes()
        if tree is not None:
            both = tree + m["total_bytes"]
            print(f"{tree / 2**20:7.2f} MiB  the repo's files that travel with it; with the kit "
                  f"{both / 2**20:.2f} MiB of the {CARRY_LIMIT >> 20} MiB a device command takes")  # fmt: skip
            if both > CARRY_LIMIT:
                print("error: the working tree and the kit together are over what a device "
                      "command takes", file=sys.stderr)  # fmt: skip
                return 1
    elif args.cmd == "check":
        m = check(args.kit)
        print(f"kit ok: {len(m['files'])} files, {m['total_bytes'] / 2**20:.2f} MiB")
    elif args.cmd == "install":
        install(args.kit, args.target)
    elif args.cmd == "llama-src":
        print(llama_src(args.kit, args.root))
    else:
        print(guard(args.target))
    return 0


if __name__ == "__main__":
    sys.exit(main())
