"""``streamtts convert-hf``: the original MOSS-TTS-Delay checkpoint -> the published GGUF bundle.

What the official chain does in three steps (``extract_weights.py``, llama.cpp's
``convert_hf_to_gguf.py --outtype f16``, ``llama-quantize``), in one command without torch::

    DIR/MOSS_TTS_<QUANT>.gguf          one per --quant: F32, F16, BF16 written here; Q* by
                                       llama.cpp's quantizer from the F16 file
    DIR/embeddings/embed_tokens.npy    float16, emb_ext_00..NN.npy
    DIR/lm_heads/lm_head_text.npy      float16, lm_head_audio_00..NN.npy
    DIR/tokenizer/                     the tokenizer files extract_weights.py copies
    DIR/config.json                    the checkpoint's config (token ids, n_vq, ...), plus
                                       model_kind and its sampling defaults (convert/member.py)
    DIR/config.yaml                    a ready streamtts config (paths relative to DIR)
    DIR/MOSS_TTS_<QUANT>.fused.gguf    with --fused (``streamtts convert``), first --quant

How it matches the official files (see docs/convert.md): the .npy tables are the checkpoint's
tensors rounded to float16 (round to nearest even, as torch's ``.to(float16)``); the F16 GGUF
has the tensor names, types, order and metadata keys llama.cpp's converter writes for a
Qwen3 model (norms F32, matrices F16; ``--outtype f32``/``bf16``: every tensor F32, or the
matrices BF16); quantized files come from ``llama_model_quantize``. The GGUF's output layer
is always ``lm_heads.0`` (MOSS's text head), whatever ``tie_word_embeddings`` says.

Memory: tensors are read a slab of rows at a time (``Checkpoint.iter_rows``) and written as
they are converted, so the converter holds a few tens of MB whatever the model's size;
llama.cpp's quantizer maps the F16 file and keeps at most ``quantize.MAX_BUF_BYTES`` of rows.

Safety: everything is read and checked (config, every tensor's shape and dtype, the
tokenizer, the --quant names, the free disk space) before anything is written. Outputs are
written into ``DIR/.convert-hf.partial/`` (each file to a temporary name, renamed when
complete) and moved into DIR only when all are done, so an interrupted run never leaves a
half bundle; a rerun with the same inputs resumes from the finished files there, and skips
outputs DIR already holds from a finished run with the same inputs (``DIR/.convert-hf.json``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ..errors import ModelFileError
from ..paths import gguf_writer_at, quiet_gguf
from .checkpoint import Checkpoint
from .config_file import config_yaml, gguf_file_name
from .hf_source import (
    MossConfig,
    check_tensors,
    gguf_name,
    npy_outputs,
    official_order,
    read_config,
)
from .member import GENERATION_CONFIG, MemberChoice, choose_member
from .quantize import DIRECT, estimate_bytes, parse_quant, quantize
from .vocab import TOKENIZER_FILES, GGUFVocab, add_vocab, read_vocab

log = logging.getLogger(__name__)

__all__ = ["ConvertResult", "Progress", "convert_hf", "free_bytes", "gguf_file_name"]

#: Bumped when the files written for the same inputs change (part of the input fingerprint).
CONVERTER_VERSION = "1"
STAGING_DIR = ".convert-hf.partial"
STAMP_NAME = ".convert-hf.json"
#: general.name of the official files (llama.cpp names the model after its folder, qwen3_backbone).
GGUF_MODEL_NAME = "Qwen3_Backbone"
_SLAB_BYTES = 8 << 20  # source bytes read, converted and written at a time (f32 step: 2x)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# Files of a hub checkpoint repository that the conversion reads: the small ones first
# (the config is checked before gigabytes of weights are fetched), then the weights.
HUB_META_PATTERNS = ["config.json", "model.safetensors.index.json", GENERATION_CONFIG, *TOKENIZER_FILES]
HUB_PATTERNS = [*HUB_META_PATTERNS, "model.safetensors", "model-*.safetensors"]

Progress = Callable[[str, int, int], None]  # (step, done, total), bytes


def free_bytes(path: Path) -> int:
    """Free bytes on the file system holding ``path`` (its nearest existing parent).
    Tests replace this function to simulate a full disk."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


