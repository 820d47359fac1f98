"""The writer behind ``streamtts convert`` (see ``fused.py`` for the file format).

Streams every tensor of the source GGUF into the fused file: raw blocks read
with plain file reads into one reused buffer, never the whole file in memory.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..config import EngineConfig, find_model_config
from ..core.tokens import TokenIds, load_token_ids
from ..errors import ConfigError, ModelFileError
from ..model import fused
from ..model.fused import (
    KEY,
    AudioDtype,
    FusedInfo,
    Progress,
    TextSource,
    _field,
    fused_path_for,
    heads_digest,
    read_fused_info,
)
from ..paths import gguf_writer_at

log = logging.getLogger(__name__)

_CHUNK_BYTES = 64 << 20  # streaming granularity: bounded memory for a multi-GB source


@dataclass
class _Tensor:
    """One tensor of the output file: its header entry and a generator of its bytes."""

    name: str
    shape: tuple[int, ...]  # NumPy order (rows, cols)
    qtype: Any  # GGMLQuantizationType
    nbytes: int
    chunks: Callable[[], Iterator[Any]]


def _row_bytes(qtype: Any, n: int) -> int:
    from gguf import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[qtype]
    if n % block:
        raise ValueError(f"{n} values are not a whole number of {qtype.name} blocks ({block})")
    return n // block * size


class _Source:
    """Reads tensor bytes from the source GGUF with plain file reads into one reused buffer.

    Not through the reader's memory map: every page touched through a map counts
    in the process's resident memory until unmapped, so copying a 5 GB file that
    way shows 5 GB resident. File reads go through the page cache, which the
    kernel reclaims freely.
    """

    def __init__(self, path: Path) -> None:
        self.fh = path.open("rb")
        self._buf = bytearray(0)

    def close(self) -> None:
        self.fh.close()

    def read(self, offset: int, n: int, *, reuse: bool = False) -> memoryview:
        if reuse:
            if len(self._buf) < n:
                self._buf = bytearray(n)
            mv = memoryview(self._buf)[:n]
        else:
            mv = memoryview(bytearray(n))
        self.fh.seek(offset)
        got = self.fh.readinto(mv)
        if got != n:
            raise ModelFileError(
                self.fh.name, "a complete GGUF file", f"truncated: {got} of {n} bytes at {offset}"
            )
        return mv

    def chunks(self, t: Any) -> Callable[[], Iterator[Any]]:
        """The raw bytes of tensor ``t`` (whole rows, about _CHUNK_BYTES at a time)."""
        rows = max(1, int(np.prod([int(d) for d in t.shape[1:]])))
        row_bytes = int(t.n_bytes) // rows

        def gen() -> Iterator[Any]:
            step = max(1, _CHUNK_BYTES // max(row_bytes, 1)) * row_bytes
            for off in range(0, int(t.n_bytes), step):
                yield self.read(
                    int(t.data_offset) + off, min(step, int(t.n_bytes) - off), reuse=True
                )

        return gen

    def read_row(self, t: Any, i: int) -> np.ndarray:
        """Row ``i`` of a 2-D tensor as its raw bytes (blocks, for a quantized type)."""
        row_bytes = int(t.n_bytes) // int(t.shape[1])
        return np.frombuffer(self.read(int(t.data_offset) + i * row_bytes, row_bytes), dtype=np.uint8).copy()

    def rows(self, t: Any, start: int, n: int) -> np.ndarray:
        """Rows [start, start + n) of a 2-D tensor as float32 (exact dequantization)."""
        from gguf import GGMLQuantizationType as Q
        from gguf.quants import dequantize

        width = int(t.shape[0])
        row_bytes = int(t.n_bytes) // int(t.shape[1])
        raw = np.frombuffer(
            self.read(int(t.data_offset) + start * row_bytes, n * row_bytes), dtype=np.uint8
        )
        if t.tensor_type == Q.F32:
            return raw.view(np.float32).reshape(n, width).copy()
        if t.tensor_type == Q.F16:
            return raw.view(np.float16).reshape(n, width).astype(np.float32)
        out = dequantize(raw.reshape(n, row_bytes), t.tensor_type)
        return np.asarray(out, dtype=np.float32).reshape(n, width)


def _zeros(qtype: Any, rows: int, row_bytes: int) -> Callable[[], Iterator[Any]]:
    def gen() -> Iterator[Any]:
        step = max(1, _CHUNK_BYTES // row_bytes)
        buf = np.zeros((min(step, rows), row_bytes), dtype=np.uint8)
        for i in range(0, rows, step):
            yield buf[: min(step, rows - i)]

    return gen


def _npy_chunks(path: Path, rows_per_chunk: int) -> Iterator[np.ndarray]:
    """Row chunks of a 2-D .npy table by file reads (same reason as _Source)."""
    with path.open("rb") as f:
        fmt = np.lib.format
        major, _ = fmt.read_magic(f)
        read_header = fmt.read_array_header_1_0 if major == 1 else fmt.read_array_header_2_0
        shape, fortran, dtype = read_header(f)
        if fortran or len(shape) != 2:
            raise ModelFileError(path, "a C-order 2-D table", f"got shape {shape}")
        for i in range(0, shape[0], rows_per_chunk):
            n = min(rows_per_chunk, shape[0] - i)
            yield np.fromfile(f, dtype=dtype, count=n * shape[1]).reshape(n, shape[1])


def _check_head(path: Path, arr: np.ndarray, rows: int, n_embd: int) -> None:
    if arr.ndim != 2 or arr.shape != (rows, n_embd) or arr.dtype not in (np.float16, np.float32):
        raise ModelFileError(
            path, f"a ({rows}, {n_embd}) float16 head table", f"got {arr.shape} {arr.dtype}"
        )


def _resolve_heads(heads: str | os.PathLike[str] | EngineConfig) -> tuple[Path, TokenIds]:
    if isinstance(heads, EngineConfig):
        if not heads.lm_head_dir:
            raise ConfigError("the config has no lm_head_dir: the fused GGUF needs the audio heads")
        return Path(heads.lm_head_dir), load_token_ids(find_model_config(heads))
    d = Path(heads)
    cfg_json = next((c for c in (d / "config.json", d.parent / "config.json") if c.is_file()), None)
    return d, load_token_ids(cfg_json)


def convert(
    src_gguf: str | os.PathLike[str],
    heads: str | os.PathLike[str] | EngineConfig,
    dst: str | os.PathLike[str] | None = None,
    *,
    include_text_head: bool = False,
    audio_dtype: AudioDtype = "f16",
    text_source: TextSource = "gguf",
    ids: TokenIds | None = None,
    progress: Progress | None = None,
    reader: Any = None,
) -> FusedInfo:
    """Write a fused-heads GGUF from ``src_gguf`` and the heads in ``heads``.

    heads: the ``lm_heads`` folder (``lm_head_audio_XX.npy``, ``lm_head_text.npy``)
    or an ``EngineConfig`` (its ``lm_head_dir`` and model config.json).
    dst: default ``<src stem>.fused.gguf`` next to the source (the engine picks
    that name up by itself). audio_dtype: type of the fused output layer (f16 as
    the published npy heads; f32 keeps llama.cpp's CPU matmul from rounding the
    hidden state to f16, see docs). Tensors are streamed: memory stays bounded
    whatever the source's size. The file is written next to ``dst`` and renamed
    into place. reader: ``src_gguf`` already parsed (a ``gguf.GGUFReader``): parsing a
    GGUF with a real vocabulary takes gguf-py ~13 s, ensure_fused reads it once.
    """
    import gguf

    t0 = time.perf_counter()
    src = Path(src_gguf)
    if not src.is_file():
        raise ModelFileError(src, "a qwen3 GGUF backbone", "file not found")
    if audio_dtype not in ("f16", "f32", "text"):
        raise ConfigError(f"audio_dtype must be f16, f32 or text, got {audio_dtype!r}")
    if audio_dtype == "text" and (include_text_head or text_source != "gguf"):
        raise ConfigError("audio_dtype 'text' keeps the GGUF's own text rows only (no full text head, no npy rows)")
    if text_source not in ("gguf", "npy"):
        raise ConfigError(f"text_source must be gguf or npy, got {text_source!r}")
    head_dir, found_ids = _resolve_heads(heads)
    ids = ids or found_ids
    out_path = Path(dst) if dst is not None else fused_path_for(src)
    if out_path.resolve() == src.resolve():
        raise ConfigError(f"the fused GGUF must not overwrite its source {src}")

    try:
        r = reader if reader is not None else gguf.GGUFReader(str(src))
    except Exception as exc:
        raise ModelFileError(
            src, "a qwen3 GGUF backbone", f"not a readable GGUF file: {exc}"
        ) from exc
    if _field(r, KEY + "version") is not None:
        raise ModelFileError(src, "a plain backbone GGUF", "it is already a fused GGUF")
    source = _Source(src)
    try:
        return _convert(
            r,
            source,
            src,
            head_dir,
            ids,
            out_path,
            include_text_head,
            audio_dtype,
            text_source,
            progress,
            t0,
        )
    finally:
        source.close()


def _convert(
    r: Any,
    source: _Source,
    src: Path,
    head_dir: Path,
    ids: TokenIds,
    out_path: Path,
    include_text_head: bool,
    audio_dtype: AudioDtype,
    text_source: TextSource,
    progress: Progress | None,
    t0: float,
) -> FusedInfo:
    import gguf
    from gguf import GGMLQuantizationType as Q

    arch = str(_field(r, "general.architecture"))
    emb_len = _field(r, f"{arch}.embedding_length")
    if emb_len is None:
        raise ModelFileError(src, "a GGUF backbone", f"no {arch}.embedding_length key")
    n_embd = int(emb_len)
    tensors = {t.name: t for t in r.tensors}
    if "token_embd.weight" not in tensors:
        raise ModelFileError(src, "a GGUF backbone", "no token_embd.weight tensor")
    text_src_name = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    text_src = tensors[text_src_name]
    src_vocab = int(text_src.shape[1])

    text_only = audio_dtype == "text"
    fdtype = Q.F16 if audio_dtype == "f16" else Q.F32
    if text_only:  # the source's rows as they are: llama.cpp then computes the official logits
        fdtype = text_src.tensor_type
    npdtype = np.float16 if audio_dtype == "f16" else np.float32
    text_ids = (ids.gen_slot, ids.delay_slot)
    n_text = len(text_ids)
    audio_offset = n_text
    n_audio = 0 if text_only else ids.n_vq * ids.audio_rows
    head_rows = 0
    text_head_offset = audio_offset + n_audio
    if include_text_head:
        head_rows = src_vocab if text_source == "gguf" else _npy_rows(head_dir / "lm_head_text.npy")
    rows = text_head_offset + head_rows

    # text rows [gen, delay]
    if text_source == "gguf":
        if max(text_ids) >= src_vocab:
            raise ModelFileError(
                src,
                f"an output layer with at least {max(text_ids) + 1} rows",
                f"{text_src_name} has {src_vocab}",
            )
        text_rows = np.concatenate([source.rows(text_src, tid, 1) for tid in text_ids])
        text_desc = f"gguf:{text_src_name} ({text_src.tensor_type.name})"
    else:
        tpath = head_dir / "lm_head_text.npy"
        tab = _load_head(tpath, None, n_embd)
        text_rows = np.asarray(tab[list(text_ids)], dtype=np.float32)
        text_desc = "npy:lm_head_text.npy"
    if text_rows.shape != (n_text, n_embd):
        raise ModelFileError(src, f"text rows of width {n_embd}", f"got {text_rows.shape}")

    audio_paths = [head_dir / f"lm_head_audio_{k:02d}.npy" for k in range(ids.n_vq) if not text_only]
    for pth in audio_paths:  # fail before writing anything
        _check_head(pth, _load_head(pth, ids.audio_rows, n_embd), ids.audio_rows, n_embd)

    out_row_bytes = n_embd * np.dtype(npdtype).itemsize
    if text_only:
        out_row_bytes = _row_bytes(fdtype, n_embd)
        raw_text = [source.read_row(text_src, tid) for tid in text_ids]

    def output_chunks() -> Iterator[Any]:
        if text_only:
            yield from raw_text
            return
        yield text_rows.astype(npdtype)
        for pth in audio_paths:  # 8 MB each for the real model: read whole, then dropped
            yield np.load(pth, allow_pickle=False).astype(npdtype, copy=False)
        if include_text_head:
            step = max(1, _CHUNK_BYTES // (n_embd * 4))
            if text_source == "gguf":
                for i in range(0, src_vocab, step):
                    yield source.rows(text_src, i, min(step, src_vocab - i)).astype(npdtype)
            else:
                for chunk in _npy_chunks(head_dir / "lm_head_text.npy", step):
                    yield chunk.astype(npdtype, copy=False)

    # token_embd: never read (embedding input), but llama.cpp wants (rows, n_embd)
    embd_q = Q.Q4_0 if n_embd % 32 == 0 else Q.F16
    embd_row = _row_bytes(embd_q, n_embd)

    plan: list[_Tensor] = []
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        if t.name == "output.weight":
            continue
        if t.name == "token_embd.weight":
            plan.append(
                _Tensor(
                    t.name, (rows, n_embd), embd_q, rows * embd_row, _zeros(embd_q, rows, embd_row)
                )
            )
            plan.append(
                _Tensor(
                    "output.weight", (rows, n_embd), fdtype, rows * out_row_bytes, output_chunks
                )
            )
            continue
        _row_bytes(t.tensor_type, shape[-1])  # whole blocks per row, or the file is broken
        plan.append(_Tensor(t.name, shape, t.tensor_type, int(t.n_bytes), source.chunks(t)))

    digest = "none" if text_only else heads_digest(head_dir, ids.n_vq)
    with gguf_writer_at(out_path, arch) as w:
        alignment = _field(r, "general.alignment")
        if alignment is not None:
            w.data_alignment = int(alignment)
        _copy_kv(r, w, arch, rows)
        w.add_uint32(KEY + "version", fused.FUSED_VERSION)
        w.add_uint32(KEY + "n_vq", ids.n_vq)
        w.add_uint32(KEY + "audio_rows", ids.audio_rows)
        w.add_uint32(KEY + "audio_offset", audio_offset)
        w.add_key_value(
            KEY + "text_ids", list(text_ids), gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32
        )
        w.add_bool(KEY + "has_text_head", include_text_head)
        w.add_bool(KEY + "has_audio", not text_only)
        w.add_uint32(KEY + "text_head_offset", text_head_offset)
        w.add_uint32(KEY + "text_head_rows", head_rows)
        w.add_string(KEY + "text_source", text_desc)
        w.add_string(KEY + "source_name", src.name)
        w.add_uint64(KEY + "source_bytes", src.stat().st_size)
        w.add_string(KEY + "heads_digest", digest)
        for pt in plan:
            w.add_tensor_info(
                pt.name, pt.shape, np.dtype(np.float32), pt.nbytes, raw_dtype=pt.qtype
            )
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        assert w.fout is not None
        fout = w.fout[0]
        total = sum(pt.nbytes for pt in plan)
        done = 0
        for pt in plan:
            w.write_padding(fout, fout.tell())
            written = 0
            for chunk in pt.chunks():
                arr = np.ascontiguousarray(chunk)
                fout.write(arr.data)  # the buffer itself, no extra copy
                written += arr.nbytes
                done += arr.nbytes
                if progress is not None:
                    progress(pt.name, done, total)
            if written != pt.nbytes:
                raise ModelFileError(
                    src,
                    "consistent tensor sizes",
                    f"{pt.name}: wrote {written} of {pt.nbytes} bytes",
                )
            w.write_padding(fout, written)
    info = read_fused_info(out_path)
    log.info(
        "wrote %s: %d output rows (%s), %.1f MB in %.1f s",
        out_path, rows, fdtype.name, out_path.stat().st_size / 1e6, time.perf_counter() - t0,
    )  # fmt: skip
    return info


def ensure_fused(
    cfg: EngineConfig, ids: TokenIds, dtype: AudioDtype, progress: Progress | None = None
) -> str:
    """The fused GGUF for ``cfg``: found (:func:`fused.find_fused_gguf`), else written now
    (once: later loads find it) next to the backbone, or in the cache folder when that
    folder is read-only or short of space. "" when it cannot be written (a warning says
    why; the engine then runs the NumPy heads).

    Why by default: on CPU the fused output layer holds only the rows the engine samples
    (2 text + 32 x 1025 audio), where the plain backbone computes its whole text head
    (151936 rows) every step and the prompt's last piece outputs every row; a step of the
    deep demo model costs about 40 % less, and the audio rows in f32 keep greedy codes
    those of the NumPy heads.
    """
    found = fused.find_fused_gguf(cfg, ids, auto_dtype=dtype)
    if found or not cfg.backbone_gguf or not cfg.lm_head_dir:
        return found
    src = Path(cfg.backbone_gguf)
    if not src.is_file() or not Path(cfg.lm_head_dir).is_dir():
        return ""  # build_runtime names the missing file
    with src.open("rb") as f:
        if f.read(4) != b"GGUF":
            return ""  # not a GGUF: loading the backbone names the problem
    if progress is not None:  # a phase without a size: parsing a real vocabulary takes seconds
        progress(f"reading {src.name}", 0, 0)
    try:
        reader = _reader(src)
        n_embd = _n_embd(reader)
    except (ValueError, KeyError, IndexError, OSError):
        return ""  # not a readable GGUF: loading the backbone names the problem
    audio_bytes = {"f32": 4, "f16": 2, "text": 0}[dtype] * ids.n_vq * ids.audio_rows * n_embd
    need = int(src.stat().st_size + audio_bytes)
    why = []
    for dst in fused.auto_fused_paths(src, dtype):
        problem = _unwritable(dst.parent, need)
        if problem:
            why.append(f"{dst.parent}: {problem}")
            continue
        log.info("writing fused heads %s (%s audio rows; once, on first load)", dst, dtype)
        try:
            convert(src, cfg, dst, audio_dtype=dtype, ids=ids, progress=progress, reader=reader)
        except OSError as exc:
            why.append(f"{dst}: {exc}")
            continue
        return str(dst)
    log.warning(
        "could not write the fused-heads GGUF (%s); using NumPy heads, a slower step on CPU",
        "; ".join(why),
    )
    return ""


def _reader(src: Path) -> Any:
    import gguf

    return gguf.GGUFReader(str(src))


def _n_embd(r: Any) -> int:
    arch = str(_field(r, "general.architecture"))
    return int(_field(r, f"{arch}.embedding_length") or 0)


def _unwritable(folder: Path, need: int) -> str:
    """Why a file of ``need`` bytes cannot be written into ``folder`` ('' when it can)."""
    import shutil

    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot create it ({exc.strerror})"
    if not os.access(folder, os.W_OK | os.X_OK):
        return "not writable"
    free = shutil.disk_usage(folder).free
    if free < need + (256 << 20):  # leave room for everything else
        return f"{free / 1e9:.1f} GB free, {need / 1e9:.1f} GB needed"
    return ""


def _load_head(path: Path, rows: int | None, n_embd: int) -> np.ndarray:
    from ..model.tables import load_npy

    return load_npy(path, rows=rows, cols=n_embd, mmap=True)


def _npy_rows(path: Path) -> int:
    arr = np.load(path, mmap_mode="r", allow_pickle=False)
    return int(arr.shape[0])


# Keys never copied: the vocabulary (replaced by dummy tokens), and what the writer sets itself.
_DROP_PREFIXES = ("tokenizer.", "GGUF.")
_DROP_KEYS = {"general.architecture", "general.alignment"}


def _copy_kv(r: Any, w: Any, arch: str, rows: int) -> None:
    from gguf import GGUFValueType as T

    for name, f in r.fields.items():
        if name in _DROP_KEYS or name.startswith(_DROP_PREFIXES) or name.startswith(KEY):
            continue
        if name == f"{arch}.vocab_size":
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == T.ARRAY else None
        if vtype == T.ARRAY and len(f.types) > 2:
            log.warning("dropping nested array key %s (not copyable)", name)
            continue
        w.add_key_value(name, f.contents(), vtype, sub)
    w.add_uint32(f"{arch}.vocab_size", rows)
    w.add_string("tokenizer.ggml.model", "none")
    # the writer adds general.alignment only when it differs from the default
    if w.data_alignment != 32:
        w.add_uint32("general.alignment", w.data_alignment)
