"""Zero-cost stand-ins for the backbone and the codec (``streamtts bench --null-backbone /
--null-codec``): the engine runs its own work -- the scheduler, sampling, the state machines,
the frame routing and delivery -- around parts that cost nothing, as at GPU speeds. The
backbone hands back head logits as a GPU's fused heads do (lent or copied as the bridge does);
the codec gives silence of the right length."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..constants import FRAME_SAMPLES
from ..kernels.tick_pool import MIN_ROWS

__all__ = ["NullBackbone", "NullCodec", "null_backbone_factory", "null_codec_factory"]


class NullBackbone:
    """Zero-cost stand-in for the llama.cpp backbone (same interface as ``Backbone``)."""

    def __init__(self, n_embd: int, n_ctx_seq: int, n_vocab: int = 151936, seed: int = 0) -> None:
        self.n_embd = n_embd
        self.n_ctx_seq = n_ctx_seq
        self.n_vocab = n_vocab
        self._hidden_src = np.random.default_rng(seed).standard_normal((64, n_embd)).astype(np.float32)
        self._bufs: tuple[Any, ...] = ()
        self._pool: int | None = None
        self._lib: Any = None
        self._idx = np.zeros(0, dtype=np.int64)
        self.lent_logits = 0
        self._lent_rows = np.zeros((0, 0), dtype=np.float32)
        self._lend_block = 0
        self._lend_half = 0

    def bind(self, embd: Any, pos: Any, seq: Any, output: Any, hidden_out: Any, logits_out: Any) -> None:
        self._bufs = (embd, pos, seq, output, hidden_out, logits_out)
        self._idx = np.zeros(logits_out.shape[0], dtype=np.int64)
        # Fused heads (logits hold the audio rows too): head logits as a GPU would hand them
        # back, one copied row per stream (std 2, like the demo model's); the 2 text logits 0.
        n_cols = logits_out.shape[1]
        self._logits_src = np.zeros((64, n_cols), dtype=np.float32)
        if n_cols > 2:
            self._logits_src[:, 2:] = 2.0 * np.random.default_rng(1).standard_normal((64, n_cols - 2), dtype=np.float32)
        # rows to lend, as llama.cpp lends its output buffer: two blocks taken in turn, so a
        # step reads rows the last one did not leave in cache (as a GPU's fresh rows)
        # (a block of half the engine's output rows: a lent step has one row per running stream)
        self._lend_block = max(1, logits_out.shape[0] // 2)
        self._lent_rows = np.take(self._logits_src, np.arange(2 * self._lend_block) % 64, axis=0)

    def set_tick_pool(self, pool: int | None) -> None:
        """As the bridge: the output copy cut across the tick's threads."""
        from ..model._llama import load_bridge

        self._pool = pool
        self._lib = load_bridge() if pool else None

    def decode_bound(self, n_rows: int, want_hidden: bool = True, out_offset: int = 0, lend: bool = False) -> int:
        _, pos, _, output, hidden, logits = self._bufs
        self.lent_logits = 0
        sel = np.flatnonzero(output[:n_rows])
        n = sel.size
        if n == 0:
            return 0
        if lend and not out_offset and n <= self._lend_block and not (want_hidden and hidden is not None):
            # the rows where they lie, as the bridge lends them (stt_decode_lend): nothing copied
            self._lend_half ^= 1
            rows = self._lent_rows[self._lend_half * self._lend_block :]
            rows[:n, :2] = 0.0  # fresh text logits (a forced length masks one of them)
            self.lent_logits = rows.ctypes.data
            return n
        o = slice(out_offset, out_offset + n)
        if self._pool and self._lib is not None and n >= MIN_ROWS and not (want_hidden and hidden is not None):
            # the logits rows copied as the bridge copies them (stt_decode with a pool)
            idx = np.remainder(pos[sel], 64, out=self._idx[:n])
            dst = logits[o]
            self._lib.stt_pool_gather_rows(
                self._pool, n, self._logits_src.ctypes.data, self._logits_src.shape[1], idx.ctypes.data,
                dst.ctypes.data, logits.shape[1], logits.shape[1],
            )  # fmt: skip
            return n
        # mode="clip": a plain gather, as cheap as the bridge's copy out of llama.cpp (the
        # default mode makes a buffered copy with out=, three times the cost)
        if want_hidden and hidden is not None:
            np.take(self._hidden_src, pos[sel] % 64, axis=0, out=hidden[o], mode="clip")
        np.take(self._logits_src, pos[sel] % 64, axis=0, out=logits[o], mode="clip")
        return n

    def copy_logits_row(self, i: int, out: np.ndarray) -> None:
        out[:] = 0.0

    def seq_rm(self, seq: int, start: int = 0) -> None:
        pass

    def seq_state(self, seq: int) -> np.ndarray:
        return np.zeros(64, dtype=np.uint8)  # the prefix cache's bookkeeping still runs

    def load_seq_state(self, seq: int, state: np.ndarray) -> None:
        pass

    def set_logit_columns(self, cols: Any) -> None:
        pass

    def close(self) -> None:
        pass


class NullCodec:
    """Zero-cost stand-in for the codec: silence of the right length, nothing decoded (what
    is left is the engine's own work: sampling, state machines, routing, delivery)."""

    kind = "null"
    max_batch = 1 << 16

    def room(self) -> int | None:
        return None

    def knows(self, rid: int) -> bool:
        return False

    def decode(self, jobs: list[Any]) -> list[np.ndarray]:
        return [np.zeros(j.codes.shape[0] * FRAME_SAMPLES, dtype=np.float32) for j in jobs]

    def forget(self, rid: int) -> None:
        pass

    def warm_up(self) -> None:
        pass


def null_codec_factory(cfg: Any, ids: Any) -> NullCodec:
    return NullCodec()


def null_backbone_factory(params: Any) -> NullBackbone:
    """Build a NullBackbone shaped like the model the params point at."""
    from pathlib import Path

    from .assemble import gguf_n_embd

    return NullBackbone(gguf_n_embd(Path(params.model_path)), params.n_ctx // max(params.n_seq_max, 1))