@dataclass
class ConvertResult:
    out_dir: Path
    config_yaml: Path
    source: Path
    written: list[str] = field(default_factory=list)  # bundle-relative paths
    skipped: list[str] = field(default_factory=list)  # finished by an earlier run
    seconds: float = 0.0
    step_seconds: dict[str, float] = field(default_factory=dict)
    needed_bytes: int = 0  # the disk-space estimate that was checked
    model_kind: str = ""  # the member the bundle's config.json names
    sampling: dict[str, float | int] = field(default_factory=dict)  # and its sampling defaults


@dataclass(frozen=True)
class _Output:
    rel: str
    size: int  # bytes (estimated for quantized and fused files)
    keep: bool = True  # False: the F16 GGUF as a mere input of the quantizer


# -- source --------------------------------------------------------------------------------------


def resolve_source(
    src: str | os.PathLike[str], *, revision: str | None = None, fetcher: Any = None
) -> Path:
    """A local checkpoint folder, or a hub id downloaded (resumably) into the cache."""
    p = Path(src).expanduser()
    if p.exists():
        if not p.is_dir():
            raise ModelFileError(
                p,
                "a checkpoint folder (config.json, model*.safetensors, tokenizer)",
                "it is a file",
            )
        return p
    text = str(src)
    if not _HUB_ID.match(text):
        raise ModelFileError(
            p, "a local checkpoint folder or a hub id such as OpenMOSS-Team/MOSS-TTS", "not found"
        )
    from ..paths import cache_dir
    from .download import fetch_repo

    local = cache_dir() / "hf" / text.replace("/", "--")
    offline = (
        f"fetch it on another machine (`hf download {text} --local-dir DIR`) and convert that "
        "folder: `streamtts convert-hf DIR --out ...`"
    )
    fetch_repo(text, local, HUB_META_PATTERNS, revision=revision, fetcher=fetcher, offline=offline)
    read_config(local)  # not a MOSS-TTS-Delay checkpoint: say so before the big download
    fetch_repo(text, local, HUB_PATTERNS, revision=revision, fetcher=fetcher, offline=offline)
    return local


# -- the plan ------------------------------------------------------------------------------------


