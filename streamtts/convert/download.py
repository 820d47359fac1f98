"""``streamtts download``: fetch the official weights, check their layout, write a config.

Two hub repositories, laid out as the official release (contract section 1)::

    DEST/MOSS-TTS-GGUF/                 OpenMOSS-Team/MOSS-TTS-GGUF (one quant of the backbone)
    DEST/MOSS-Audio-Tokenizer-ONNX/     OpenMOSS-Team/MOSS-Audio-Tokenizer-ONNX
    DEST/streamtts.yaml                 a ready config (paths relative to DEST)

``huggingface_hub.snapshot_download`` does the transfer: only the files of the
chosen quant (``allow_patterns``), progress bars, and resume of interrupted
downloads are built in. ``--from-dir`` takes the same layout from a local
folder instead (an offline mirror; also what the tests use). Either way the
result is checked file by file and every problem is named before anything
tries to load it.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..constants import CODEC_DECODER_PREFIXES
from ..core.tokens import TokenIds, load_token_ids
from ..errors import ConfigError, DownloadError, ModelFileError, StreamTTSError
from .config_file import config_yaml, gguf_file_name

log = logging.getLogger(__name__)

GGUF_REPO = "OpenMOSS-Team/MOSS-TTS-GGUF"
CODEC_REPO = "OpenMOSS-Team/MOSS-Audio-Tokenizer-ONNX"
GGUF_DIR = "MOSS-TTS-GGUF"
CODEC_DIR = "MOSS-Audio-Tokenizer-ONNX"
CONFIG_NAME = "streamtts.yaml"
QUANTS = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0")


def gguf_patterns(quant: str, *, text_head: bool = True) -> list[str]:
    """Files of the GGUF repo for one quant (the other quants are several GB each)."""
    pats = [
        gguf_file_name(quant),
        "embeddings/*.npy",
        "lm_heads/lm_head_audio_*.npy",
        "tokenizer/*",
        "config.json",
        "*.md",
    ]
    if text_head:  # only read outside audio mode (NumPy heads); 1.2 GB
        pats.append("lm_heads/lm_head_text.npy")
    return pats


# Large ONNX models keep their weights in external data files next to the graph.
CODEC_PATTERNS = ["*.onnx", "*.onnx.data", "*.onnx_data", "*.data", "*.json", "*.md"]
# The codec's own checkpoint (safetensors): what `streamtts codec build` makes the exact
# streaming decoder from. Only its config and the files holding decoder tensors are fetched.
CODEC_CKPT_REPO = "OpenMOSS-Team/MOSS-Audio-Tokenizer"
CODEC_CKPT_DIR = "MOSS-Audio-Tokenizer"
_CKPT_META = ["config.json", "model.safetensors.index.json"]



# -- fetching -----------------------------------------------------------------------------


Fetcher = Callable[..., Any]  # snapshot_download's signature


def _snapshot_download() -> Fetcher:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise DownloadError(
            "streamtts download needs huggingface_hub: pip install 'streamtts[hub]' "
            "(or pip install huggingface_hub)"
        ) from exc
    fetch: Fetcher = snapshot_download
    return fetch


OFFLINE_ADVICE = (
    f"fetch the three repositories on another machine (`hf download {GGUF_REPO} --local-dir "
    f"DIR/{GGUF_DIR}`, the same for {CODEC_REPO} into DIR/{CODEC_DIR} and {CODEC_CKPT_REPO} "
    "into DIR/" + CODEC_CKPT_DIR + ") and run `streamtts download --from-dir DIR`"
)


def fetch_repo(
    repo_id: str,
    local_dir: Path,
    patterns: list[str],
    *,
    revision: str | None = None,
    fetcher: Fetcher | None = None,
    offline: str | None = None,
) -> Path:
    """One hub repository into ``local_dir`` (resumes a partial download); ``offline`` is
    what to do without access to the hub (default: ``streamtts download``'s way)."""
    fetch = fetcher or _snapshot_download()
    log.info("downloading %s (%s) into %s", repo_id, ", ".join(patterns), local_dir)
    try:
        fetch(repo_id, local_dir=str(local_dir), allow_patterns=patterns, revision=revision)
    except StreamTTSError:
        raise
    except Exception as exc:  # hub/network errors have many types; keep the cause
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DownloadError(
            f"downloading {repo_id} failed ({first.removeprefix('Got: ')}); without access to "
            f"huggingface.co, {offline or OFFLINE_ADVICE}, or set HF_ENDPOINT to a mirror"
        ) from exc
    return local_dir


def copy_tree(src: Path, dst: Path, patterns: list[str]) -> int:
    """Copy the files of ``src`` matching ``patterns`` (hub semantics) into ``dst``.

    Copies, not hard links: a link would let a later edit of the weights folder
    change the mirror too. Files already present with the same size are kept (a
    re-run is cheap). Returns the number of files copied.
    """
    if not src.is_dir():
        raise ModelFileError(
            src, f"a local copy of the hub repository ({dst.name})", "folder not found"
        )
    n = 0
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        rel = f.relative_to(src).as_posix()
        if not any(fnmatch.fnmatch(rel, pat) for pat in patterns):
            continue
        out = dst / rel
        if out.is_file() and out.stat().st_size == f.stat().st_size:
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.part")
        shutil.copyfile(f, tmp)
        os.replace(tmp, out)
        n += 1
    return n


def checkpoint_files(folder: Path) -> list[str]:
    """The safetensors files of the codec checkpoint in ``folder`` that hold decoder tensors:
    the shards its index names for ``decoder.*``/``quantizer.*``, or ``model.safetensors``."""
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        return ["model.safetensors"]
    import json

    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelFileError(index, "a safetensors index with a weight_map") from exc
    return sorted({str(f) for name, f in weight_map.items() if name.startswith(CODEC_DECODER_PREFIXES)})


def fetch_codec_checkpoint(
    dest: Path, *, from_dir: Path | None = None, revision: str | None = None,
    fetcher: Fetcher | None = None,
) -> Path | None:
    """The codec checkpoint's config and decoder weights into ``dest/MOSS-Audio-Tokenizer``.

    Optional (only the exact streaming decoder needs it): a failure is logged with what to
    do, and None is returned so the windowed path keeps working.
    """
    out = dest / CODEC_CKPT_DIR
    try:
        if from_dir is not None:
            src = from_dir / CODEC_CKPT_DIR
            copy_tree(src, out, _CKPT_META)
            copy_tree(src, out, checkpoint_files(out))
        else:
            fetch_repo(CODEC_CKPT_REPO, out, _CKPT_META, revision=revision, fetcher=fetcher)
            fetch_repo(CODEC_CKPT_REPO, out, checkpoint_files(out), revision=revision, fetcher=fetcher)
    except (StreamTTSError, OSError) as exc:
        log.warning(
            "the codec checkpoint (%s) was not fetched: %s. The engine decodes in windows; "
            "for exact streaming, fetch it into %s and run `streamtts codec build --weights %s "
            "--out %s`", CODEC_CKPT_REPO, exc, out, out, dest / CODEC_DIR / "decoder_streaming.onnx",
        )  # fmt: skip
        return None
    if not (out / "config.json").is_file():
        log.warning("the codec checkpoint in %s has no config.json; decoding in windows", out)
        return None
    return out


# -- layout check -------------------------------------------------------------------------


@dataclass
class LayoutReport:
    """Result of :func:`check_layout`: every problem, by file."""

    root: Path
    quant: str
    problems: list[str] = field(default_factory=list)
    n_embd: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, path: Path, what: str) -> None:
        self.problems.append(
            f"{path.relative_to(self.root) if path.is_relative_to(self.root) else path}: {what}"
        )

    def raise_if_bad(self) -> None:
        if self.problems:
            lines = "\n  ".join(self.problems)
            raise ModelFileError(
                self.root, "the official MOSS-TTS weight layout",
                f"{len(self.problems)} problem(s):\n  {lines}",
            )  # fmt: skip


