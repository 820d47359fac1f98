"""Pure bookkeeping of the TensorRT codec: profiles, buffer sizes, window splits.

No TensorRT or CUDA import here, so every decision the GPU backend makes
(which optimisation profile serves a call, how large each device / pinned host
buffer is, which buffers need a host mirror, how a window too long for the
engine is split) is computed, and tested, on any machine.

Shapes (contract section 7), with T in frames of 1920 samples:

    decoder  in  audio_codes   (L, B, T)       out  audio (B, 1, T*1920), lengths (B,)
    encoder  in  input_values  (B, 1, T*1920)  out  codes (L, B, T),      lengths (B,)

L is the engine's codebook levels (32 published; a ``codec build --n-vq 16`` graph 16).
Both have a second input, ``n_quantizers`` (the model's n_vq): a constant, so
it is written once at load and never copied again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..constants import FRAME_SAMPLES, N_VQ, SAMPLE_RATE
from .slot_decoder import STATEFUL_INPUTS

Kind = Literal["decoder", "encoder"]


@dataclass(frozen=True)
class ProfileShape:
    """One optimisation profile in codec terms: (min, opt, max) of batch and frames."""

    batch: tuple[int, int, int]
    frames: tuple[int, int, int]

    def covers(self, b: int, t: int) -> bool:
        return self.batch[0] <= b <= self.batch[2] and self.frames[0] <= t <= self.frames[2]

    def input_shapes(
        self, kind: Kind, levels: int = N_VQ
    ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(min, opt, max) of the main input tensor, as TensorRT's profile wants them."""
        return (
            main_input_shape(kind, self.batch[0], self.frames[0], levels),
            main_input_shape(kind, self.batch[1], self.frames[1], levels),
            main_input_shape(kind, self.batch[2], self.frames[2], levels),
        )


def main_input_shape(kind: Kind, b: int, t: int, levels: int = N_VQ) -> tuple[int, ...]:
    """``levels``: codebook levels of the engine's codes (32 published; a 16-level build)."""
    return (levels, b, t) if kind == "decoder" else (b, 1, t * FRAME_SAMPLES)


def main_output_shape(kind: Kind, b: int, t: int, levels: int = N_VQ) -> tuple[int, ...]:
    return (b, 1, t * FRAME_SAMPLES) if kind == "decoder" else (levels, b, t)


def codes_levels(io: Sequence[IOTensor], kind: Kind, n_vq: int = N_VQ) -> int:
    """The codebook levels of an engine's codes tensor (the decoder's first input, the
    encoder's first output): its fixed size, else ``n_vq``."""
    t = [x for x in io if x.is_input == (kind == "decoder")][0]
    return t.shape[0] if t.shape and t.shape[0] > 0 else n_vq


