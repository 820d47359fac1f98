"""A NumPy re-implementation of llama.cpp's qwen3 graph, for small models.

Why: the demo model's head weights are calibrated against the backbone's final
hidden state (its RMS grows with depth), which must be known when the model
is written, before llama.cpp ever loads it; tests also use it to check the
demo's behaviour without the native layer. Not for serving: float32 NumPy,
one sequence, KV cache in Python lists.

The graph (as llama.cpp builds it for ``qwen3``): per layer, RMSNorm ->
q/k/v projections -> per-head RMSNorm of q and k -> NEOX RoPE -> causal GQA
attention (query head h uses KV head h // (n_head / n_head_kv)) -> output
projection -> residual; RMSNorm -> SwiGLU FFN -> residual; final RMSNorm.
Tensors are the GGUF names and NumPy (out, in) shapes of ``gguf_writer``.
"""

from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """RMSNorm over the last axis, times ``weight``."""
    out: np.ndarray = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight
    return out


class Qwen3NumpyForward:
    """Incremental forward of one sequence: feed embedding rows, get final hidden states."""

    def __init__(
        self,
        tensors: dict[str, np.ndarray],
        *,
        n_head: int,
        n_head_kv: int,
        head_dim: int,
        rope_theta: float = 1e6,
        eps: float = 1e-6,
    ) -> None:
        self.t = tensors
        self.n_head, self.n_head_kv, self.head_dim = n_head, n_head_kv, head_dim
        self.eps = eps
        self.n_layer = 1 + max(int(k.split(".")[1]) for k in tensors if k.startswith("blk."))
        half = head_dim // 2
        self._inv_freq = rope_theta ** (-np.arange(half, dtype=np.float64) * 2.0 / head_dim)
        self._k: list[np.ndarray] = [np.zeros((0, n_head_kv, head_dim), np.float32)] * self.n_layer
        self._v: list[np.ndarray] = [np.zeros((0, n_head_kv, head_dim), np.float32)] * self.n_layer
        self.pos = 0

    def _rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """NEOX RoPE: rotate the two halves of each head. x (n, heads, head_dim)."""
        half = self.head_dim // 2
        ang = pos[:, None].astype(np.float64) * self._inv_freq[None, :]  # (n, half)
        c = np.cos(ang)[:, None, :].astype(np.float32)
        s = np.sin(ang)[:, None, :].astype(np.float32)
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)

    def forward(self, embd: np.ndarray) -> np.ndarray:
        """Rows (n, H) at the next n positions -> their final hidden states (n, H)."""
        x = np.asarray(embd, dtype=np.float32).reshape(-1, embd.shape[-1])
        n = x.shape[0]
        pos = np.arange(self.pos, self.pos + n)
        hd, nh, nkv = self.head_dim, self.n_head, self.n_head_kv
        group = nh // nkv
        total = self.pos + n
        # causal mask of the new rows over all cached + new rows
        mask = np.where(np.arange(total)[None, :] <= pos[:, None], 0.0, -np.inf).astype(np.float32)
        for i in range(self.n_layer):
            w = self.t
            b = f"blk.{i}."
            h = rms_norm(x, w[b + "attn_norm.weight"], self.eps)
            q = (h @ w[b + "attn_q.weight"].T).reshape(n, nh, hd)
            k = (h @ w[b + "attn_k.weight"].T).reshape(n, nkv, hd)
            v = (h @ w[b + "attn_v.weight"].T).reshape(n, nkv, hd)
            q = self._rope(rms_norm(q, w[b + "attn_q_norm.weight"], self.eps), pos)
            k = self._rope(rms_norm(k, w[b + "attn_k_norm.weight"], self.eps), pos)
            self._k[i] = np.concatenate([self._k[i], k.astype(np.float32)])
            self._v[i] = np.concatenate([self._v[i], v.astype(np.float32)])
            kk = np.repeat(self._k[i], group, axis=1)  # (total, nh, hd)
            vv = np.repeat(self._v[i], group, axis=1)
            scores = np.einsum("nhd,thd->hnt", q, kk) / np.float32(np.sqrt(hd)) + mask[None]
            scores -= scores.max(axis=-1, keepdims=True)
            p = np.exp(scores)
            p /= p.sum(axis=-1, keepdims=True)
            att = np.einsum("hnt,thd->nhd", p, vv).reshape(n, nh * hd)
            x = x + att @ w[b + "attn_output.weight"].T
            h = rms_norm(x, w[b + "ffn_norm.weight"], self.eps)
            gate = h @ w[b + "ffn_gate.weight"].T
            up = h @ w[b + "ffn_up.weight"].T
            x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w[b + "ffn_down.weight"].T
        self.pos = total
        return rms_norm(x, self.t["output_norm.weight"], self.eps)