def _check_npy(rep: LayoutReport, path: Path, rows: int | None, cols: int | None) -> int:
    """Header check of one table; returns its width (0 when unusable)."""
    if not path.is_file():
        rep.add(path, "missing")
        return 0
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as exc:  # truncated/corrupt files raise ValueError/OSError/EOFError
        rep.add(path, f"not a readable .npy file ({exc})")
        return 0
    want_rows = rows if rows is not None else "V"
    if arr.ndim != 2 or arr.dtype not in (np.float16, np.float32):
        rep.add(path, f"expected a 2-D float16 table, got shape {arr.shape} dtype {arr.dtype}")
        return 0
    if (rows is not None and arr.shape[0] != rows) or (cols and arr.shape[1] != cols):
        rep.add(path, f"expected shape ({want_rows}, {cols or 'H'}), got {arr.shape}")
        return 0
    return int(arr.shape[1])


def _check_gguf(rep: LayoutReport, path: Path) -> int:
    if not path.is_file():
        others = sorted(
            p.name for p in path.parent.glob("MOSS_TTS_*.gguf") if ".fused." not in p.name
        )
        hint = f" (found {', '.join(others)}: pass --quant)" if others else ""
        rep.add(path, "missing" + hint)
        return 0
    try:
        from gguf import GGUFReader

        r = GGUFReader(str(path))
        arch = r.fields["general.architecture"].contents()
        width = int(r.fields[f"{arch}.embedding_length"].contents())
    except Exception as exc:  # truncated download, HTML error page, ...
        rep.add(path, f"not a readable GGUF file ({exc})")
        return 0
    if arch != "qwen3":
        rep.add(path, f"expected a qwen3 GGUF, got architecture {arch!r}")
    return width