class _Job:
    """Everything read and checked up front; ``run`` then only writes."""

    def __init__(
        self, folder: Path, out: Path, quants: list[str], fused: bool, keep_f16: bool,
        src: str = "", model_kind: str | None = None,
    ) -> None:  # fmt: skip
        self.folder = folder
        self.out = out
        self.quants = quants
        self.fused = fused
        self.keep_f16 = keep_f16 or "F16" in quants
        self.cfg: MossConfig = read_config(folder)
        self.member: MemberChoice = choose_member(
            folder, src or str(folder), self.cfg.data, self.cfg.n_vq, model_kind
        )
        self.ck = Checkpoint(folder)
        check_tensors(self.ck, self.cfg)
        if self.cfg.lang.get("tie_word_embeddings"):
            log.info(
                "%s: language_config.tie_word_embeddings is true (the Qwen3 base's own setting); "
                "the GGUF's output layer is MOSS's text head lm_heads.0 all the same",
                self.cfg.path,
            )  # fmt: skip
        self.vocab: GGUFVocab = read_vocab(
            folder, self.cfg.lang, self.cfg.shape.n_vocab, self.cfg.path
        )
        self.order = official_order(self.ck, self.cfg)
        self.tok_files = [f for f in TOKENIZER_FILES if (folder / f).is_file()]
        self.fingerprint = self._fingerprint()
        self.staging = out / STAGING_DIR
        self.staging_ok = _stamp_matches(self.staging / STAMP_NAME, self.fingerprint)
        self.dir_files = _stamped_files(out / STAMP_NAME, self.fingerprint)
        self.dir_ok = self.dir_files is not None
        self.outputs = self._plan()

    # inputs ----------------------------------------------------------------------------------
    def _fingerprint(self) -> str:
        files = [self.cfg.path, *self.ck.files(), *(self.folder / f for f in self.tok_files)]
        for extra in ("model.safetensors.index.json", GENERATION_CONFIG):
            if (self.folder / extra).is_file():
                files.append(self.folder / extra)
        entries = []
        for f in files:
            st = f.stat()
            entries.append([f.name, st.st_size, st.st_mtime_ns])
        blob = json.dumps({"converter": CONVERTER_VERSION, "files": entries}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    @property
    def primary(self) -> str:
        return self.quants[0]

    def _tensor_bytes(self, outtype: str = "F16") -> tuple[int, int, int]:
        """(``outtype`` GGUF tensor bytes with alignment, 2-D params, 1-D params)."""
        total = n2 = n1 = 0
        for name in self.order:
            n = int(np.prod(self.ck.shape(name)))
            f32 = _stays_f32(name, self.ck.shape(name))
            total += -(-n * _OUT_BYTES["F32" if f32 else outtype] // 32) * 32
            if f32:
                n1 += n
            else:
                n2 += n
        return total, n2, n1

    def _vocab_bytes(self) -> int:
        v = self.vocab
        strings = sum(len(t.encode()) + 8 for t in v.tokens) + sum(
            len(m.encode()) + 8 for m in v.merges
        )
        return strings + 4 * len(v.toktypes) + (1 << 20)

    def _plan(self) -> list[_Output]:
        s = self.cfg.shape
        outs = [
            _Output(rel, 128 + int(np.prod(self.ck.shape(name))) * 2)
            for rel, name in npy_outputs(self.cfg.n_vq)
        ]
        outs += [
            _Output(f"tokenizer/{f}", (self.folder / f).stat().st_size) for f in self.tok_files
        ]
        outs.append(_Output("config.json", self.cfg.path.stat().st_size + 4096))
        data, n2, n1 = self._tensor_bytes()
        f16 = data + self._vocab_bytes()
        outs.append(_Output(gguf_file_name("F16"), f16, keep=self.keep_f16))
        for q in self.quants:
            if q in ("F32", "BF16"):
                outs.append(_Output(gguf_file_name(q), self._tensor_bytes(q)[0] + self._vocab_bytes()))
            elif q != "F16":
                outs.append(
                    _Output(
                        gguf_file_name(q), estimate_bytes(q, n2, n1, s.n_embd) + self._vocab_bytes()
                    )
                )
        if self.fused:
            prim = next(o for o in outs if o.rel == gguf_file_name(self.primary))
            extra = (2 + self.cfg.n_vq * self.cfg.ids.audio_rows) * s.n_embd * 2
            outs.append(_Output(_fused_name(self.primary), prim.size + extra))
        outs.append(_Output("config.yaml", 4096))
        return outs

    def finished(self, rel: str) -> Path | None:
        """Where a finished copy of ``rel`` is (staging first), None when it must be made."""
        if self.staging_ok and (self.staging / rel).is_file():
            return self.staging / rel
        if self.dir_files is not None and rel in self.dir_files and (self.out / rel).is_file():
            return self.out / rel
        return None

    def todo(self) -> list[_Output]:
        """Outputs to write in this run: the unfinished ones, and the F16 GGUF when a
        quantization (or the fused file of an F16 bundle) needs it as input."""
        need = [o for o in self.outputs if o.keep and self.finished(o.rel) is None]
        rels = {o.rel for o in need}
        f16 = gguf_file_name("F16")
        needs_f16 = any(gguf_file_name(q) in rels for q in self.quants if q not in DIRECT)
        needs_f16 = needs_f16 or (_fused_name("F16") in rels)
        if needs_f16 and f16 not in rels and self.finished(f16) is None:
            need.append(next(o for o in self.outputs if o.rel == f16))
        return sorted(need, key=self.outputs.index)

    def check_space(self) -> int:
        need = sum(o.size for o in self.todo())
        reclaim = 0
        if self.staging.is_dir() and not self.staging_ok:  # a stale partial run: removed first
            reclaim = sum(f.stat().st_size for f in self.staging.rglob("*") if f.is_file())
        free = free_bytes(self.out) + reclaim
        if need > free:
            raise ModelFileError(
                self.out,
                f"about {_gb(need)} of free disk space for the bundle",
                f"only {_gb(free)} free there",
            )
        return need


def _fused_name(quant: str) -> str:
    from ..model.fused import fused_path_for

    return fused_path_for(gguf_file_name(quant)).name


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


# bytes per weight of the types the converter writes itself
_OUT_BYTES = {"F32": 4, "F16": 2, "BF16": 2}


def _stays_f32(hf_name: str, shape: tuple[int, ...]) -> bool:
    """llama.cpp's converter keeps 1-D tensors and every ``*_norm.weight`` in F32."""
    gg = gguf_name(hf_name) or ""
    return len(shape) <= 1 or gg.endswith("_norm.weight")


def _read_stamp(path: Path, fingerprint: str) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("fingerprint") != fingerprint:
        return None
    return data


def _stamp_matches(path: Path, fingerprint: str) -> bool:
    return _read_stamp(path, fingerprint) is not None


def _stamped_files(path: Path, fingerprint: str) -> set[str] | None:
    """The files a finished run from the same inputs left in DIR (None: no such run)."""
    data = _read_stamp(path, fingerprint)
    if data is None:
        return None
    files = data.get("files")
    return {str(f) for f in files} if isinstance(files, list) else set()


# -- writing -------------------------------------------------------------------------------------


@contextlib.contextmanager
def _atomic(dest: Path) -> Iterator[Path]:
    """A temporary path next to ``dest``, renamed onto it when the block ends cleanly."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def _to_f16(a: np.ndarray) -> np.ndarray:
    """float16 as torch's ``.to(float16)`` and llama.cpp's converter round: through float32
    (exact for bf16 and f16), then round to nearest even."""
    if a.dtype == np.float16:
        return a
    return a.astype(np.float32).astype(np.float16)


def _to_f32(a: np.ndarray) -> np.ndarray:
    """float32: exact for bf16 and f16 sources (the bf16 bits widened)."""
    return a.astype(np.float32)


def _to_bf16(a: np.ndarray) -> np.ndarray:
    """bfloat16 bits (as uint16: a buffer cannot hold ml_dtypes' type): a bf16 source's
    unchanged; others through float32, rounded to nearest even as gguf-py's ``quants.BF16``."""
    import ml_dtypes

    bf16 = np.dtype(ml_dtypes.bfloat16)
    return (a if a.dtype == bf16 else a.astype(np.float32).astype(bf16)).view(np.uint16)


_CASTS = {"F32": _to_f32, "F16": _to_f16, "BF16": _to_bf16}
# general.file_type (enum llama_ftype) of the files the converter writes itself
_FILE_TYPES = {"F32": 0, "F16": 1, "BF16": 32}


class _Writer:
    def __init__(self, job: _Job, progress: Progress | None, n_threads: int) -> None:
        self.job = job
        self.progress = progress
        self.n_threads = n_threads

    def _tick(self, step: str, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(step, done, total)

    def _slabs(self, name: str) -> Iterator[np.ndarray]:
        yield from self.job.ck.iter_rows(name, _SLAB_BYTES)

    # embeddings/ and lm_heads/ ---------------------------------------------------------------
    def tables(self, todo: set[str]) -> None:
        items = [(rel, name) for rel, name in npy_outputs(self.job.cfg.n_vq) if rel in todo]
        total = sum(int(np.prod(self.job.ck.shape(n))) * 2 for _, n in items)
        done = 0
        for rel, name in items:
            with _atomic(self.job.staging / rel) as tmp, tmp.open("wb") as f:
                header = {"descr": "<f2", "fortran_order": False, "shape": self.job.ck.shape(name)}
                np.lib.format.write_array_header_1_0(f, header)
                for slab in self._slabs(name):
                    data = _to_f16(slab)
                    f.write(np.ascontiguousarray(data).data)
                    done += data.nbytes
                    self._tick("tables (.npy)", done, total)
        if not items:
            self._tick("tables (.npy)", 0, 0)

    # tokenizer/, config.json -------------------------------------------------------------------
    def small_files(self, todo: set[str]) -> None:
        for f in self.job.tok_files:
            rel = f"tokenizer/{f}"
            if rel in todo:
                with _atomic(self.job.staging / rel) as tmp:
                    shutil.copyfile(self.job.folder / f, tmp)
        if "config.json" in todo:
            with _atomic(self.job.staging / "config.json") as tmp:
                tmp.write_text(_config_json(self.job), encoding="utf-8")

    # the F16 GGUF (or F32, BF16) ------------------------------------------------------------------
    def direct_gguf(self, dest: Path, outtype: str = "F16") -> None:
        """What llama.cpp's converter writes with ``--outtype f16`` (``f32``, ``bf16``): 1-D
        tensors and norms F32, the matrices in ``outtype``."""
        import gguf

        from .qwen3_gguf import add_qwen3_hparams

        job, ck = self.job, self.job.ck
        step = f"{outtype} GGUF"
        plan = []
        for name in job.order:
            shape = ck.shape(name)
            kind = "F32" if _stays_f32(name, shape) else outtype
            qtype = gguf.GGMLQuantizationType[kind]
            nbytes = int(np.prod(shape)) * _OUT_BYTES[kind]
            plan.append((name, gguf_name(name), shape, kind, qtype, nbytes))
        n_params = sum(int(np.prod(p[2])) for p in plan)
        total = sum(p[5] for p in plan)
        done = 0
        with quiet_gguf(), gguf_writer_at(dest, "qwen3") as w:
            # the converter's key order: type, name, size label, hyper-parameters, file type,
            # quantization version, then the tokenizer
            w.add_type(gguf.GGUFType.MODEL)
            w.add_name(GGUF_MODEL_NAME)
            w.add_size_label(gguf.size_label(n_params, n_params, 0, 0))
            add_qwen3_hparams(
                w, job.cfg.shape, _FILE_TYPES[outtype], head_dim_keys=job.cfg.has_head_dim
            )
            w.add_quantization_version(gguf.GGML_QUANT_VERSION)
            add_vocab(w, job.vocab)
            for _, gg, shape, kind, qtype, nbytes in plan:
                w.add_tensor_info(
                    gg, shape, np.dtype(np.float32 if kind == "F32" else np.float16), nbytes,
                    raw_dtype=qtype,
                )  # fmt: skip
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_ti_data_to_file()
            fout = w.fout[0]
            w.write_padding(fout, fout.tell())
            for name, _gg, _, kind, _, nbytes in plan:
                written = 0
                for slab in self._slabs(name):
                    data = _CASTS[kind](slab)
                    fout.write(np.ascontiguousarray(data).data)
                    written += data.nbytes
                    done += data.nbytes
                    self._tick(step, done, total)
                if written != nbytes:
                    raise ModelFileError(
                        ck.file_of(name), f"{nbytes} bytes of {name!r}", f"read {written}"
                    )
                w.write_padding(fout, written)

    # quantized GGUFs ---------------------------------------------------------------------------
    def quantized(self, quant: str, src: Path, dest: Path, estimate: int) -> None:
        step = f"quantize {quant}"
        with _atomic(dest) as tmp:

            def poll() -> None:
                with contextlib.suppress(OSError):
                    self._tick(step, min(tmp.stat().st_size, estimate), estimate)

            quantize(src, tmp, quant, n_threads=self.n_threads, poll=poll)
            self._tick(step, estimate, estimate)

    def fused(self, src: Path, dest: Path) -> None:
        from .fused_writer import convert

        heads = self.job.finished("lm_heads/lm_head_text.npy")
        assert heads is not None
        convert(src, heads.parent, dest, ids=self.job.cfg.ids,
                progress=lambda what, d, t: self._tick("fused GGUF", d, t))  # fmt: skip


@contextlib.contextmanager
def rich_progress() -> Iterator[Progress]:
    """A progress callback drawing one rich bar per step (on stderr); for the CLI."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        TaskID,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.progress import Progress as Bars

    tasks: dict[str, TaskID] = {}
    with Bars(
        TextColumn("{task.description:<16}"), BarColumn(), DownloadColumn(), TimeElapsedColumn(),
        TimeRemainingColumn(), console=Console(stderr=True),
    ) as bars:  # fmt: skip

        def update(step: str, done: int, total: int) -> None:
            if step not in tasks:
                tasks[step] = bars.add_task(step, total=total or None)
            bars.update(tasks[step], completed=done, total=total or None)

        yield update


# -- config.yaml ---------------------------------------------------------------------------------

_CONFIG_HEAD = """\
# streamtts config written by `streamtts convert-hf` ({quant} backbone) from
# {source}
# Model: {kind} ({title}); its sampling defaults are in config.json ("sampling"), used for
# every sampling key this file does not set; max_new_tokens and n_ctx below are its own.
# Paths are relative to this file's folder. The codec is not converted: put the
# MOSS-Audio-Tokenizer-ONNX folder next to this one (`streamtts download` lays it out so),
# or point the two audio_*_onnx keys at it. See configs/default.yaml for every key.
backbone_gguf: {gguf}
embedding_dir: embeddings
lm_head_dir: lm_heads
tokenizer_dir: tokenizer
model_config_json: config.json
audio_backend: onnx
audio_encoder_onnx: ../MOSS-Audio-Tokenizer-ONNX/encoder.onnx
audio_decoder_onnx: ../MOSS-Audio-Tokenizer-ONNX/decoder.onnx
"""


# an F32 backbone is asked for exact float32 arithmetic: an f16 KV cache would round it away
_F32_KEYS = "kv_cache_type_k: f32\nkv_cache_type_v: f32\n"


def _config_yaml(job: _Job, gpu: bool) -> str:
    from ..core.family import MEMBERS

    head = _CONFIG_HEAD.format(
        quant=job.primary, source=job.folder.resolve(), gguf=gguf_file_name(job.primary),
        kind=job.member.kind, title=MEMBERS[job.member.kind].title,
    )  # fmt: skip
    if job.primary == "F32":
        head += _F32_KEYS
    return config_yaml(
        head, gpu=gpu, fused_gguf=_fused_name(job.primary) if job.fused else None,
        n_ctx=job.member.n_ctx, max_new_tokens=job.member.max_new_tokens,
    )  # fmt: skip


def _config_json(job: _Job) -> str:
    """The checkpoint's config.json with every token id the engine reads explicit (absent
    keys: the published defaults) and the member's keys (model_kind, sampling)."""
    data = dict(job.cfg.data)
    for key, value in msgspec.to_builtins(job.cfg.ids).items():
        data.setdefault(key, value)
    data.update(job.member.config_keys())
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


# -- the command ---------------------------------------------------------------------------------


def _parse_quants(quants: Sequence[str]) -> list[str]:
    out: list[str] = []
    for q in quants or ["Q4_K_M"]:
        p = parse_quant(q)
        if p not in out:
            out.append(p)
    return out


def _check_kind(name: str) -> None:
    from ..core.family import member
    from ..errors import ConfigError, InputError

    try:
        member(name.strip().lower())
    except InputError as exc:
        raise ConfigError(f"--model-kind: {exc}") from None


def _warn_f16(job: _Job) -> None:
    """F16 output for a member whose activations overflow float16: written as asked (a
    quantized type is made from it), but the engine refuses to run it (engine/assemble.py)."""
    from ..core.family import F16_OVERFLOW, MEMBERS

    m = MEMBERS[job.member.kind]
    if m.f16_overflows and job.primary == "F16":
        log.warning("%s as F16: the engine will refuse it: %s", m.title, F16_OVERFLOW)


def convert_hf(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    quants: Sequence[str] = ("Q4_K_M",),
    *,
    fused: bool = False,
    keep_f16: bool = False,
    n_threads: int = 0,
    gpu: bool | None = None,
    revision: str | None = None,
    fetcher: Any = None,
    progress: Progress | None = None,
    model_kind: str | None = None,
) -> ConvertResult:
    """Convert a MOSS-TTS-Delay checkpoint (folder or hub id) into the bundle in ``out``.

    quants: GGUF types to write, e.g. ``["Q4_K_M"]`` (default), ``["F16", "Q8_0"]``,
    ``["F32"]`` (the bf16 weights widened exactly), ``["BF16"]``; the first one is the
    config's backbone. model_kind: the family member (``core.family.MEMBERS``: moss-tts,
    moss-tts-v1.5, moss-ttsd, moss-voice-generator, moss-sound-effect); None: read from the
    source's name, else moss-tts with a warning. The bundle's config.json names it and
    carries its sampling defaults (a generation_config.json in the checkpoint wins). fused: also write ``streamtts convert``'s fused-heads
    GGUF of the first one. keep_f16: keep the F16 GGUF the quantizer reads (else deleted).
    n_threads: llama.cpp quantizer threads (0: all cores). gpu: config defaults for a GPU
    machine (None: detect). progress: ``(step, done, total)`` callback.
    Raises ConfigError / ModelFileError (naming the file and what was expected) before
    writing anything when an input is unusable or the disk is too small.
    """
    t0 = time.perf_counter()
    qs = _parse_quants(quants)  # a bad --quant fails before anything is read or fetched
    if model_kind is not None:  # and so does an unknown --model-kind
        _check_kind(model_kind)
    out_dir = Path(out).expanduser()
    if out_dir.exists() and not out_dir.is_dir():
        raise ModelFileError(out_dir, "an output folder", "it is a file")
    folder = resolve_source(src, revision=revision, fetcher=fetcher)
    job = _Job(folder, out_dir, qs, fused, keep_f16, src=os.fspath(src), model_kind=model_kind)
    _warn_f16(job)
    try:
        needed = job.check_space()
        result = ConvertResult(out_dir=out_dir, config_yaml=out_dir / "config.yaml", source=folder)
        result.needed_bytes = needed
        result.model_kind, result.sampling = job.member.kind, dict(job.member.sampling)
        _run(job, result, progress, n_threads, gpu)
    finally:
        job.ck.close()
    result.seconds = time.perf_counter() - t0
    log.info(
        "converted %s into %s in %.1f s (%d files written, %d already there)",
        folder, out_dir, result.seconds, len(result.written), len(result.skipped),
    )  # fmt: skip
    return result


def _start_staging(job: _Job) -> None:
    if job.staging.exists() and not job.staging_ok:
        log.info("removing %s (a partial run from other inputs)", job.staging)
        shutil.rmtree(job.staging)
    job.staging.mkdir(parents=True, exist_ok=True)
    stamp = {"fingerprint": job.fingerprint, "source": str(job.folder.resolve())}
    with _atomic(job.staging / STAMP_NAME) as tmp:
        tmp.write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
    job.staging_ok = True


@contextlib.contextmanager
def _timed(steps: dict[str, float], step: str) -> Iterator[None]:
    t = time.perf_counter()
    yield
    steps[step] = steps.get(step, 0.0) + time.perf_counter() - t


def _run(
    job: _Job, result: ConvertResult, progress: Progress | None, n_threads: int, gpu: bool | None
) -> None:
    todo = {o.rel for o in job.todo()}
    yaml_text = _config_yaml(job, _gpu_default() if gpu is None else gpu)
    # options (--fused, the first --quant, --model-kind) change these two: compared, not stamped
    for rel, text in (("config.yaml", yaml_text), ("config.json", _config_json(job))):
        current = job.finished(rel)
        if current is not None and current.read_text(encoding="utf-8") == text:
            todo.discard(rel)
        else:
            todo.add(rel)
    result.skipped = [o.rel for o in job.outputs if o.keep and o.rel not in todo]
    if not todo:
        log.info("%s already holds every output of this conversion", job.out)
        return
    _start_staging(job)
    w = _Writer(job, progress, n_threads)
    steps = result.step_seconds
    with _timed(steps, "tables"):
        w.tables(todo)
    with _timed(steps, "tokenizer+config"):
        w.small_files(todo)
    f16 = gguf_file_name("F16")
    for q in DIRECT:
        if gguf_file_name(q) in todo:
            with _timed(steps, f"{q.lower()}_gguf"):
                w.direct_gguf(job.staging / gguf_file_name(q), q)
    for q in job.quants:
        out = next(o for o in job.outputs if o.rel == gguf_file_name(q))
        if q not in DIRECT and out.rel in todo:
            src = job.finished(f16)
            assert src is not None  # todo() adds the F16 GGUF whenever a quantization needs it
            with _timed(steps, f"quantize_{q}"):
                w.quantized(q, src, job.staging / out.rel, out.size)
    fused_rel = _fused_name(job.primary)
    if job.fused and fused_rel in todo:
        src = job.finished(gguf_file_name(job.primary))
        assert src is not None
        with _timed(steps, "fused"):
            w.fused(src, job.staging / fused_rel)
    if "config.yaml" in todo:
        with _atomic(job.staging / "config.yaml") as tmp:
            tmp.write_text(yaml_text, encoding="utf-8")
    with _timed(steps, "commit"):
        _commit(job)
    result.written = [o.rel for o in job.outputs if o.keep and o.rel in todo]


def _gpu_default() -> bool:
    from .download import gpu_available

    return gpu_available()


def _commit(job: _Job) -> None:
    """Move every finished file from the staging folder into DIR, then stamp DIR."""
    stamp = job.out / STAMP_NAME
    if not job.dir_ok:
        # DIR's files from other inputs must not look finished while they are replaced
        stamp.unlink(missing_ok=True)
    keep = {o.rel for o in job.outputs if o.keep}
    done = set(job.dir_files or ())
    for f in sorted(job.staging.rglob("*")):
        if not f.is_file() or f.name == STAMP_NAME:
            continue
        rel = f.relative_to(job.staging).as_posix()
        if rel not in keep:  # the F16 GGUF when only the quantizer needed it
            f.unlink()
            continue
        dest = job.out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(f, dest)
        done.add(rel)
    info = {
        "fingerprint": job.fingerprint,
        "source": str(job.folder.resolve()),
        "converter": CONVERTER_VERSION,
        "files": sorted(r for r in done if (job.out / r).is_file()),
    }
    with _atomic(stamp) as tmp:
        tmp.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(job.staging)
