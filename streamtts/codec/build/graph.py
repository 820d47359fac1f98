"""ONNX graphs of the codec decoder, written with ``onnx.helper`` from NumPy weights.

One layer code (:class:`DecoderGraph`) emits two graphs:

``offline``: the official contract. Inputs ``audio_codes`` int64 (n_q, B, T) and
``n_quantizers`` int64 scalar (levels >= it contribute nothing, as in the official export);
outputs ``audio`` float32 (B, 1, T*1920) and ``audio_lengths`` int64 (B,). Every stage attends over the whole sequence with the
official window mask (query p sees keys p-context+1 .. p), positions from 0.

``streaming``: decodes the next T frames of B streams that have already decoded
``positions[b]`` frames. Inputs ``codes`` int64 (n_q, B, T), ``positions`` int64 (B,),
``slots`` int64 (B,), ``lengths`` int64 (B,) (row b's real frames, the rest padding) and
per stage s ``state_s`` float32 (n_slots, L, 2, H, cap, hd): the caller's whole slot
table. Outputs ``audio`` float32 (B, T*1920) and per stage ``state_out_s``: the table with
the chunk's new keys (after RoPE) and values written into the rows' rings (entry =
position mod cap) by one ScatterND. The caller binds ``state_out_s`` to the very buffer
of ``state_s`` (ONNX Runtime I/O binding, on the CPU or the GPU): ScatterND then updates
the table in place and no call copies it, so the state can live on the device. The
writes wait for every read of the stage (their indices depend on the stage's output),
and a row's padding tokens write back the entries' old values; so a chunk holds at most
cap / tokens_per_frame frames (no entry twice), which the caller ensures.

Per stage and layer the graph gathers the stream's ring (GatherND on ``[slot, layer,
k|v]``), scores the queries against the ring and against the chunk's own keys, and masks
by absolute position: ring entry j holds the newest position q <= P-1 with q = j (mod
cap), P = positions * tokens_per_frame; entries with q < 0 are empty. With cap = context,
the ring holds every key the offline decode lets these queries see, so the result is the
offline one up to float rounding, for any chunking and any mix of positions in a batch.

n_q is the architecture's quantizer count: the checkpoint's 32, or the model's n_vq when the
build takes only the first levels (``build_decoders(n_vq=16)``); the streaming graph has no
``n_quantizers`` and sums every level it has.

RoPE is applied at absolute positions (float32 position x float32 frequency, as the
official code; cos/sin in float64 then rounded, so long streams keep their accuracy).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from .arch import CodecArch, Patch, StageArch
from .tensors import LayerWeights, QuantizerWeights

if TYPE_CHECKING:  # pragma: no cover
    from onnx import ModelProto, NodeProto, TensorProto

__all__ = ["DecoderGraph", "ExternalData", "GraphBuilder", "import_onnx"]

OPSET = 17  # LayerNormalization; readable by onnxruntime >= 1.14 and TensorRT 10
IR_VERSION = 8
LN_EPS = 1e-5  # nn.LayerNorm(eps=1e-5) in the official create_norm_fn
_ALIGN = 4096  # external data offsets page-aligned so ONNX Runtime can map them


def import_onnx() -> Any:
    try:
        import onnx
    except ImportError as exc:
        from ...errors import ConfigError

        raise ConfigError(
            "building the codec decoder needs the onnx package (a streamtts dependency): pip install onnx"
        ) from exc
    return onnx


class ExternalData:
    """Initializers appended to one data file while the graph is built (peak: one tensor)."""

    def __init__(self, path: Path, location: str) -> None:
        self.path = path
        self.location = location  # the name the model refers to (relative to the .onnx)
        self._f: BinaryIO = path.open("wb")
        self.nbytes = 0

    def add(self, name: str, arr: np.ndarray) -> TensorProto:
        onnx = import_onnx()
        pad = -self.nbytes % _ALIGN
        if pad:
            self._f.write(b"\0" * pad)
            self.nbytes += pad
        data = np.ascontiguousarray(arr)
        offset = self.nbytes
        self._f.write(data.tobytes())  # little-endian on every platform we run on
        self.nbytes += data.nbytes
        t = onnx.TensorProto()
        t.name = name
        t.data_type = onnx.helper.np_dtype_to_tensor_dtype(data.dtype)
        t.dims.extend(data.shape)
        t.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (
            ("location", self.location),
            ("offset", offset),
            ("length", data.nbytes),
        ):
            entry = t.external_data.add()
            entry.key, entry.value = key, str(value)
        out: TensorProto = t
        return out

    def close(self) -> None:
        if not self._f.closed:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()


@dataclass
class GraphBuilder:
    """Nodes and initializers of one graph, with unique names."""

    name: str
    weight_dtype: str = "float32"  # float16: matrices stored as float16, cast to float32
    data: ExternalData | None = None
    nodes: list[NodeProto] = field(default_factory=list)
    initializers: list[TensorProto] = field(default_factory=list)
    _count: int = 0
    _consts: dict[tuple[str, tuple[int, ...], bytes], str] = field(default_factory=dict)

    def _fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def ops(
        self, op_type: str, inputs: Sequence[str], n_out: int, hint: str = "", **attrs: Any
    ) -> list[str]:
        onnx = import_onnx()
        outs = [self._fresh(hint or op_type.lower()) for _ in range(n_out)]
        self.nodes.append(onnx.helper.make_node(op_type, list(inputs), outs, name=outs[0], **attrs))
        return outs

    def op(self, op_type: str, *inputs: str, hint: str = "", out: str = "", **attrs: Any) -> str:
        """One node with one output (named ``out`` when given: a graph output)."""
        name = self.ops(op_type, inputs, 1, hint, **attrs)[0]
        if out:
            self.nodes[-1].output[0] = out
            return out
        return name

    def _initializer(self, name: str, arr: np.ndarray) -> None:
        onnx = import_onnx()
        if self.data is not None and arr.nbytes >= 1024:
            self.initializers.append(self.data.add(name, arr))
        else:
            self.initializers.append(onnx.numpy_helper.from_array(np.array(arr, order="C"), name))

    def const(
        self, value: np.ndarray | np.generic | Sequence[int] | int | float, dtype: Any = None
    ) -> str:
        """A small constant (shapes, indices, scalars); equal constants are shared."""
        arr = np.asarray(value, dtype=dtype)
        if arr.dtype == np.float64 and dtype is None:
            arr = arr.astype(np.float32)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        name = self._consts.get(key)
        if name is None:
            name = self._fresh("c")
            self._initializer(name, arr)
            self._consts[key] = name
        return name

    def i64(self, *values: int) -> str:
        return self.const(np.array(values, dtype=np.int64))

    def weight(self, hint: str, arr: np.ndarray) -> str:
        """A float weight. Matrices are stored in ``weight_dtype`` and cast to float32."""
        name = self._fresh(hint)
        if self.weight_dtype == "float16" and arr.ndim >= 2:
            self._initializer(name, arr.astype(np.float16))
            onnx = import_onnx()
            return self.op("Cast", name, hint=hint + "_f32", to=onnx.TensorProto.FLOAT)
        self._initializer(name, np.asarray(arr, dtype=np.float32))
        return name

    def model(
        self,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        metadata: dict[str, str],
        doc: str,
    ) -> ModelProto:
        onnx = import_onnx()
        h = onnx.helper
        graph = h.make_graph(
            self.nodes, self.name, list(inputs), list(outputs), initializer=self.initializers
        )
        model: ModelProto = h.make_model(
            graph,
            opset_imports=[h.make_opsetid("", OPSET)],
            producer_name="streamtts.codec.build.decoders",
            doc_string=doc,
        )
        model.ir_version = IR_VERSION
        h.set_model_props(model, metadata)
        return model


def rope_freqs(head_dim: int, max_period: float) -> np.ndarray:
    """The official frequencies, computed as it does (float32 throughout)."""
    ds = np.arange(head_dim // 2, dtype=np.float32)
    freqs: np.ndarray = np.exp(ds * np.float32(-math.log(max_period) * 2 / head_dim))
    return freqs.astype(np.float32)


@dataclass
class _Stage:
    """Per-stage tensors shared by its layers."""

    st: StageArch
    cos: str  # (B|1, 1, n, hd): [cos, cos]
    sin: str  # (B|1, 1, n, hd): [-sin, sin]
    bias: str  # (B|1, 1, n, keys): 0 where a key is visible, -inf elsewhere
    state: str | None = None  # streaming: the stage's slot table input
    entry: str = ""  # streaming: (B, n) ring entry of each new token
    valid: str = ""  # streaming: (B, n) the token is a real one (not row padding)
    new_kv: list[str] = field(default_factory=list)


class DecoderGraph:
    """Emits one decoder graph (``kind`` offline | streaming); the builder feeds it weights."""

    def __init__(self, arch: CodecArch, kind: str, g: GraphBuilder) -> None:
        if kind not in ("offline", "streaming"):
            raise ValueError(kind)
        onnx = import_onnx()
        self.onnx = onnx
        self.arch = arch
        self.kind = kind
        self.g = g
        self.streaming = kind == "streaming"
        h, tp = onnx.helper, onnx.TensorProto
        nq = arch.quantizer.n_q
        self.codes = "codes" if self.streaming else "audio_codes"
        self.inputs: list[Any] = [
            h.make_tensor_value_info(self.codes, tp.INT64, [nq, "batch", "frames"])
        ]
        self.outputs: list[Any] = []
        if self.streaming:
            self.inputs += [
                h.make_tensor_value_info("positions", tp.INT64, ["batch"]),
                h.make_tensor_value_info("slots", tp.INT64, ["batch"]),
                h.make_tensor_value_info("lengths", tp.INT64, ["batch"]),
            ]
            for s, st in enumerate(arch.stages):
                shape = ["slots_total", st.num_layers, 2, st.num_heads, st.context, st.head_dim]
                self.inputs.append(h.make_tensor_value_info(f"state_{s}", tp.FLOAT, shape))
            # [slot, 0, 0] per row; + [0, layer, k|v] gives the GatherND index of one ring
            self.slot_idx = g.op("Mul", g.op("Unsqueeze", "slots", g.i64(1)), g.i64(1, 0, 0))
        else:
            self.inputs.append(h.make_tensor_value_info("n_quantizers", tp.INT64, []))
        self.x = ""  # the running activations (B, n, C)
        self._stage: _Stage | None = None
        self._n_stage = 0
        self._patch_folded = False

    # -- de-quantiser ------------------------------------------------------------------------
    def dequantizer(self, w: QuantizerWeights) -> None:
        g, q = self.g, self.arch.quantizer
        offsets = (np.arange(q.n_q, dtype=np.int64) * q.codebook_size).reshape(q.n_q, 1, 1)
        idx = g.op("Add", self.codes, g.const(offsets))
        books = g.weight("codebooks", w.codebooks)
        emb = g.op("Gather", books, idx, axis=0)  # (n_q, B, T, codebook_dim)
        if w.out_w is not None and w.out_b is not None:
            emb = g.op("MatMul", emb, g.weight("vq_out_w", w.out_w))
            emb = g.op("Add", emb, g.weight("vq_out_b", w.out_b))  # (n_q, B, T, rvq_dim)
        if not self.streaming:  # codebooks >= n_quantizers contribute nothing (official export)
            ids = g.const(np.arange(q.n_q, dtype=np.int64).reshape(q.n_q, 1, 1, 1))
            active = g.op("Cast", g.op("Less", ids, "n_quantizers"), to=self.onnx.TensorProto.FLOAT)
            emb = g.op("Mul", emb, active)
        x = g.op("ReduceSum", emb, g.i64(0), keepdims=0)  # (B, T, rvq_dim)
        if w.proj_w is not None and w.proj_b is not None:
            x = g.op(
                "Add",
                g.op("MatMul", x, g.weight("vq_proj_w", w.proj_w)),
                g.weight("vq_proj_b", w.proj_b),
            )
        self.x = x

    # -- transformer stages ------------------------------------------------------------------
    def _rope(self, pos_f: str, st: StageArch, axes: Sequence[int]) -> tuple[str, str]:
        """cos/sin tables (.., n, hd) for float positions ``pos_f`` (.., n, 1)."""
        g, tp = self.g, self.onnx.TensorProto
        ang = g.op("Mul", pos_f, g.const(rope_freqs(st.head_dim, st.max_period)))
        ang64 = g.op("Cast", ang, to=tp.DOUBLE)
        c = g.op("Cast", g.op("Cos", ang64), to=tp.FLOAT)
        s = g.op("Cast", g.op("Sin", ang64), to=tp.FLOAT)
        cos = g.op("Unsqueeze", g.op("Concat", c, c, axis=-1), g.i64(*axes))
        sin = g.op("Unsqueeze", g.op("Concat", g.op("Neg", s), s, axis=-1), g.i64(*axes))
        return cos, sin

    def begin_stage(self, st: StageArch, in_proj: np.ndarray | None) -> None:
        g = self.g
        s = self._n_stage
        if in_proj is not None:
            self.x = g.op("MatMul", self.x, g.weight(f"s{s}_in_proj", in_proj))
        n = g.op("Gather", g.op("Shape", self.x), g.const(np.int64(1)))  # scalar: tokens
        ar = g.op("Range", g.const(np.int64(0)), n, g.const(np.int64(1)))  # (n,)
        zero, ninf = g.const(np.float32(0)), g.const(np.float32(-np.inf))
        ctx = g.const(np.int64(st.context))
        tp = self.onnx.TensorProto
        if not self.streaming:
            delta = g.op("Sub", g.op("Unsqueeze", ar, g.i64(1)), g.op("Unsqueeze", ar, g.i64(0)))
            valid = g.op(
                "And",
                g.op("GreaterOrEqual", delta, g.const(np.int64(0))),
                g.op("Less", delta, ctx),
            )
            bias = g.op("Unsqueeze", g.op("Where", valid, zero, ninf), g.i64(0, 1))  # (1,1,n,n)
            pos_f = g.op("Unsqueeze", g.op("Cast", ar, to=tp.FLOAT), g.i64(1))  # (n, 1)
            cos, sin = self._rope(pos_f, st, (0, 1))
            self._stage = _Stage(st, cos, sin, bias)
        else:
            first = g.op("Mul", "positions", g.const(np.int64(st.tokens_per_frame)))  # (B,)
            first = g.op("Unsqueeze", first, g.i64(1))  # (B, 1)
            qpos = g.op("Add", first, g.op("Unsqueeze", ar, g.i64(0)))  # (B, n)
            last = g.op("Sub", first, g.const(np.int64(1)))
            entries = g.const(np.arange(st.context, dtype=np.int64))
            # ring entry j: the newest position <= last that is j mod cap (negative: empty)
            ring = g.op("Sub", last, g.op("Mod", g.op("Sub", last, entries), ctx, fmod=0))
            kpos = g.op("Concat", ring, qpos, axis=1)  # (B, cap + n)
            kpos3 = g.op("Unsqueeze", kpos, g.i64(1))  # (B, 1, cap + n)
            delta = g.op("Sub", g.op("Unsqueeze", qpos, g.i64(2)), kpos3)  # (B, n, cap + n)
            valid = g.op(
                "And",
                g.op(
                    "And",
                    g.op("GreaterOrEqual", kpos3, g.const(np.int64(0))),
                    g.op("GreaterOrEqual", delta, g.const(np.int64(0))),
                ),
                g.op("Less", delta, ctx),
            )
            bias = g.op("Unsqueeze", g.op("Where", valid, zero, ninf), g.i64(1))  # (B,1,n,cap+n)
            pos_f = g.op("Unsqueeze", g.op("Cast", qpos, to=tp.FLOAT), g.i64(2))  # (B, n, 1)
            cos, sin = self._rope(pos_f, st, (1,))
            entry = g.op("Mod", qpos, ctx, fmod=0)  # (B, n)
            real = g.op("Mul", g.op("Unsqueeze", "lengths", g.i64(1)), g.i64(st.tokens_per_frame))
            valid = g.op("Less", g.op("Unsqueeze", ar, g.i64(0)), real)  # (B, n)
            self._stage = _Stage(st, cos, sin, bias, state=f"state_{s}", entry=entry, valid=valid)

    def _apply_rope(self, x: str, stage: _Stage) -> str:
        g, half = self.g, stage.st.head_dim // 2
        lo, hi = g.ops("Split", [x], 2, axis=-1)
        swapped = g.op("Concat", hi, lo, axis=-1)  # [b, a] for x = [a, b]
        return g.op(
            "Add", g.op("Mul", x, stage.cos), g.op("Mul", swapped, stage.sin), hint=f"rope{half}"
        )

    def layer(self, index: int, w: LayerWeights) -> None:
        g, stage = self.g, self._stage
        assert stage is not None
        st, s = stage.st, self._n_stage
        hint = f"s{s}l{index}"
        x = self.x
        h = g.op(
            "LayerNormalization", x, g.weight(hint + "_ln1_w", w.norm1_w), g.weight(hint + "_ln1_b", w.norm1_b),
            axis=-1, epsilon=LN_EPS,
        )  # fmt: skip
        qkv = g.op("MatMul", h, g.weight(hint + "_qkv", w.qkv))
        qkv = g.op("Reshape", qkv, g.i64(0, 0, 3, st.num_heads, st.head_dim))
        qkv = g.op("Transpose", qkv, perm=[2, 0, 3, 1, 4])  # (3, B, H, n, hd)
        q, k, v = (g.op("Gather", qkv, g.const(np.int64(i)), axis=0) for i in range(3))
        q = self._apply_rope(q, stage)
        k = self._apply_rope(k, stage)
        scores = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2]))  # (B, H, n, n)
        ring_v = ""
        if stage.state is not None:
            ring_k = g.op("GatherND", stage.state, g.op("Add", self.slot_idx, g.i64(0, index, 0)))
            ring_v = g.op("GatherND", stage.state, g.op("Add", self.slot_idx, g.i64(0, index, 1)))
            ring_scores = g.op("MatMul", q, g.op("Transpose", ring_k, perm=[0, 1, 3, 2]))
            scores = g.op("Concat", ring_scores, scores, axis=-1)  # (B, H, n, cap + n)
        probs = g.op("Softmax", g.op("Add", scores, stage.bias), axis=-1)
        if stage.state is not None:
            cap = st.context
            big = np.iinfo(np.int64).max
            p_ring = g.op("Slice", probs, g.i64(0), g.i64(cap), g.i64(-1))
            p_new = g.op("Slice", probs, g.i64(cap), g.i64(big), g.i64(-1))
            att = g.op("Add", g.op("MatMul", p_ring, ring_v), g.op("MatMul", p_new, v))
            stage.new_kv += [g.op("Unsqueeze", k, g.i64(1)), g.op("Unsqueeze", v, g.i64(1))]
        else:
            att = g.op("MatMul", probs, v)  # (B, H, n, hd)
        att = g.op("Reshape", g.op("Transpose", att, perm=[0, 2, 1, 3]), g.i64(0, 0, st.d_model))
        x = g.op("Add", x, g.op("MatMul", att, g.weight(hint + "_out", w.out)))
        h = g.op(
            "LayerNormalization", x, g.weight(hint + "_ln2_w", w.norm2_w), g.weight(hint + "_ln2_b", w.norm2_b),
            axis=-1, epsilon=LN_EPS,
        )  # fmt: skip
        f = g.op("MatMul", h, g.weight(hint + "_ff1", w.ff1))
        # exact (erf) GELU, F.gelu's default; ONNX Runtime fuses this pattern into one kernel
        erf = g.op("Erf", g.op("Div", f, g.const(np.float32(math.sqrt(2.0)))))
        f = g.op(
            "Mul",
            g.op("Mul", f, g.op("Add", erf, g.const(np.float32(1.0)))),
            g.const(np.float32(0.5)),
        )
        self.x = g.op("Add", x, g.op("MatMul", f, g.weight(hint + "_ff2", w.ff2)))

    def end_stage(self, out_proj: np.ndarray | None, patch_folded: bool) -> None:
        g, stage = self.g, self._stage
        assert stage is not None
        s = self._n_stage
        if out_proj is not None:
            self.x = g.op("MatMul", self.x, g.weight(f"s{s}_out_proj", out_proj))
        self._patch_folded = patch_folded and out_proj is not None
        if stage.state is not None:
            self._write_rings(stage, s)
        self._stage = None
        self._n_stage += 1

    def _write_rings(self, stage: _Stage, s: int) -> None:
        """``state_out_s``: the table with the chunk's keys/values at their ring entries."""
        g, st, tp = self.g, stage.st, self.onnx.TensorProto
        assert stage.state is not None
        n_l, n_h = st.num_layers, st.num_heads
        kv = g.op("Concat", *stage.new_kv, axis=1)  # (B, 2L, H, n, hd)
        kv = g.op("Reshape", kv, g.i64(0, n_l, 2, n_h, -1, st.head_dim))  # (B, L, 2, H, n, hd)
        # In place, the writes must come after every ring read of this stage: adding 0 derived
        # from the stage's output makes them depend on all its layers (a data dependency any
        # executor keeps; a NaN output still adds 0: IsNaN is cast to 0 or 1, times 0).
        probe = g.op("Slice", self.x, g.i64(0, 0, 0), g.i64(1, 1, 1))
        zero = g.op("Mul", g.op("Cast", g.op("IsNaN", probe), to=tp.INT64), g.i64(0))
        entry = g.op("Add", stage.entry, g.op("Reshape", zero, g.i64(1, 1)))
        bn = g.op("Shape", entry)  # [B, n]
        full = g.op(
            "Concat",
            g.op("Slice", bn, g.i64(0), g.i64(1)),
            g.i64(n_l, 2, n_h),
            g.op("Slice", bn, g.i64(1), g.i64(2)),
            g.i64(1),
            axis=0,
        )  # [B, L, 2, H, n, 1]
        parts = [
            g.op("Reshape", "slots", g.i64(-1, 1, 1, 1, 1, 1)),
            g.const(np.arange(n_l, dtype=np.int64).reshape(1, n_l, 1, 1, 1, 1)),
            g.const(np.arange(2, dtype=np.int64).reshape(1, 1, 2, 1, 1, 1)),
            g.const(np.arange(n_h, dtype=np.int64).reshape(1, 1, 1, n_h, 1, 1)),
            g.op("Reshape", entry, g.i64(0, 1, 1, 1, -1, 1)),
        ]
        idx = g.op("Concat", *(g.op("Expand", p, full) for p in parts), axis=-1)
        old = g.op("GatherND", stage.state, idx)  # (B, L, 2, H, n, hd): a padding token keeps it
        valid = g.op("Reshape", stage.valid, g.i64(0, 1, 1, 1, -1, 1))
        g.op("ScatterND", stage.state, idx, g.op("Where", valid, kv, old), out=f"state_out_{s}")
        dims = ["slots_total", n_l, 2, n_h, st.context, st.head_dim]
        self.outputs.append(
            self.onnx.helper.make_tensor_value_info(f"state_out_{s}", tp.FLOAT, dims)
        )

    def patch(self, p: Patch, width: int) -> None:
        """(B, n, d*h) -> (B, n*h, d); a reshape when the stage before ordered its columns."""
        g = self.g
        d = width // p.size
        if not self._patch_folded:
            x = g.op("Reshape", self.x, g.i64(0, 0, d, p.size))
            self.x = g.op("Transpose", x, perm=[0, 1, 3, 2])
        self.x = g.op("Reshape", self.x, g.i64(0, -1, d))
        self._patch_folded = False

    # -- outputs -----------------------------------------------------------------------------
    def finish(self, metadata: dict[str, str], doc: str) -> ModelProto:
        g, h, tp = self.g, self.onnx.helper, self.onnx.TensorProto
        if self.streaming:
            g.op("Reshape", self.x, g.i64(0, -1), out="audio")
            out = [h.make_tensor_value_info("audio", tp.FLOAT, ["batch", "samples"])]
        else:
            g.op("Reshape", self.x, g.i64(0, 1, -1), out="audio")
            shape = g.op("Shape", self.codes)
            batch = g.op("Gather", shape, g.i64(1))
            frames = g.op("Gather", shape, g.i64(2))
            n = g.op("Mul", frames, g.i64(self.arch.downsample_rate))
            g.op("Expand", n, batch, out="audio_lengths")
            out = [
                h.make_tensor_value_info("audio", tp.FLOAT, ["batch", 1, "samples"]),
                h.make_tensor_value_info("audio_lengths", tp.INT64, ["batch"]),
            ]
        return g.model(self.inputs, out + self.outputs, metadata, doc)


