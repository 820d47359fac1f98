"""Decoder weights read from a MOSS-Audio-Tokenizer checkpoint by their official names.

Every tensor the decoder needs is checked up front (name and shape, from the safetensors
headers, no data read), so a wrong checkpoint fails before a long build with an error
naming the file and the tensor expected. Encoder tensors are never read.

What the graph gets is *folded* (float32, transposed for ``x @ W``), each change exact up
to float rounding:

- weight-normalised 1x1 convolutions become plain matrices, ``w = g * v / ||v||`` with
  the norm over every dimension but the first (``parametrizations.weight.original0/1``,
  or ``weight_g`` / ``weight_v`` from older PyTorch, or an already plain ``weight``);
- the query rows of ``in_projs`` are scaled by ``1/sqrt(head_dim)`` (the attention scale);
- the query and key rows of each head are de-interleaved (``0 2 4 .. 1 3 5 ..``): the
  official RoPE rotates interleaved pairs, the graph rotates the two halves, and a score
  ``q . k`` does not change when both are permuted alike (keys in the streaming state are
  stored in this order);
- ``layer_scale_{1,2}`` are multiplied into ``out_projs`` / ``linear2``;
- an ``output_proj`` followed by a ``PatchedPretransform`` has its columns reordered so
  the patch becomes a plain reshape.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...closing import Closing
from ...constants import CODEC_DECODER_PREFIXES
from ...convert.checkpoint import Checkpoint
from ...errors import ModelFileError
from .arch import CodecArch, StageArch

__all__ = ["DecoderWeights", "LayerWeights", "QuantizerWeights", "expected_tensors"]

#: One tensor the decoder needs: its accepted names (first = official) and shape.
_Spec = tuple[tuple[str, ...], tuple[int, ...]]


@dataclass(frozen=True)
class LayerWeights:
    norm1_w: np.ndarray
    norm1_b: np.ndarray
    norm2_w: np.ndarray
    norm2_b: np.ndarray
    qkv: np.ndarray  # (d, 3d)
    out: np.ndarray  # (d, d)
    ff1: np.ndarray  # (d, ffn)
    ff2: np.ndarray  # (ffn, d)


@dataclass(frozen=True)
class QuantizerWeights:
    codebooks: np.ndarray  # (n_q * size, codebook_dim): codebook i at rows i*size ..
    out_w: np.ndarray | None  # (n_q, 1, codebook_dim, rvq_dim)
    out_b: np.ndarray | None  # (n_q, 1, 1, rvq_dim)
    proj_w: np.ndarray | None  # (rvq_dim, output_dim)
    proj_b: np.ndarray | None  # (output_dim,)


def _wn_specs(prefix: str, out: int, inp: int) -> list[_Spec]:
    """A weight-normalised 1x1 conv: g and v (either naming) and the bias."""
    return [
        ((f"{prefix}.parametrizations.weight.original0", f"{prefix}.weight_g"), (out, 1, 1)),
        ((f"{prefix}.parametrizations.weight.original1", f"{prefix}.weight_v"), (out, inp, 1)),
        ((f"{prefix}.bias",), (out,)),
    ]


def _layer_prefix(st: StageArch, layer: int) -> str:
    return f"decoder.{st.index}.transformer.layers.{layer}."


def _layer_specs(st: StageArch, layer: int) -> list[_Spec]:
    p, d, f = _layer_prefix(st, layer), st.d_model, st.ffn_dim
    specs: list[_Spec] = [
        ((p + "norm1.weight",), (d,)),
        ((p + "norm1.bias",), (d,)),
        ((p + "norm2.weight",), (d,)),
        ((p + "norm2.bias",), (d,)),
        (
            (
                p + "self_attn.in_projs.0.weight",
                p + "self_attn.in_proj_weight",
                p + "self_attn.in_proj.weight",
            ),
            (3 * d, d),
        ),
        ((p + "self_attn.out_projs.0.weight", p + "self_attn.out_proj.weight"), (d, d)),
        ((p + "linear1.weight",), (f, d)),
        ((p + "linear2.weight",), (d, f)),
    ]
    if st.layer_scale:
        specs += [((p + "layer_scale_1.scale",), (d,)), ((p + "layer_scale_2.scale",), (d,))]
    return specs


def expected_tensors(arch: CodecArch) -> list[_Spec]:
    """Every tensor the decoder reads (accepted names, shape)."""
    q = arch.quantizer
    specs: list[_Spec] = []
    for i in range(q.n_q):
        p = f"quantizer.quantizers.{i}"
        specs.append(((f"{p}.codebook.weight",), (q.codebook_size, q.codebook_dim)))
        if q.has_out_proj:
            specs += _wn_specs(f"{p}.out_proj", q.rvq_dim, q.codebook_dim)
    if q.has_output_proj:
        specs += _wn_specs("quantizer.output_proj", q.output_dim, q.rvq_dim)
    for st in arch.stages:
        if st.has_input_proj:
            specs.append(((f"decoder.{st.index}.input_proj.weight",), (st.d_model, st.input_dim)))
        if st.has_output_proj:
            specs.append(((f"decoder.{st.index}.output_proj.weight",), (st.output_dim, st.d_model)))
        for layer in range(st.num_layers):
            specs += _layer_specs(st, layer)
    return specs


def _rope_perm(heads: int, head_dim: int) -> np.ndarray:
    """Row order that de-interleaves every head: (0 2 4 .. 1 3 5 ..) within each head."""
    within = np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])
    perm: np.ndarray = (np.arange(heads)[:, None] * head_dim + within[None, :]).reshape(-1)
    return perm


def _patch_perm(channels: int, patch: int) -> np.ndarray:
    """Column order making ``(d, h)``-ordered channels ``(h, d)``-ordered (a patch = reshape)."""
    d = channels // patch
    new = np.arange(channels)
    return (new % d) * patch + new // d


class DecoderWeights(Closing):
    """The checkpoint in ``folder``, checked against ``arch``; hands out folded weights."""

    def __init__(self, folder: str | Path, arch: CodecArch) -> None:
        self.folder = Path(folder)
        self.arch = arch
        self.ck = Checkpoint(self.folder, CODEC_DECODER_PREFIXES)  # the encoder's shards may be absent
        try:
            self._names = self._check()
        except BaseException:
            self.ck.close()
            raise

    def close(self) -> None:
        self.ck.close()

    def _check(self) -> dict[str, str]:
        """Official name -> the name present; raises on the first absent or misshaped tensor."""
        present = set(self.ck.names())
        specs = expected_tensors(self.arch)
        # a misnamed tensor is one that nothing expects: the near misses come from those
        unclaimed = sorted(present - {n for names, _ in specs for n in names})
        found: dict[str, str] = {}
        for names, shape in specs:
            name = next((n for n in names if n in present), None)
            if name is None:
                hint = difflib.get_close_matches(names[0], unclaimed, n=1, cutoff=0.85)
                where = self.ck.files()[0] if len(self.ck.files()) == 1 else self.folder
                also = f" or {', '.join(repr(n) for n in names[1:])}" if len(names) > 1 else ""
                problem = f"absent; the checkpoint has {hint[0]!r}" if hint else "absent"
                raise ModelFileError(
                    where,
                    f"tensor {names[0]!r}{also} of shape {shape} "
                    f"(the decoder described by {self.arch.path})",
                    problem,
                )
            got = self.ck.shape(name)
            if got != shape:
                raise ModelFileError(
                    self.ck.file_of(name),
                    f"tensor {name!r} of shape {shape} (the decoder described by {self.arch.path})",
                    f"it is {got}",
                )
            found[names[0]] = name
        return found

    def _get(self, official: str) -> np.ndarray:
        return self.ck.get_f32(self._names[official])

    def _conv1x1(self, prefix: str) -> tuple[np.ndarray, np.ndarray]:
        """A weight-normalised 1x1 conv as (W (out, in), bias (out,))."""
        g = self._get(f"{prefix}.parametrizations.weight.original0").astype(np.float64)
        v = self._get(f"{prefix}.parametrizations.weight.original1").astype(np.float64)
        norm = np.sqrt((v * v).sum(axis=(1, 2), keepdims=True))
        w = (g * v / norm)[:, :, 0].astype(np.float32)
        return w, self._get(f"{prefix}.bias")

    def quantizer(self) -> QuantizerWeights:
        q = self.arch.quantizer
        books = np.empty((q.n_q * q.codebook_size, q.codebook_dim), dtype=np.float32)
        out_w = out_b = proj_w = proj_b = None
        if q.has_out_proj:
            out_w = np.empty((q.n_q, 1, q.codebook_dim, q.rvq_dim), dtype=np.float32)
            out_b = np.empty((q.n_q, 1, 1, q.rvq_dim), dtype=np.float32)
        for i in range(q.n_q):
            p = f"quantizer.quantizers.{i}"
            books[i * q.codebook_size : (i + 1) * q.codebook_size] = self._get(
                f"{p}.codebook.weight"
            )
            if out_w is not None and out_b is not None:
                w, b = self._conv1x1(f"{p}.out_proj")
                out_w[i, 0] = w.T
                out_b[i, 0, 0] = b
        if q.has_output_proj:
            w, proj_b = self._conv1x1("quantizer.output_proj")
            proj_w = np.ascontiguousarray(w.T)
        return QuantizerWeights(books, out_w, out_b, proj_w, proj_b)

    def input_proj(self, st: StageArch) -> np.ndarray | None:
        """(input_dim, d_model), or None where the official model has an identity."""
        if not st.has_input_proj:
            return None
        return np.ascontiguousarray(self._get(f"decoder.{st.index}.input_proj.weight").T)

    def output_proj(self, st: StageArch, patch: int | None) -> np.ndarray | None:
        """(d_model, output_dim), columns reordered for a following patch of ``patch``."""
        if not st.has_output_proj:
            return None
        w = self._get(f"decoder.{st.index}.output_proj.weight").T
        if patch:
            w = w[:, _patch_perm(st.output_dim, patch)]
        return np.ascontiguousarray(w)

    def layer(self, st: StageArch, layer: int) -> LayerWeights:
        p = _layer_prefix(st, layer)
        d, hd = st.d_model, st.head_dim
        w_in = self._get(p + "self_attn.in_projs.0.weight")  # (3d, d): q, k, v stacked
        perm = _rope_perm(st.num_heads, hd)
        q = w_in[:d][perm] * np.float32(1.0 / math.sqrt(hd))
        k = w_in[d : 2 * d][perm]
        qkv = np.concatenate([q, k, w_in[2 * d :]]).T
        out = self._get(p + "self_attn.out_projs.0.weight").T
        ff2 = self._get(p + "linear2.weight").T
        if st.layer_scale:
            out = out * self._get(p + "layer_scale_1.scale")[None, :]
            ff2 = ff2 * self._get(p + "layer_scale_2.scale")[None, :]
        return LayerWeights(
            norm1_w=self._get(p + "norm1.weight"),
            norm1_b=self._get(p + "norm1.bias"),
            norm2_w=self._get(p + "norm2.weight"),
            norm2_b=self._get(p + "norm2.bias"),
            qkv=np.ascontiguousarray(qkv, dtype=np.float32),
            out=np.ascontiguousarray(out, dtype=np.float32),
            ff1=np.ascontiguousarray(self._get(p + "linear1.weight").T),
            ff2=np.ascontiguousarray(ff2, dtype=np.float32),
        )
