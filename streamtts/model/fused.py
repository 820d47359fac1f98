"""Fused-heads GGUF: the backbone with the engine's head rows as its output layer.

Why: on a GPU the per-step cost should be the backbone and nothing else. The
audio heads are 32 x 1025 rows; computing them in NumPy after every step means
copying the hidden states to the host and a CPU matmul per tick. A qwen3 GGUF
whose ``output.weight`` holds exactly the rows the engine samples from lets
llama.cpp compute every head logit in the same graph (contract section 9), and
the engine copies one small logits row per stream.

Layout of the fused output layer (rows, in this order)::

    [0, len(text_ids))                       text rows: gen slot, delay slot
    [audio_offset, audio_offset + n_vq*1025)  audio head k, code c at audio_offset + k*1025 + c
    [text_head_offset, + V)                  the full text head (only with include_text_head)

Everything else is copied from the source GGUF unchanged (quantized tensors as
raw blocks, no requantisation), except ``token_embd.weight`` (never read: the
engine feeds embeddings) which becomes zeros of the cheapest type llama.cpp
loads, and the vocabulary metadata: ``tokenizer.ggml.model = "none"`` and
``{arch}.vocab_size = rows`` make llama.cpp create ``rows`` dummy tokens.

Text rows come from the source GGUF's output layer, not ``lm_head_text.npy``:
the NumPy-heads engine (like the official pipeline) takes its text logits from
that layer, so both modes then decide gen-slot vs delay-slot from the same
weights. For an f16/f32 source the rows are copied bit for bit; a quantized
output layer (Q6_K in the published Q4_K_M) is dequantized exactly to float32
and stored in the fused tensor's type (``text_source="npy"`` takes the
unquantized rows from ``lm_head_text.npy`` instead).

The file carries its own ``streamtts.fused.*`` keys so :func:`fused_columns`
can check it against the running engine before the first step.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ..core.tokens import TokenIds
from ..errors import ConfigError, ModelFileError

if TYPE_CHECKING:  # pragma: no cover
    from ..config import EngineConfig

log = logging.getLogger(__name__)

FUSED_VERSION = 1
KEY = "streamtts.fused."
SUFFIX = ".fused.gguf"

# f16 / f32: the audio rows are in the output layer, in that type. "text": none are; the
# output layer holds only the text rows, in the source's own type (raw blocks, bit for bit),
# and the audio heads stay in NumPy (see fused_convert.ensure_fused for why on CPU).
AudioDtype = Literal["f16", "f32", "text"]
TextSource = Literal["gguf", "npy"]
Progress = Callable[[str, int, int], None]  # (what, bytes done, bytes total)

_EXPECTED = "a fused-heads GGUF written by `streamtts convert`"


@dataclass(frozen=True)
class FusedInfo:
    """What a fused GGUF holds (its ``streamtts.fused.*`` keys plus the header)."""

    path: str
    version: int
    arch: str
    n_embd: int
    rows: int  # rows of output.weight (= llama.cpp's n_vocab)
    n_vq: int
    audio_rows: int  # rows per codebook (codes + pad)
    audio_offset: int
    text_ids: tuple[int, ...]  # token id of each text row [0, len)
    has_text_head: bool
    text_head_offset: int
    text_head_rows: int
    dtype: str  # type of output.weight
    text_source: str
    source_name: str
    source_bytes: int
    heads_digest: str
    has_audio: bool = True  # False: text rows only (audio heads in NumPy)

    def columns(self, ids: TokenIds) -> np.ndarray:
        """Logit columns in the engine's layout: gen, delay, then the n_vq x audio_rows block
        (only gen, delay for a text-only file)."""
        check_compatible(self, ids)
        gen = self.text_ids.index(ids.gen_slot)
        delay = self.text_ids.index(ids.delay_slot)
        if not self.has_audio:
            return np.array([gen, delay], dtype=np.int32)
        audio = np.arange(self.audio_offset, self.audio_offset + self.n_vq * self.audio_rows)
        return np.concatenate([[gen, delay], audio]).astype(np.int32)


# -- reading --------------------------------------------------------------------------------


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def read_fused_info(path: str | os.PathLike[str]) -> FusedInfo:
    """Header of a fused GGUF; ``ModelFileError`` naming the problem for anything else."""
    from gguf import GGUFReader

    p = Path(path)
    if not p.is_file():
        raise ModelFileError(p, _EXPECTED, "file not found")
    try:
        r = GGUFReader(str(p))
    except Exception as exc:  # gguf raises ValueError/struct errors for non-GGUF files
        raise ModelFileError(p, _EXPECTED, f"not a readable GGUF file: {exc}") from exc
    version = _field(r, KEY + "version")
    if version is None:
        raise ModelFileError(
            p, _EXPECTED,
            "it has no streamtts.fused.version key (a plain backbone GGUF? write one with "
            "`streamtts convert`)",
        )  # fmt: skip
    if int(version) != FUSED_VERSION:
        raise ModelFileError(
            p, _EXPECTED,
            f"fused format version {version}, this streamtts reads version {FUSED_VERSION} "
            "(convert it again with this version)",
        )  # fmt: skip
    arch = str(_field(r, "general.architecture"))
    tensors = {t.name: t for t in r.tensors}
    out = tensors.get("output.weight")
    if out is None:
        raise ModelFileError(p, _EXPECTED, "it has no output.weight tensor")
    n_embd, rows = (int(d) for d in out.shape[:2])
    try:
        info = FusedInfo(
            path=str(p),
            version=int(version),
            arch=arch,
            n_embd=n_embd,
            rows=rows,
            n_vq=int(_field(r, KEY + "n_vq")),
            audio_rows=int(_field(r, KEY + "audio_rows")),
            audio_offset=int(_field(r, KEY + "audio_offset")),
            text_ids=tuple(int(x) for x in _field(r, KEY + "text_ids")),
            has_text_head=bool(_field(r, KEY + "has_text_head")),
            text_head_offset=int(_field(r, KEY + "text_head_offset")),
            text_head_rows=int(_field(r, KEY + "text_head_rows")),
            dtype=out.tensor_type.name,
            text_source=str(_field(r, KEY + "text_source")),
            source_name=str(_field(r, KEY + "source_name")),
            source_bytes=int(_field(r, KEY + "source_bytes")),
            heads_digest=str(_field(r, KEY + "heads_digest")),
            has_audio=bool(_field(r, KEY + "has_audio") if _field(r, KEY + "has_audio") is not None else True),
        )
    except (TypeError, ValueError) as exc:  # a key missing (None) or of the wrong type
        raise ModelFileError(p, _EXPECTED, f"incomplete streamtts.fused.* metadata: {exc}") from exc
    vocab = _field(r, f"{arch}.vocab_size")
    end = info.audio_offset + info.n_vq * info.audio_rows
    problems = []
    if vocab is not None and int(vocab) != rows:
        problems.append(f"{arch}.vocab_size = {vocab} but output.weight has {rows} rows")
    if info.audio_offset < len(info.text_ids) or (info.has_audio and end > rows):
        problems.append(f"audio rows [{info.audio_offset}, {end}) do not fit {rows} output rows")
    if info.has_text_head and info.text_head_offset + info.text_head_rows > rows:
        problems.append("the text head does not fit the output rows")
    if problems:
        raise ModelFileError(p, _EXPECTED, "; ".join(problems))
    return info


def check_compatible(info: FusedInfo, ids: TokenIds) -> None:
    """The file's head layout matches the model's token ids and codebooks."""
    problems = []
    if info.n_vq != ids.n_vq:
        problems.append(f"the file has {info.n_vq} codebooks, the model has {ids.n_vq}")
    if info.audio_rows != ids.audio_rows:
        problems.append(
            f"the file has {info.audio_rows} rows per codebook, the model has {ids.audio_rows}"
        )
    for name, tid in (("gen slot", ids.gen_slot), ("delay slot", ids.delay_slot)):
        if tid not in info.text_ids:
            problems.append(
                f"no text row for the {name} token {tid} (rows hold {list(info.text_ids)})"
            )
    if problems:
        raise ModelFileError(info.path, _EXPECTED + " for this model", "; ".join(problems))


def fused_columns(
    backbone: Any, ids: TokenIds, path: str | os.PathLike[str] | None = None
) -> np.ndarray:
    """Validate the loaded fused GGUF against the engine; its logit columns (int32).

    Column 0 is the gen-slot text logit, 1 the delay-slot one, then the 32 x 1025
    audio logits codebook-major: the layout ``EngineCore`` reads in fused mode.
    ``path`` defaults to the backbone's ``params.model_path``.
    """
    params = getattr(backbone, "params", None)
    where = path if path is not None else getattr(params, "model_path", None)
    if not where:
        raise ConfigError(
            "fused heads: no GGUF path (pass path= or a Backbone with params.model_path)"
        )
    info = read_fused_info(where)
    if (
        params is not None
    ):  # a llama.cpp backbone (a stand-in such as bench's NullBackbone has no params)
        n_vocab, n_embd = int(backbone.n_vocab), int(backbone.n_embd)
        if n_vocab != info.rows:
            raise ModelFileError(
                info.path, _EXPECTED,
                f"llama.cpp loaded {n_vocab} output rows but the metadata says {info.rows} "
                f"(check {info.arch}.vocab_size / tokenizer.ggml.model)",
            )  # fmt: skip
        if n_embd != info.n_embd:
            raise ModelFileError(
                info.path, _EXPECTED, f"n_embd {n_embd} != output.weight width {info.n_embd}"
            )
    return info.columns(ids)


# -- finding a fused file next to the backbone ---------------------------------------------


def fused_path_for(backbone_gguf: str | os.PathLike[str]) -> Path:
    """``X.gguf`` -> ``X.fused.gguf`` (the name ``streamtts convert`` writes by default)."""
    p = Path(backbone_gguf)
    return p.with_name(p.stem + SUFFIX)


def auto_fused_paths(backbone_gguf: str | os.PathLike[str], dtype: AudioDtype) -> list[Path]:
    """Where the engine writes (and looks for) the fused GGUF it makes on first load, best
    first: ``X.fused-f32.gguf`` next to the backbone, else in the cache folder (read-only
    weights). The audio dtype is in the name: a CPU (f32 rows) and a GPU (f16) engine
    sharing the weights each find their own. The cache name carries a digest of the
    backbone's absolute path, so two models with the same file name do not collide
    (staleness is still checked on the file's own keys)."""
    from ..paths import cache_dir

    p = Path(backbone_gguf)
    name = f"{p.stem}.fused-{dtype}.gguf"
    tag = hashlib.sha256(str(p.resolve()).encode()).hexdigest()[:12]
    return [p.with_name(name), cache_dir() / "fused" / f"{tag}-{name}"]


def heads_digest(lm_head_dir: str | os.PathLike[str], n_vq: int) -> str:
    """Cheap fingerprint of the audio head files (sizes, first and last 64 KiB of each).

    Enough to notice a fused file built from other heads; hashing 270 MB every
    start would not be worth it.
    """
    h = hashlib.sha256()
    for k in range(n_vq):
        f = Path(lm_head_dir) / f"lm_head_audio_{k:02d}.npy"
        try:
            size = f.stat().st_size
            with f.open("rb") as fh:
                h.update(size.to_bytes(8, "little"))
                h.update(fh.read(65536))
                fh.seek(max(0, size - 65536))
                h.update(fh.read(65536))
        except OSError:
            h.update(b"missing")
    return h.hexdigest()[:32]


def find_fused_gguf(
    cfg: EngineConfig, ids: TokenIds | None = None, auto_dtype: AudioDtype | None = None
) -> str:
    """The fused GGUF the engine should use for ``cfg``, or "" for NumPy heads.

    An explicit ``fused_gguf`` wins. Otherwise ``<backbone>.fused.gguf`` next to
    ``backbone_gguf`` (what ``streamtts convert`` writes), then, with ``auto_dtype``,
    the file the engine writes itself on first load (:func:`auto_fused_paths`), each
    picked up when present *and* built from that backbone (file name and size) and the
    configured audio heads; a stale one is ignored with a warning, so replacing the
    weights can never silently run old heads.
    """
    if cfg.heads_backend not in ("auto", "fused"):
        return ""
    if cfg.fused_gguf:
        _warn_if_stale(Path(cfg.fused_gguf), cfg)
        return cfg.fused_gguf
    if not cfg.backbone_gguf:
        return ""
    cands = [fused_path_for(cfg.backbone_gguf)]
    if auto_dtype is not None:
        cands += auto_fused_paths(cfg.backbone_gguf, auto_dtype)
    for cand in cands:
        if not cand.is_file():
            continue
        try:
            stale = _staleness(read_fused_info(cand), cfg, ids)
        except ModelFileError as exc:
            log.warning("ignoring %s: %s", cand, exc)
            continue
        if stale:
            then = "a fresh one is written" if auto_dtype else "run `streamtts convert` again"
            log.warning("ignoring %s: %s; %s", cand, stale, then)
            continue
        log.info("using fused heads from %s", cand)
        return str(cand)
    return ""


def _staleness(info: FusedInfo, cfg: EngineConfig, ids: TokenIds | None) -> str:
    """Why ``info`` was not built from cfg's backbone and audio heads ('' when it was)."""
    stale = []
    src = Path(cfg.backbone_gguf) if cfg.backbone_gguf else None
    if (
        src is not None
        and src.is_file()
        and (info.source_name != src.name or info.source_bytes != src.stat().st_size)
    ):
        stale.append(f"built from {info.source_name} ({info.source_bytes} bytes), not {src.name}")
    if info.has_audio and cfg.lm_head_dir and Path(cfg.lm_head_dir).is_dir():
        n_vq = ids.n_vq if ids is not None else info.n_vq
        if heads_digest(cfg.lm_head_dir, n_vq) != info.heads_digest:
            stale.append(f"its audio heads differ from those in {cfg.lm_head_dir}")
    return "; ".join(stale)


def _warn_if_stale(path: Path, cfg: EngineConfig) -> None:
    """An explicit fused_gguf is used as given; a mismatch is only worth a warning."""
    try:
        stale = _staleness(read_fused_info(path), cfg, None)
    except ModelFileError:
        return  # build_runtime reports the unreadable file with its full message
    if stale:
        log.warning("fused_gguf %s: %s (using it anyway, as configured)", path, stale)


def config_line(
    path: str | os.PathLike[str], backbone_gguf: str | os.PathLike[str] | None = None
) -> str:
    """What to add to the YAML config to use a fused file (or why nothing is needed)."""
    p = Path(path)
    if backbone_gguf is not None and fused_path_for(backbone_gguf).resolve() == p.resolve():
        return f"fused_gguf: {p}    # optional: picked up automatically next to {Path(backbone_gguf).name}"
    return f"fused_gguf: {p}"