def _check_onnx(rep: LayoutReport, path: Path) -> None:
    if not path.is_file():
        rep.add(path, "missing")
        return
    try:
        import onnx
    except ImportError:  # the graph is checked at load time by ONNX Runtime anyway
        return
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        rep.add(path, f"not a readable ONNX model ({exc})")
        return
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    needed = {
        ExternalDataInfo(t).location for t in _onnx_tensors(model.graph) if uses_external_data(t)
    }
    for loc in sorted(needed):
        if not (path.parent / loc).is_file():
            rep.add(path.parent / loc, f"missing (external weights of {path.name})")


def _onnx_tensors(graph: Any) -> list[Any]:
    """Every TensorProto of a graph: initializers and node attributes, subgraphs included."""
    out = list(graph.initializer)
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("t"):
                out.append(a.t)
            out.extend(a.tensors)
            if a.HasField("g"):
                out.extend(_onnx_tensors(a.g))
            for g in a.graphs:
                out.extend(_onnx_tensors(g))
    return out


def check_layout(
    root: str | os.PathLike[str], quant: str = "Q4_K_M", *, text_head: bool = True
) -> LayoutReport:
    """Check a weights folder (``DEST``) file by file; the report lists every problem."""
    base = Path(root)
    rep = LayoutReport(root=base, quant=quant)
    gg = base / GGUF_DIR
    cfg_json = gg / "config.json"
    try:
        ids = load_token_ids(cfg_json if cfg_json.is_file() else None)
    except ModelFileError as exc:
        rep.add(cfg_json, str(exc))
        ids = TokenIds()
    h = _check_gguf(rep, gg / gguf_file_name(quant))
    h_emb = _check_npy(rep, gg / "embeddings" / "embed_tokens.npy", None, h or None)
    h = h or h_emb
    rep.n_embd = h
    for k in range(ids.n_vq):
        _check_npy(rep, gg / "embeddings" / f"emb_ext_{k:02d}.npy", ids.audio_rows, h or None)
        _check_npy(rep, gg / "lm_heads" / f"lm_head_audio_{k:02d}.npy", ids.audio_rows, h or None)
    if text_head:
        _check_npy(rep, gg / "lm_heads" / "lm_head_text.npy", None, h or None)
    tok = gg / "tokenizer" / "tokenizer.json"
    if not tok.is_file():
        rep.add(tok, "missing")
    codec = base / CODEC_DIR
    _check_onnx(rep, codec / "encoder.onnx")
    _check_onnx(rep, codec / "decoder.onnx")
    return rep


# -- config -------------------------------------------------------------------------------

_CONFIG_HEAD = """\
# streamtts config written by `streamtts download` for the {quant} backbone.
# Paths are relative to this file's folder. See configs/default.yaml for every key.
backbone_gguf: {gg}/{gguf}
embedding_dir: {gg}/embeddings
lm_head_dir: {gg}/lm_heads
tokenizer_dir: {gg}/tokenizer
audio_backend: onnx            # trt after `streamtts build-engine` (set audio_decoder_trt)
audio_encoder_onnx: {codec}/encoder.onnx
audio_decoder_onnx: {codec}/decoder.onnx
"""