def profile_from_input(
    kind: Kind, mins: Sequence[int], opts: Sequence[int], maxs: Sequence[int]
) -> ProfileShape:
    """Inverse of ProfileShape.input_shapes: an engine's profile of the main input."""

    def bt(s: Sequence[int]) -> tuple[int, int]:
        if len(s) != 3:
            raise ValueError(
                f"the codec's main input has rank 3, the engine's profile says {tuple(s)}"
            )
        if kind == "decoder":
            return int(s[1]), int(s[2])
        return int(s[0]), max(1, int(s[2]) // FRAME_SAMPLES)

    (b0, t0), (b1, t1), (b2, t2) = bt(mins), bt(opts), bt(maxs)
    return ProfileShape((b0, b1, b2), (t0, t1, t2))


def batch_buckets(max_batch: int, buckets: Sequence[int] | None = None) -> list[int]:
    """Upper batch bound of each profile: small batches get their own kernels.

    The decode thread batches the windows that are ready together, so a lightly
    loaded server decodes 1-4 windows per call and a busy one up to
    ``max_batch``; one profile per bucket lets TensorRT tune for each regime.
    """
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    raw = list(buckets) if buckets else [1, 4, 16, max_batch]
    if any(b < 1 for b in raw):
        raise ValueError(f"batch buckets must be >= 1, got {raw}")
    out = sorted({min(b, max_batch) for b in raw} | {max_batch})
    return out


def streaming_profiles(
    max_batch: int,
    context_frames: int,
    chunk_frames: int,
    max_frames: int | None = None,
    buckets: Sequence[int] | None = None,
) -> list[ProfileShape]:
    """Decoder profiles for streaming windows (build time).

    A window is the new frames (at most ``chunk_frames``) plus up to
    ``context_frames`` of left context, so the steady state is
    ``context + chunk`` frames: the optimum. The minimum is one frame (the very
    first window of a stream).
    """
    if context_frames < 0 or chunk_frames < 1:
        raise ValueError("context_frames must be >= 0 and chunk_frames >= 1")
    t_max = max_frames if max_frames is not None else context_frames + chunk_frames
    if t_max < 1:
        raise ValueError(f"max_frames must be >= 1, got {t_max}")
    return _bucketed(max_batch, buckets, (1, min(context_frames + chunk_frames, t_max), t_max))


def _bucketed(
    max_batch: int, buckets: Sequence[int] | None, frames: tuple[int, int, int]
) -> list[ProfileShape]:
    """One profile per batch bucket, each for ``frames`` (min, opt, max)."""
    profiles = []
    lo = 1
    for hi in batch_buckets(max_batch, buckets):
        profiles.append(ProfileShape((lo, hi, hi), frames))
        lo = hi + 1
    return profiles


def stateful_profiles(
    max_batch: int,
    chunk_frames: int,
    max_frames: int,
    buckets: Sequence[int] | None = None,
) -> list[ProfileShape]:
    """Profiles of the stateful streaming decoder (``decoder_streaming.onnx``): only new
    frames go in (no left context), so a call is 1..``max_frames`` frames, optimum
    ``chunk_frames``; one profile per batch bucket as for windows."""
    if chunk_frames < 1 or max_frames < 1:
        raise ValueError("chunk_frames and max_frames must be >= 1")
    return _bucketed(max_batch, buckets, (1, min(chunk_frames, max_frames), max_frames))


def reference_profiles(max_seconds: float, opt_seconds: float = 8.0) -> list[ProfileShape]:
    """Encoder profile for reference clips (batch 1, as the official build)."""
    t_max = max(1, int(np.ceil(max_seconds * SAMPLE_RATE / FRAME_SAMPLES)))
    t_opt = min(t_max, max(1, int(np.ceil(opt_seconds * SAMPLE_RATE / FRAME_SAMPLES))))
    return [ProfileShape((1, 1, 1), (1, t_opt, t_max))]


def choose_profile(profiles: Sequence[ProfileShape], b: int, t: int) -> int:
    """Index of the profile serving a (b, t) call: the narrowest batch range that covers it.

    -1 when none does (the caller splits the call first: see split_batch / split_frames).
    """
    best, width = -1, 0
    for i, p in enumerate(profiles):
        if p.covers(b, t):
            w = p.batch[2] - p.batch[0]
            if best < 0 or w < width:
                best, width = i, w
    return best


def limits(profiles: Sequence[ProfileShape]) -> tuple[int, int]:
    """(largest batch, largest frames) any profile accepts."""
    if not profiles:
        raise ValueError("the engine has no optimisation profile")
    return max(p.batch[2] for p in profiles), max(p.frames[2] for p in profiles)


def split_batch(b: int, t: int, profiles: Sequence[ProfileShape]) -> list[tuple[int, int]]:
    """Batch ranges [lo, hi) that each fit one profile for t frames (largest first)."""
    cap = max((p.batch[2] for p in profiles if p.frames[0] <= t <= p.frames[2]), default=0)
    if cap < 1:
        raise ValueError(f"no optimisation profile accepts {t} frames")
    return [(i, min(i + cap, b)) for i in range(0, b, cap)]


def split_frames(t: int, max_t: int, context: int) -> list[tuple[int, int, int]]:
    """Pieces ``(start, keep, end)`` covering frames [0, t) with windows of <= max_t frames.

    Each piece decodes frames [start, end) and keeps the samples of [keep, end);
    pieces after the first start ``context`` frames before what they keep, the
    same left context streaming windows get (the decoder is causal, so only the
    kept frames' left context matters).
    """
    if max_t < 1:
        raise ValueError("max_t must be >= 1")
    if t <= max_t:
        return [(0, 0, t)]
    ctx = min(context, max_t - 1)
    step = max_t - ctx
    out = [(0, 0, max_t)]
    keep = max_t
    while keep < t:
        end = min(keep + step, t)
        out.append((keep - ctx, keep, end))
        keep = end
    return out


@dataclass(frozen=True)
class IOTensor:
    """One engine I/O tensor, in the engine's own terms (read from the engine at load)."""

    name: str
    is_input: bool
    dtype: str  # numpy dtype name, e.g. "int64", "float32"
    shape: tuple[int, ...]  # -1 for dynamic dims
    shape_tensor: bool = False  # TensorRT reads its value on the host (is_shape_inference_io)


@dataclass(frozen=True)
class BufferSpec:
    """One I/O buffer: bytes on the device, and whether a pinned host mirror is kept."""

    name: str
    role: Literal[
        "main_in", "n_quantizers", "main_out", "lengths", "rows", "state", "state_out"
    ]
    dtype: str
    nbytes: int
    device: bool
    host: bool
    alias_of: str = ""  # bound to that buffer's device memory (allocated once, for both)

    def elements(self) -> int:
        return self.nbytes // np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class BufferPlan:
    """Every buffer the backend allocates once at load, and per-call transfer sizes.

    Buffers are shared by all profiles: calls are serialized on the codec's one
    CUDA stream, so a buffer sized for the largest (batch, frames) of any profile
    serves every call and nothing is allocated per call.
    """

    kind: Kind
    max_batch: int
    max_frames: int
    buffers: tuple[BufferSpec, ...]
    levels: int = N_VQ  # codebook levels of the codes tensor

    def by_role(self, role: str) -> BufferSpec:
        for b in self.buffers:
            if b.role == role:
                return b
        raise KeyError(role)

    def transfer_bytes(self, role: str, b: int, t: int) -> int:
        """Bytes a (b, t) call moves for this buffer (a prefix of it)."""
        spec = self.by_role(role)
        if not (0 < b <= self.max_batch and 0 < t <= self.max_frames):
            raise ValueError(
                f"a {b} x {t} call needs more than the buffers hold "
                f"(planned for batch {self.max_batch} x {self.max_frames} frames)"
            )
        item = np.dtype(spec.dtype).itemsize
        if role == "main_in":
            n = int(np.prod(main_input_shape(self.kind, b, t, self.levels)))
        elif role == "main_out":
            n = int(np.prod(main_output_shape(self.kind, b, t, self.levels)))
        elif role in ("lengths", "rows"):
            n = b
        else:
            return 0  # n_quantizers: written once at load
        nbytes = n * item
        if nbytes > spec.nbytes:
            raise ValueError(
                f"a {b} x {t} call needs {nbytes} bytes of {spec.name}, the buffer has {spec.nbytes}"
            )
        return nbytes

    def transfer_bytes_of(self, name: str, b: int, t: int) -> int:
        """As transfer_bytes, for the buffer called ``name`` (several share a role)."""
        spec = next(x for x in self.buffers if x.name == name)
        if spec.role == "rows":
            if not 0 < b <= self.max_batch:
                raise ValueError(f"a batch of {b} is more than the buffers hold ({self.max_batch})")
            return b * np.dtype(spec.dtype).itemsize
        return self.transfer_bytes(spec.role, b, t)

    @property
    def device_bytes(self) -> int:
        return sum(b.nbytes for b in self.buffers if b.device and not b.alias_of)

    @property
    def host_bytes(self) -> int:
        return sum(b.nbytes for b in self.buffers if b.host)


def codec_roles(io: Sequence[IOTensor]) -> dict[str, IOTensor]:
    """Map the engine's I/O to roles by position (contract: names vary, order does not)."""
    ins = [t for t in io if t.is_input]
    outs = [t for t in io if not t.is_input]
    if len(ins) != 2 or len(outs) != 2:
        names = ", ".join(f"{t.name} ({'in' if t.is_input else 'out'})" for t in io)
        raise ValueError(
            f"expected 2 inputs and 2 outputs (codes/waveform, n_quantizers; main output, lengths), got {names}"
        )
    return {"main_in": ins[0], "n_quantizers": ins[1], "main_out": outs[0], "lengths": outs[1]}


def plan_buffers(
    kind: Kind, io: Sequence[IOTensor], profiles: Sequence[ProfileShape], n_vq: int = N_VQ
) -> BufferPlan:
    """Size every buffer for the largest call any profile accepts (codes of the engine's
    levels: :func:`codes_levels`)."""
    roles = codec_roles(io)
    b_max, t_max = limits(profiles)
    levels = codes_levels(io, kind, n_vq)
    specs = []
    for role, t in roles.items():
        item = np.dtype(t.dtype).itemsize
        if role == "main_in":
            n = int(np.prod(main_input_shape(kind, b_max, t_max, levels)))
            specs.append(BufferSpec(t.name, "main_in", t.dtype, n * item, device=True, host=True))
        elif role == "main_out":
            n = int(np.prod(main_output_shape(kind, b_max, t_max, levels)))
            specs.append(BufferSpec(t.name, "main_out", t.dtype, n * item, device=True, host=True))
        elif role == "lengths":
            specs.append(
                BufferSpec(t.name, "lengths", t.dtype, b_max * item, device=True, host=True)
            )
        else:
            # A shape tensor is read by TensorRT on the host: no device copy at all.
            # Otherwise it lives on the device, uploaded once (the value never changes).
            n = max(1, int(np.prod([d for d in t.shape if d > 0]))) if t.shape else 1
            specs.append(
                BufferSpec(
                    t.name, "n_quantizers", t.dtype, n * item, device=not t.shape_tensor, host=True
                )
            )
    return BufferPlan(kind, b_max, t_max, tuple(specs), levels)


def n_quantizers_shape(t: IOTensor) -> tuple[int, ...] | None:
    """Shape to set for n_quantizers, None when the engine's shape is already fixed."""
    if not t.shape:
        return None  # a scalar
    if all(d > 0 for d in t.shape):
        return None
    return tuple(1 if d < 0 else d for d in t.shape)



def plan_stateful_buffers(
    io: Sequence[IOTensor],
    profiles: Sequence[ProfileShape],
    table_bytes: Sequence[int],
    n_vq: int = N_VQ,
) -> BufferPlan:
    """Buffers of the stateful streaming decoder engine: codes, positions, slots, lengths
    and audio with pinned host mirrors, sized for the largest call; per stage one device
    table of ``table_bytes[s]`` (every slot's rings: no host mirror, never copied), bound
    both as ``state_s`` and as ``state_out_s`` (the graph updates it in place). ``n_vq``:
    the codebooks of its codes (the build's metadata)."""
    names = [t.name for t in io]
    n = len(table_bytes)
    want_in = [*STATEFUL_INPUTS, *(f"state_{i}" for i in range(n))]
    want_out = ["audio", *(f"state_out_{i}" for i in range(n))]
    ins = [t.name for t in io if t.is_input]
    outs = [t.name for t in io if not t.is_input]
    if sorted(ins) != sorted(want_in) or sorted(outs) != sorted(want_out):
        raise ValueError(
            f"expected inputs {want_in} and outputs {want_out} (decoder_streaming.onnx), got "
            f"{', '.join(names)}"
        )
    by = {t.name: t for t in io}
    b_max, t_max = limits(profiles)
    specs = []
    for name in STATEFUL_INPUTS:
        t = by[name]
        item = np.dtype(t.dtype).itemsize
        if name == "codes":
            nbytes = int(np.prod(main_input_shape("decoder", b_max, t_max, n_vq))) * item
            specs.append(BufferSpec(name, "main_in", t.dtype, nbytes, device=True, host=True))
        else:
            specs.append(BufferSpec(name, "rows", t.dtype, b_max * item, device=True, host=True))
    a = by["audio"]
    nbytes = b_max * t_max * FRAME_SAMPLES * np.dtype(a.dtype).itemsize
    specs.append(BufferSpec("audio", "main_out", a.dtype, nbytes, device=True, host=True))
    for i, size in enumerate(table_bytes):
        specs.append(BufferSpec(f"state_{i}", "state", "float32", size, device=True, host=False))
        specs.append(
            BufferSpec(
                f"state_out_{i}", "state_out", "float32", size, device=True, host=False,
                alias_of=f"state_{i}",
            )  # fmt: skip
        )
    return BufferPlan("decoder", b_max, t_max, tuple(specs), n_vq)
