"""The model's NumPy tables: summed input embeddings and the audio heads.

The official layout ships float16 ``.npy`` files. ``embed_tokens`` (about
1.2 GB for the real model) is memory-mapped and only the rows a step uses are
upcast. The 32 audio embedding tables and the 32 audio heads are needed every
step, so they are stacked once into float32 arrays (one gather, one matmul).

Arithmetic mirrors the official pipeline so greedy decoding matches it bit
for bit: embeddings are summed in float32 in the order text, codebook 0..31;
audio logits are ``hidden @ stacked_heads.T`` in float32.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np

from ..core.tokens import TokenIds
from ..errors import ModelFileError

log = logging.getLogger(__name__)


def load_npy(path: Path, *, rows: int | None = None, cols: int | None = None, mmap: bool = False) -> np.ndarray:
    """Load a 2-D float16/float32 table, checking its shape; errors name the file."""
    want = f"a 2-D float16 table of shape ({rows if rows is not None else 'N'}, {cols if cols is not None else 'H'})"
    if not path.is_file():
        raise ModelFileError(path, want, "file not found")
    try:
        arr = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ModelFileError(path, want, f"not a readable .npy file: {exc}") from exc
    if arr.ndim != 2 or arr.dtype not in (np.float16, np.float32):
        raise ModelFileError(path, want, f"got shape {arr.shape} dtype {arr.dtype}")
    if (rows is not None and arr.shape[0] != rows) or (cols is not None and arr.shape[1] != cols):
        raise ModelFileError(path, want, f"got shape {arr.shape}")
    table: np.ndarray = arr
    return table


def _stack_tables(paths: list[Path], rows: int, cols: int) -> np.ndarray:
    out = np.empty((len(paths) * rows, cols), dtype=np.float32)
    for k, p in enumerate(paths):
        out[k * rows : (k + 1) * rows] = load_npy(p, rows=rows, cols=cols, mmap=True)
    return out


class Embedder:
    """Summed input embedding of (B, 1 + n_vq) id rows."""

    def __init__(self, embedding_dir: str | Path, ids: TokenIds, *, n_embd: int | None = None) -> None:
        d = Path(embedding_dir)
        self.ids = ids
        self.text = load_npy(d / "embed_tokens.npy", cols=n_embd, mmap=True)
        self.n_embd = int(self.text.shape[1])
        self.n_vq = ids.n_vq
        self.rows = ids.audio_rows
        paths = [d / f"emb_ext_{k:02d}.npy" for k in range(ids.n_vq)]
        self.audio = _stack_tables(paths, self.rows, self.n_embd)
        self._offsets = (np.arange(self.n_vq, dtype=np.int64) * self.rows)[None, :]
        self._cap = 0
        self._alloc(8)
        log.info(
            "embeddings: text %s (memory-mapped), audio %d x %d x %d float32",
            self.text.shape, self.n_vq, self.rows, self.n_embd,
        )

    def _alloc(self, cap: int) -> None:
        self._cap = cap
        self._gather = np.empty((cap, 1 + self.n_vq, self.n_embd), dtype=np.float32)
        self._idx = np.empty((cap, self.n_vq), dtype=np.int64)

    def check_ids(self, rows: np.ndarray) -> None:
        """Validate id ranges once (prompts); the step path trusts the state machine."""
        if rows.ndim != 2 or rows.shape[1] != 1 + self.n_vq:
            raise ValueError(f"expected (S, {1 + self.n_vq}) id rows, got {rows.shape}")
        t = rows[:, 0]
        if t.size and (t.min() < 0 or t.max() >= self.text.shape[0]):
            raise ValueError(f"text id out of range [0, {self.text.shape[0]})")
        a = rows[:, 1:]
        if a.size and (a.min() < 0 or a.max() >= self.rows):
            raise ValueError(f"audio code out of range [0, {self.rows})")

    def embed_rows(self, rows: np.ndarray, chunk: int = 64) -> np.ndarray:
        """Prompt embeddings, allocating its own scratch: safe off the engine thread."""
        out = np.empty((rows.shape[0], self.n_embd), dtype=np.float32)
        g = np.empty((min(chunk, max(rows.shape[0], 1)), 1 + self.n_vq, self.n_embd), dtype=np.float32)
        for s in range(0, rows.shape[0], chunk):
            r = rows[s : s + chunk]
            gv = g[: r.shape[0]]
            gv[:, 0] = self.text[r[:, 0]]
            np.take(self.audio, r[:, 1:] + self._offsets, axis=0, out=gv[:, 1:], mode="clip")
            np.add.reduce(gv, axis=1, out=out[s : s + r.shape[0]])
        return out

    def __call__(self, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """rows (B, 1 + n_vq) int64 -> (B, n_embd) float32 (written into ``out`` when given).

        Uses scratch buffers owned by this object: call it from one thread only (the engine's).
        """
        b = rows.shape[0]
        if b > self._cap:
            self._alloc(max(b, 2 * self._cap))
        g = self._gather[:b]
        idx = self._idx[:b]
        np.add(rows[:, 1:], self._offsets, out=idx)
        g[:, 0] = self.text[rows[:, 0]]
        # ids are checked where they enter (check_ids; sampled codes are in range): "clip"
        # spares the buffered copy that the default "raise" makes with out=
        np.take(self.audio, idx, axis=0, out=g[:, 1:], mode="clip")
        if out is None:
            out = np.empty((b, self.n_embd), dtype=np.float32)
        # Reducing over a non-contiguous axis adds rows in order (text, cb0, ..., cb31),
        # the same float32 order as the official pipeline.
        np.add.reduce(g, axis=1, out=out)
        return out


# Columns per BLAS call of the audio heads (see AudioHeads): every logit comes from a call of
# the same shape at the same place in it, however the calls are shared between threads.
_CHUNK = 2048


def _matmul_chunks(hidden: np.ndarray, wt: np.ndarray, out: np.ndarray) -> None:
    """out = hidden @ wt, one BLAS call per _CHUNK columns (wt starts on a chunk boundary)."""
    for x in range(0, wt.shape[1], _CHUNK):
        np.matmul(hidden, wt[:, x : x + _CHUNK], out=out[:, x : x + _CHUNK])


class _Helper(threading.Thread):
    """One thread that runs a part of the heads matmul when told, and sleeps otherwise."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._go = threading.Event()
        self.done = threading.Event()
        self._job: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.error: BaseException | None = None

    def submit(self, hidden: np.ndarray, wt: np.ndarray, out: np.ndarray) -> None:
        self._job = (hidden, wt, out)
        self.done.clear()
        self._go.set()

    def stop(self) -> None:
        self._job = None
        self._go.set()

    def run(self) -> None:
        while True:
            self._go.wait()
            self._go.clear()
            job = self._job
            if job is None:
                return
            try:
                _matmul_chunks(*job)
            except BaseException as exc:  # handed to the caller, which raises it
                self.error = exc
            self.done.set()


class AudioHeads:
    """Audio logits for all n_vq codebooks in one matmul: (B, H) -> (B, n_vq, rows).

    ``threads`` > 1 cuts the matmul by columns into that many parts, run at once by the
    calling thread and ``threads - 1`` helper threads, each part one single-threaded BLAS
    call. Why not BLAS threads: OpenBLAS's workers spin for a while after each call, on the
    cores llama.cpp's threads need for the next decode (contract section 9); these helpers
    sleep on an event.

    Same bits for any ``threads``, by construction: the columns are always computed in calls
    of ``_CHUNK`` columns starting at multiples of ``_CHUNK`` (one thread or several), and
    the parts are whole chunks. A BLAS kernel may give a column other bits depending on its
    place in the call (OpenBLAS's Haswell/AVX2 sgemm computes a call's first panel in
    another order: cutting one call in 64-aligned parts changed 0.4-0.8 % of the logits
    there, none with its SkylakeX kernels), never for the same call. This holds while BLAS
    runs each call on one thread (``blas_threads: 1``, the engine's setting); more BLAS
    threads split a call as OpenBLAS sees fit. Cost against one call (one thread, median
    of 15, H 1024/2048, B 1/4/8, both kernel sets, a shared 2-core machine): -31 % to
    +25 %, faster in 10 of 12 cases.
    """

    def __init__(self, lm_head_dir: str | Path, ids: TokenIds, n_embd: int, *, threads: int = 1) -> None:
        d = Path(lm_head_dir)
        self.n_vq = ids.n_vq
        self.rows = ids.audio_rows
        self.pad = ids.audio_pad_code
        paths = [d / f"lm_head_audio_{k:02d}.npy" for k in range(ids.n_vq)]
        self.weight = _stack_tables(paths, self.rows, n_embd)  # (n_vq * rows, H)
        self._wt = self.weight.T
        self._text_path = d / "lm_head_text.npy"
        self._text: np.ndarray | None = None
        self.n_embd = n_embd
        total = self.n_vq * self.rows
        n = max(1, min(threads, total // _CHUNK))
        # parts of whole chunks (strictly increasing cuts: each part is >= 1 chunk wide)
        self._cuts = [0, *(_CHUNK * round(total * i / n / _CHUNK) for i in range(1, n)), total]
        self._helpers = [_Helper(f"streamtts-heads-{i}") for i in range(1, n)]
        for t in self._helpers:
            t.start()
        log.info("audio heads: %d x %d x %d float32, %d thread(s)", self.n_vq, self.rows, n_embd, n)

    def __call__(self, hidden: np.ndarray, out: np.ndarray) -> np.ndarray:
        """hidden (B, H) float32; out (>=B, n_vq * rows) float32 -> view (B, n_vq, rows)."""
        b = hidden.shape[0]
        o = out[:b]
        if not self._helpers:
            _matmul_chunks(hidden, self._wt, o)
        else:
            c = self._cuts
            for i, t in enumerate(self._helpers, start=1):
                t.submit(hidden, self._wt[:, c[i] : c[i + 1]], o[:, c[i] : c[i + 1]])
            _matmul_chunks(hidden, self._wt[:, : c[1]], o[:, : c[1]])
            for t in self._helpers:
                t.done.wait()
                if t.error is not None:
                    err, t.error = t.error, None
                    raise err
        return o.reshape(b, self.n_vq, self.rows)

    def close(self) -> None:
        """Stop the helper threads (idempotent)."""
        for t in self._helpers:
            t.stop()
        self._helpers = []

    def text_logits(self, hidden: np.ndarray) -> np.ndarray:
        """Full text-head logits for one hidden state (memory-mapped; only needed outside audio mode)."""
        if self._text is None:
            self._text = load_npy(self._text_path, cols=self.n_embd, mmap=True)
        return np.asarray(self._text @ hidden.astype(self._text.dtype), dtype=np.float32)