def write_config(
    root: str | os.PathLike[str], quant: str, *, gpu: bool, fused: Path | None = None
) -> Path:
    base = Path(root)
    from ..model.fused import fused_path_for

    fused_name = fused_path_for(gguf_file_name(quant)).name
    text = config_yaml(
        _CONFIG_HEAD.format(quant=quant, gg=GGUF_DIR, gguf=gguf_file_name(quant), codec=CODEC_DIR),
        gpu=gpu,
        fused_gguf=None if fused is None else os.path.relpath(fused, base),
        heads_note=f"            # fused heads when {GGUF_DIR}/{fused_name} exists (`streamtts convert`)",
    )
    out = base / CONFIG_NAME
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)
    return out


def gpu_available() -> bool:
    """A CUDA device is visible (nvidia-smi lists one); decides the written config's defaults."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return False
    import subprocess

    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


# -- the command --------------------------------------------------------------------------


def _topmost_missing(path: Path) -> Path | None:
    """The outermost folder of ``path`` that does not exist yet (what mkdir -p creates)."""
    missing = None
    for p in (path, *path.parents):
        if p.exists():
            break
        missing = p
    return missing


def _holds_files(folder: Path) -> bool:
    """Whether ``folder`` holds a file besides the hub's bookkeeping (``.cache``)."""
    return any(f.is_file() and ".cache" not in f.relative_to(folder).parts for f in folder.rglob("*"))


def download(
    dest: str | os.PathLike[str] = "weights",
    quant: str = "Q4_K_M",
    *,
    from_dir: str | os.PathLike[str] | None = None,
    revision: str | None = None,
    text_head: bool = True,
    codec: bool = True,
    codec_checkpoint: bool = True,
    fuse: bool = False,
    gpu: bool | None = None,
    fetcher: Fetcher | None = None,
) -> tuple[Path, LayoutReport]:
    """Fetch (or copy), check, and write ``DEST/streamtts.yaml``; returns (config, report).

    With ``codec_checkpoint`` the codec's checkpoint (decoder tensors) lands in
    ``DEST/MOSS-Audio-Tokenizer`` too, for ``streamtts codec build`` (the command runs it).

    Raises ``ModelFileError`` listing every problem when the layout is wrong (the
    config is then not written).
    """
    if not quant or any(c in quant for c in "/\\*?"):
        raise ConfigError(
            f"--quant must be a quant name such as {', '.join(QUANTS)}, got {quant!r}"
        )
    if quant not in QUANTS:
        log.warning(
            "quant %s is not one of the published %s; trying anyway", quant, ", ".join(QUANTS)
        )
    base = Path(dest)
    if from_dir is not None and not Path(from_dir).is_dir():
        raise ConfigError(f"--from-dir {from_dir}: no such folder")
    created = _topmost_missing(base)
    base.mkdir(parents=True, exist_ok=True)
    gpats = gguf_patterns(quant, text_head=text_head)
    jobs = [(GGUF_REPO, GGUF_DIR, gpats)]
    if codec:
        jobs.append((CODEC_REPO, CODEC_DIR, CODEC_PATTERNS))
    try:
        for repo, sub, pats in jobs:
            if from_dir is not None:
                n = copy_tree(Path(from_dir) / sub, base / sub, pats)
                log.info("%s: %d file(s) copied from %s", sub, n, Path(from_dir) / sub)
            else:
                fetch_repo(repo, base / sub, pats, revision=revision, fetcher=fetcher)
    except BaseException:
        # Offline, or a wrong --from-dir: leave no empty folder behind (a partial download
        # is kept: the next run resumes it).
        if created is not None and not _holds_files(created):
            shutil.rmtree(created, ignore_errors=True)
        raise
    rep = check_layout(base, quant, text_head=text_head)
    if not codec:  # codec problems are the user's business when they skipped it
        rep.problems = [p for p in rep.problems if not p.startswith(CODEC_DIR)]
    rep.raise_if_bad()
    if codec and codec_checkpoint:
        fetch_codec_checkpoint(
            base, from_dir=None if from_dir is None else Path(from_dir), revision=revision,
            fetcher=fetcher,
        )  # fmt: skip
    fused_path = None
    if fuse:
        from .fused_writer import convert

        info = convert(base / GGUF_DIR / gguf_file_name(quant), base / GGUF_DIR / "lm_heads")
        fused_path = Path(info.path)
    cfg = write_config(base, quant, gpu=gpu_available() if gpu is None else gpu, fused=fused_path)
    log.info("weights ready in %s; config: %s", base, cfg)
    return cfg, rep
