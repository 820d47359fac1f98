"""The MOSS-Audio-Tokenizer decoder architecture, read from its ``config.json``.

The decoder is an RLFQ de-quantiser followed by ``decoder_kwargs``: causal transformer
stages and ``PatchedPretransform`` reshapes (the published model: four stages at 12.5,
25, 50 and 100 tokens/s, patches 2 / 2 / 2 / 240). Each stage's attention sees the last
``causal_transformer_context_duration`` seconds *at its own rate*:
``context = int(rate * duration)`` tokens (125 / 250 / 500 / 1000 for the published one),
the same rule as the official code.

Only what decoding needs is validated: a config that describes something else (another
quantiser, RMSNorm, gating, sinusoidal positions, a non-causal stage, shapes that do not
chain) fails with a :class:`~streamtts.errors.ModelFileError` naming the file and the key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import ModelFileError

__all__ = ["CodecArch", "Patch", "QuantizerArch", "StageArch", "load_arch", "parse_arch"]

CONFIG_FILE = "config.json"
_EXPECTED = "a MOSS-Audio-Tokenizer config.json (RLFQ quantiser, causal RoPE transformer decoder)"


@dataclass(frozen=True)
class QuantizerArch:
    """The residual LFQ de-quantiser: per codebook a lookup and a 1x1 conv, summed."""

    n_q: int
    codebook_size: int
    codebook_dim: int
    rvq_dim: int
    output_dim: int

    @property
    def has_out_proj(
        self,
    ) -> bool:  # per-codebook codebook_dim -> rvq_dim (official: only if they differ)
        return self.rvq_dim != self.codebook_dim

    @property
    def has_output_proj(self) -> bool:
        return self.output_dim != self.rvq_dim


@dataclass(frozen=True)
class StageArch:
    """One causal transformer stage (``decoder.{index}`` in the checkpoint)."""

    index: int  # position in decoder_kwargs = the checkpoint prefix decoder.{index}
    input_dim: int
    d_model: int
    output_dim: int
    num_heads: int
    num_layers: int
    ffn_dim: int
    max_period: float
    layer_scale: bool
    rate: float  # tokens per second
    context: int  # a query at position p sees keys p-context+1 .. p
    tokens_per_frame: int  # tokens of this stage per 80 ms codec frame

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def has_input_proj(self) -> bool:
        return self.input_dim != self.d_model

    @property
    def has_output_proj(self) -> bool:
        return self.output_dim != self.d_model

    @property
    def params(self) -> int:
        d, f = self.d_model, self.ffn_dim
        per_layer = 4 * d * d + 2 * d * f + 4 * d + (2 * d if self.layer_scale else 0)
        proj = self.input_dim * d * self.has_input_proj + d * self.output_dim * self.has_output_proj
        return self.num_layers * per_layer + proj


@dataclass(frozen=True)
class Patch:
    """``PatchedPretransform`` (decode direction): (B, T, d*h) -> (B, T*h, d)."""

    index: int
    size: int


@dataclass(frozen=True)
class CodecArch:
    path: str  # the config file (for messages)
    sampling_rate: int
    downsample_rate: int  # samples per codec frame (1920)
    context_duration: float  # seconds
    quantizer: QuantizerArch
    ops: tuple[StageArch | Patch, ...]  # decoder_kwargs, in order

    @property
    def stages(self) -> tuple[StageArch, ...]:
        return tuple(op for op in self.ops if isinstance(op, StageArch))

    @property
    def frame_rate(self) -> float:
        return self.sampling_rate / self.downsample_rate

    @property
    def params(self) -> int:
        q = self.quantizer
        n = q.n_q * q.codebook_size * q.codebook_dim
        if q.has_out_proj:
            n += q.n_q * (q.codebook_dim * q.rvq_dim + q.rvq_dim)
        if q.has_output_proj:
            n += q.rvq_dim * q.output_dim + q.output_dim
        return n + sum(s.params for s in self.stages)

    def describe(self) -> str:
        parts = [
            f"{s.rate:g} tok/s: {s.num_layers} x d{s.d_model} h{s.num_heads} ctx {s.context}"
            for s in self.stages
        ]
        return f"{self.params / 1e6:.1f} M decoder params; " + "; ".join(parts)


def _bad(path: str, problem: str) -> ModelFileError:
    return ModelFileError(path, _EXPECTED, problem)


def _get(d: dict[str, Any], key: str, kind: type | tuple[type, ...], path: str, where: str) -> Any:
    if key not in d:
        raise _bad(path, f"{where} has no {key!r}")
    value = d[key]
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise _bad(path, f"{where}{key} is {value!r}, expected {getattr(kind, '__name__', kind)}")
    return value


def _positive(d: dict[str, Any], key: str, path: str, where: str) -> int:
    value = _get(d, key, int, path, where)
    if value <= 0:
        raise _bad(path, f"{where}{key} is {value}, expected a positive integer")
    return int(value)


def _expect(d: dict[str, Any], key: str, allowed: tuple[Any, ...], path: str, where: str) -> None:
    value = d.get(key, allowed[0])
    if value not in allowed:
        want = " or ".join(repr(a) for a in allowed)
        raise _bad(path, f"{where}{key} is {value!r}; streamtts decodes only {want}")


def parse_arch(cfg: Any, path: str = CONFIG_FILE) -> CodecArch:
    """Validate a parsed config.json (see the module docstring)."""
    if not isinstance(cfg, dict):
        raise _bad(path, f"the top level is {type(cfg).__name__}, expected an object")
    if "decoder_kwargs" not in cfg or "quantizer_kwargs" not in cfg:
        arch = cfg.get("architectures") or cfg.get("model_type") or "unknown"
        raise _bad(path, f"no decoder_kwargs / quantizer_kwargs (this config is for {arch})")
    sr = _positive(cfg, "sampling_rate", path, "")
    hop = _positive(cfg, "downsample_rate", path, "")
    dur = _get(cfg, "causal_transformer_context_duration", (int, float), path, "")
    if dur <= 0:
        raise _bad(path, f"causal_transformer_context_duration is {dur}, expected > 0")

    qk = _get(cfg, "quantizer_kwargs", dict, path, "")
    qtype = qk.get("quantizer_type", cfg.get("quantizer_type", "rvq"))
    if qtype not in ("rlfq", "random_prefix_rlfq"):
        raise _bad(path, f"quantizer_type is {qtype!r}; streamtts decodes only 'rlfq'")
    w = "quantizer_kwargs."
    q_in = _positive(qk, "input_dim", path, w)
    rvq = int(qk.get("rvq_dim") or q_in)
    quant = QuantizerArch(
        n_q=_positive(qk, "num_quantizers", path, w),
        codebook_size=_positive(qk, "codebook_size", path, w),
        codebook_dim=_positive(qk, "codebook_dim", path, w),
        rvq_dim=rvq,
        output_dim=int(qk.get("output_dim") or q_in),
    )

    dk = _get(cfg, "decoder_kwargs", list, path, "")
    if not dk:
        raise _bad(path, "decoder_kwargs is empty")
    ops: list[StageArch | Patch] = []
    width = quant.output_dim  # channels of the running tensor
    per_frame = 1  # tokens per codec frame at this point
    for i, kw in enumerate(dk):
        where = f"decoder_kwargs[{i}]."
        if not isinstance(kw, dict):
            raise _bad(path, f"decoder_kwargs[{i}] is {kw!r}, expected an object")
        mtype = kw.get("module_type")
        if mtype == "PatchedPretransform":
            h = _positive(kw, "patch_size", path, where)
            if width % h:
                raise _bad(
                    path, f"{where}patch_size {h} does not divide the {width} channels before it"
                )
            ops.append(Patch(index=i, size=h))
            width //= h
            per_frame *= h
            continue
        if mtype != "Transformer":
            raise _bad(
                path,
                f"{where}module_type is {mtype!r}, expected 'Transformer' or 'PatchedPretransform'",
            )
        _expect(kw, "causal", (True,), path, where)
        _expect(kw, "positional_embedding", ("rope",), path, where)
        _expect(kw, "norm", ("layer_norm",), path, where)
        _expect(kw, "gating", ("none",), path, where)
        for key in ("weights_per_step", "weights_per_step_schedule"):
            if kw.get(key):
                raise _bad(path, f"{where}{key} is set; streamtts decodes only stages without it")
        d = _positive(kw, "d_model", path, where)
        heads = _positive(kw, "num_heads", path, where)
        if d % heads or (d // heads) % 2:
            raise _bad(path, f"{where}d_model {d} / num_heads {heads} is not an even head width")
        in_dim = _positive(kw, "input_dimension", path, where)
        if in_dim != width:
            raise _bad(
                path, f"{where}input_dimension is {in_dim}, but {width} channels arrive there"
            )
        rate = sr / hop * per_frame
        ls = kw.get("layer_scale")
        ops.append(
            StageArch(
                index=i,
                input_dim=in_dim,
                d_model=d,
                output_dim=_positive(kw, "output_dimension", path, where),
                num_heads=heads,
                num_layers=_positive(kw, "num_layers", path, where),
                ffn_dim=_positive(kw, "dim_feedforward", path, where),
                max_period=float(kw.get("max_period", 10000)),
                layer_scale=ls is not None,
                rate=rate,
                context=int(rate * dur),  # the official rule, truncation included
                tokens_per_frame=per_frame,
            )
        )
        width = ops[-1].output_dim  # type: ignore[union-attr]
    if not any(isinstance(op, StageArch) for op in ops):
        raise _bad(path, "decoder_kwargs has no Transformer stage")
    if per_frame != hop or width != 1:
        raise _bad(
            path,
            f"the decoder ends with {width} channel(s) at {per_frame} samples per frame; "
            f"expected mono audio at downsample_rate = {hop}",
        )
    for st in ops:
        if isinstance(st, StageArch) and st.context < 1:
            raise _bad(path, f"decoder_kwargs[{st.index}] has an empty attention context")
    return CodecArch(
        path=path, sampling_rate=sr, downsample_rate=hop, context_duration=float(dur),
        quantizer=quant, ops=tuple(ops),
    )  # fmt: skip


def load_arch(path: str | Path) -> CodecArch:
    """Read ``config.json`` (or a folder holding it)."""
    p = Path(path)
    if p.is_dir():
        p = p / CONFIG_FILE
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ModelFileError(p, _EXPECTED, "file not found") from exc
    except OSError as exc:
        raise ModelFileError(p, _EXPECTED, str(exc)) from exc
    except ValueError as exc:
        raise ModelFileError(p, _EXPECTED, f"not JSON: {exc}") from exc
    return parse_arch(cfg, str(p))
