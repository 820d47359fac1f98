"""The header of a **qwen3** GGUF: its shape and metadata keys, as llama.cpp writes them.

Shared by ``streamtts convert-hf`` (which must match llama.cpp's ``convert_hf_to_gguf.py``
key for key) and the demo model writer (a qwen3 fed with embeddings only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

ARCH = "qwen3"


@dataclass(frozen=True)
class Qwen3Shape:
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int = 32768
    rope_theta: float = 1e6
    rms_eps: float = 1e-6

    def validate(self) -> None:
        for name in (
            "n_embd",
            "n_layer",
            "n_head",
            "n_head_kv",
            "head_dim",
            "n_ff",
            "n_vocab",
            "n_ctx_train",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"Qwen3Shape.{name} must be >= 1, got {getattr(self, name)}")
        if self.n_head % self.n_head_kv:
            raise ConfigError(
                f"n_head ({self.n_head}) must be a multiple of n_head_kv ({self.n_head_kv})"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even (RoPE), got {self.head_dim}")

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Name -> NumPy shape of every tensor random_qwen3_tensors() returns."""
        e, q, kv = self.n_embd, self.n_head * self.head_dim, self.n_head_kv * self.head_dim
        shapes: dict[str, tuple[int, ...]] = {"output_norm.weight": (e,)}
        for i in range(self.n_layer):
            b = f"blk.{i}."
            shapes[b + "attn_norm.weight"] = (e,)
            shapes[b + "attn_q.weight"] = (q, e)
            shapes[b + "attn_k.weight"] = (kv, e)
            shapes[b + "attn_v.weight"] = (kv, e)
            shapes[b + "attn_output.weight"] = (e, q)
            shapes[b + "attn_q_norm.weight"] = (self.head_dim,)
            shapes[b + "attn_k_norm.weight"] = (self.head_dim,)
            shapes[b + "ffn_norm.weight"] = (e,)
            shapes[b + "ffn_gate.weight"] = (self.n_ff, e)
            shapes[b + "ffn_up.weight"] = (self.n_ff, e)
            shapes[b + "ffn_down.weight"] = (e, self.n_ff)
        return shapes


def add_qwen3_hparams(
    w: Any, shape: Qwen3Shape, file_type: int, *, head_dim_keys: bool = True
) -> None:
    """The hyper-parameter keys of a qwen3 GGUF, in the order llama.cpp's
    ``convert_hf_to_gguf.py`` writes them (``TextModel.set_gguf_parameters`` for a Qwen3
    config without rope scaling); ``streamtts convert-hf`` relies on this order. The
    converter writes key/value_length only when the HF config names ``head_dim``."""
    w.add_block_count(shape.n_layer)
    w.add_context_length(shape.n_ctx_train)
    w.add_embedding_length(shape.n_embd)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    if head_dim_keys:
        w.add_key_length(shape.head_dim)
        w.add_value_length(shape.head_dim)
    w.add_file_type(file_type)


def add_qwen3_header(w: Any, shape: Qwen3Shape, name: str, file_type: int) -> None:
    """The KV metadata llama.cpp needs to load a qwen3 model fed with embeddings only."""
    w.add_name(name)
    add_qwen3_hparams(w, shape, file_type)
    w.add_vocab_size(shape.n_vocab)
    w.add_rope_dimension_count(shape.head_dim)
    # no tokenizer: the model loads with n_vocab dummy tokens (contract section 9)
    w.add_tokenizer_model("none")