def emit_decoder(
    arch: CodecArch,
    graphs: Sequence[DecoderGraph],
    weights: Any,
    tick: Any = None,
) -> None:
    """Feed ``weights`` (a :class:`~streamtts.codec.build.tensors.DecoderWeights`) through every
    graph, one layer at a time, so a checkpoint is read once for both graphs and only one
    layer's folded weights are in memory. ``tick()`` is called after each layer."""
    qw = weights.quantizer()
    for dg in graphs:
        dg.dequantizer(qw)
    del qw
    if tick:
        tick()
    ops = arch.ops
    width = arch.quantizer.output_dim
    for i, op in enumerate(ops):
        if isinstance(op, Patch):
            for dg in graphs:
                dg.patch(op, width)
            width //= op.size
            continue
        nxt = ops[i + 1] if i + 1 < len(ops) else None
        patch = nxt.size if isinstance(nxt, Patch) else None
        in_proj = weights.input_proj(op)
        for dg in graphs:
            dg.begin_stage(op, in_proj)
        for layer in range(op.num_layers):
            lw = weights.layer(op, layer)
            for dg in graphs:
                dg.layer(layer, lw)
            del lw
            if tick:
                tick()
        out_proj = weights.output_proj(op, patch)
        for dg in graphs:
            dg.end_stage(out_proj, patch is not None)
        width = op.output_dim
