"""ONNX graphs of the demo codec, on the real MOSS-Audio-Tokenizer I/O contract.

Why: the engine's codec path (session loading, I/O checks, batching, windowed
streaming decode) must be exercised without the 1.6B-parameter published
codec. These graphs have the published inputs/outputs (names, dtypes, ranks,
dynamic batch and length) and are built with ``onnx.helper`` in milliseconds.

Decoder (``audio_codes`` int64 (n_vq, B, T) (32, or a 16-codebook model's 16),
``n_quantizers`` int64 scalar ->
audio float32 (B, 1, T*1920), audio_lengths int64 (B,)): codes become soft
tones, so a listener hears the stream's rhythm instead of noise.

- codebook 0 -> pitch: one of ``NOTES_HZ``, a two-octave just-intonation
  pentatonic scale on 300 Hz (225 .. 750 Hz), contiguous code ranges per note;
- codebook 1 -> loudness: 0.1 .. 0.3, smoothed by a 3-frame moving average;
- codebook 2 -> timbre: the weight of the 2nd and 3rd harmonics;
- codebooks 3.. are ignored; so are codebooks >= ``n_quantizers``.

Frame t is a raised-cosine crossfade over its first ``CROSSFADE_SAMPLES`` from
the previous frame's note (pitch/timbre of frame t-1, loudness averaged over
frames t-3..t-1) to its own note (frame t, loudness over t-2..t). Every note
frequency is a multiple of 12.5 Hz, so a note completes a whole number of
cycles in one 80 ms frame: a note restarted at each frame start is the same
waveform as the note continued, so the synthesis needs no absolute time (no
phase depends on a frame's index) and repeated notes join seamlessly. Frames
before the first are silent (loudness 0), so a stream fades in.

Hence the decoder is causal with a receptive field of
``DEMO_DECODER_RECEPTIVE_FRAMES`` = 4 frames: the samples of frame t depend
only on codes of frames t-3..t. Decoding windows with at least 3 frames of left
context and keeping only the new frames' samples is equal to offline decoding.

Encoder (``input_values`` float32 (B, 1, N), N a multiple of 1920,
``n_quantizers`` -> codes int64 (32, B, N/1920), code_lengths int64 (B,)):
per 1920-sample frame it measures zero-crossing rate, log energy and peak,
quantises each to [0, 1024) and mixes them per codebook with fixed integer
weights (codebook 0 = zero-crossing rate, 1 = log energy, 2 = peak). Codebooks
>= ``n_quantizers`` are 0. Deterministic; not an inverse of the decoder.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..codec.onnx import RECEPTIVE_FRAMES_KEY
from ..constants import AUDIO_VOCAB, FRAME_SAMPLES, N_VQ, SAMPLE_RATE

if TYPE_CHECKING:  # pragma: no cover
    from onnx import ModelProto, NodeProto


#: Frames of codes that the samples of one output frame depend on (t-R+1 .. t).
DEMO_DECODER_RECEPTIVE_FRAMES = 4

#: Samples at each frame start over which the previous note fades into the next.
CROSSFADE_SAMPLES = 960

#: Pitches of codebook 0. All multiples of 12.5 Hz (whole cycles per 80 ms frame).
NOTES_HZ = (225.0, 250.0, 300.0, 337.5, 375.0, 450.0, 500.0, 600.0, 675.0, 750.0)

AMP_MIN, AMP_MAX = 0.1, 0.3
HARMONIC_MAX = 0.6
DEFAULT_AMP = 0.2  # loudness when n_quantizers < 2

OPSET = 17
_LOUD_WINDOW = DEMO_DECODER_RECEPTIVE_FRAMES - 1  # frames in the loudness moving average


def _onnx() -> Any:
    try:
        import onnx
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "writing the demo codec needs the onnx package (a streamtts dependency): pip install onnx"
        ) from exc
    return onnx


def decoder_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-code pitch (Hz), loudness and harmonic weight tables, each (1024,) float32."""
    codes = np.arange(AUDIO_VOCAB)
    notes = np.asarray(NOTES_HZ, dtype=np.float32)
    freq = notes[codes * len(NOTES_HZ) // AUDIO_VOCAB]
    amp = (AMP_MIN + (AMP_MAX - AMP_MIN) * codes / (AUDIO_VOCAB - 1)).astype(np.float32)
    harm = (HARMONIC_MAX * codes / (AUDIO_VOCAB - 1)).astype(np.float32)
    return freq.astype(np.float32), amp, harm


def _const(name: str, value: np.ndarray) -> NodeProto:
    onnx = _onnx()
    node: NodeProto = onnx.helper.make_node(
        "Constant", [], [name], value=onnx.numpy_helper.from_array(value, name=name)
    )
    return node


# An input or output of a graph: name, ONNX element type, shape (ints and dimension names).
_Value = tuple[str, int, list[int | str]]


def build_decoder_model(n_vq: int = N_VQ) -> ModelProto:
    """The demo decoder as an ``onnx.ModelProto`` (see the module docstring), taking codes
    of ``n_vq`` levels (a 16-codebook model's decoder: 16)."""
    onnx = _onnx()
    h = onnx.helper
    tp = onnx.TensorProto
    freq, amp, harm = decoder_tables()
    n = np.arange(FRAME_SAMPLES, dtype=np.float64)
    tau = (n / SAMPLE_RATE).astype(np.float32)
    fade = np.ones(FRAME_SAMPLES, dtype=np.float64)
    fade[:CROSSFADE_SAMPLES] = 0.5 - 0.5 * np.cos(np.pi * n[:CROSSFADE_SAMPLES] / CROSSFADE_SAMPLES)
    k = _LOUD_WINDOW
    big = np.iinfo(np.int64).max

    nodes = [
        _const("freq_table", freq),
        _const("amp_table", amp),
        _const("harm_table", harm),
        _const("tau", tau),
        _const("fade_in", fade.astype(np.float32)),
        _const("fade_out", (1.0 - fade).astype(np.float32)),
        _const("two_pi", np.array(2.0 * math.pi, dtype=np.float32)),
        _const("two", np.array(2.0, dtype=np.float32)),
        _const("three", np.array(3.0, dtype=np.float32)),
        _const("half", np.array(0.5, dtype=np.float32)),
        _const("quarter", np.array(0.25, dtype=np.float32)),
        _const("one", np.array(1.0, dtype=np.float32)),
        _const("inv_k", np.array(1.0 / k, dtype=np.float32)),
        _const("default_amp", np.array(DEFAULT_AMP, dtype=np.float32)),
        _const("i0", np.array(0, dtype=np.int64)),
        _const("i1", np.array(1, dtype=np.int64)),
        _const("i2", np.array(2, dtype=np.int64)),
        _const("pads", np.array([0, k, 0, 0], dtype=np.int64)),
        _const("zero_f", np.array(0.0, dtype=np.float32)),
        _const("axis1", np.array([1], dtype=np.int64)),
        _const("axis2", np.array([2], dtype=np.int64)),
        _const("out_shape", np.array([0, 1, -1], dtype=np.int64)),
        _const("frame_samples", np.array([FRAME_SAMPLES], dtype=np.int64)),
        # codebooks 0..2 -> (B, T) each
        h.make_node("Gather", ["audio_codes", "i0"], ["c0"], axis=0),
        h.make_node("Gather", ["audio_codes", "i1"], ["c1"], axis=0),
        h.make_node("Gather", ["audio_codes", "i2"], ["c2"], axis=0),
        h.make_node("Gather", ["freq_table", "c0"], ["f"], axis=0),
        h.make_node("Gather", ["amp_table", "c1"], ["a_raw"], axis=0),
        h.make_node("Gather", ["harm_table", "c2"], ["h_raw"], axis=0),
        # n_quantizers gating: loudness needs >= 2 codebooks, timbre >= 3.
        h.make_node("Greater", ["n_quantizers", "i1"], ["use_amp"]),
        h.make_node("Greater", ["n_quantizers", "i2"], ["use_harm_b"]),
        h.make_node("Cast", ["use_harm_b"], ["use_harm"], to=tp.FLOAT),
        h.make_node("Expand", ["default_amp", "a_shape"], ["a_default"]),
        h.make_node("Shape", ["a_raw"], ["a_shape"]),
        h.make_node("Where", ["use_amp", "a_raw", "a_default"], ["a"]),
        h.make_node("Mul", ["h_raw", "use_harm"], ["hm"]),
        # left-pad k silent frames, then the moving averages / previous frame by slicing
        h.make_node("Pad", ["a", "pads", "zero_f"], ["a_p"], mode="constant"),
        h.make_node("Pad", ["f", "pads", "zero_f"], ["f_p"], mode="constant"),
        h.make_node("Pad", ["hm", "pads", "zero_f"], ["h_p"], mode="constant"),
    ]
    # Slices of the padded (B, T+k) arrays: s_j[t] = padded[t + j], j = 0..k.
    for name in ("a_p", "f_p", "h_p"):
        for j in range(k + 1):
            start = np.array([j], dtype=np.int64)
            end = np.array([j - k if j < k else big], dtype=np.int64)
            nodes += [
                _const(f"{name}_s{j}_start", start),
                _const(f"{name}_s{j}_end", end),
                h.make_node(
                    "Slice",
                    [name, f"{name}_s{j}_start", f"{name}_s{j}_end", "axis1"],
                    [f"{name}_s{j}"],
                ),
            ]
    # loudness of the current note: frames t-k+1..t (= slices 1..k); previous: t-k..t-1 (0..k-1)
    nodes += [
        h.make_node("Sum", [f"a_p_s{j}" for j in range(1, k + 1)], ["a_cur_sum"]),
        h.make_node("Sum", [f"a_p_s{j}" for j in range(0, k)], ["a_prev_sum"]),
        h.make_node("Mul", ["a_cur_sum", "inv_k"], ["a_cur"]),
        h.make_node("Mul", ["a_prev_sum", "inv_k"], ["a_prev"]),
    ]
    for which, f_name, h_name, a_name, fade_name in (
        ("cur", f"f_p_s{k}", f"h_p_s{k}", "a_cur", "fade_in"),
        ("prev", f"f_p_s{k - 1}", f"h_p_s{k - 1}", "a_prev", "fade_out"),
    ):
        p = which
        nodes += [
            h.make_node("Unsqueeze", [f_name, "axis2"], [f"{p}_f3"]),
            h.make_node("Unsqueeze", [h_name, "axis2"], [f"{p}_h3"]),
            h.make_node("Unsqueeze", [a_name, "axis2"], [f"{p}_a3"]),
            h.make_node("Mul", [f"{p}_f3", "two_pi"], [f"{p}_w"]),
            h.make_node("Mul", [f"{p}_w", "tau"], [f"{p}_ph1"]),  # (B, T, 1920)
            h.make_node("Mul", [f"{p}_ph1", "two"], [f"{p}_ph2"]),
            h.make_node("Mul", [f"{p}_ph1", "three"], [f"{p}_ph3"]),
            h.make_node("Sin", [f"{p}_ph1"], [f"{p}_s1"]),
            h.make_node("Sin", [f"{p}_ph2"], [f"{p}_s2"]),
            h.make_node("Sin", [f"{p}_ph3"], [f"{p}_s3"]),
            h.make_node("Mul", [f"{p}_s2", "half"], [f"{p}_s2w"]),
            h.make_node("Mul", [f"{p}_s3", "quarter"], [f"{p}_s3w"]),
            h.make_node("Add", [f"{p}_s2w", f"{p}_s3w"], [f"{p}_over"]),
            h.make_node("Mul", [f"{p}_over", f"{p}_h3"], [f"{p}_overw"]),
            h.make_node("Add", [f"{p}_s1", f"{p}_overw"], [f"{p}_raw"]),
            # normalise so the timbre does not change the loudness much
            h.make_node("Mul", [f"{p}_h3", "half"], [f"{p}_hn"]),
            h.make_node("Add", [f"{p}_hn", "one"], [f"{p}_norm"]),
            h.make_node("Div", [f"{p}_a3", f"{p}_norm"], [f"{p}_gain"]),
            h.make_node("Mul", [f"{p}_raw", f"{p}_gain"], [f"{p}_tone"]),
            h.make_node("Mul", [f"{p}_tone", fade_name], [f"{p}_faded"]),
        ]
    nodes += [
        h.make_node("Add", ["cur_faded", "prev_faded"], ["frames"]),  # (B, T, 1920)
        h.make_node("Reshape", ["frames", "out_shape"], ["audio"]),  # (B, 1, T*1920)
        h.make_node("Shape", ["audio_codes"], ["codes_shape"]),
        h.make_node("Gather", ["codes_shape", "axis1"], ["batch"]),
        h.make_node("Gather", ["codes_shape", "axis2"], ["n_frames"]),
        h.make_node("Mul", ["n_frames", "frame_samples"], ["n_samples"]),
        h.make_node("Expand", ["n_samples", "batch"], ["audio_lengths"]),
    ]
    codes: _Value = ("audio_codes", tp.INT64, [n_vq, "batch", "frames"])
    outputs: list[_Value] = [("audio", tp.FLOAT, ["batch", 1, "samples"]), ("audio_lengths", tp.INT64, ["batch"])]
    return _model(nodes, "decoder", codes, outputs, "codes -> soft tones")


def build_encoder_model() -> ModelProto:
    """The demo encoder as an ``onnx.ModelProto`` (see the module docstring)."""
    onnx = _onnx()
    h = onnx.helper
    tp = onnx.TensorProto
    rng = np.random.default_rng(1234)
    # codes_k = (wz_k * zcr_q + we_k * energy_q + wp_k * peak_q + off_k) mod 1024
    weights = rng.integers(1, 64, size=(N_VQ, 3)).astype(np.int64)
    offsets = rng.integers(0, AUDIO_VOCAB, size=N_VQ).astype(np.int64)
    weights[:3] = np.eye(3, dtype=np.int64)
    offsets[:3] = 0

    def col(j: int) -> np.ndarray:
        return weights[:, j].reshape(N_VQ, 1, 1)

    nodes = [
        _const("frame_shape", np.array([0, -1, FRAME_SAMPLES], dtype=np.int64)),
        _const("axis0", np.array([0], dtype=np.int64)),
        _const("axis1", np.array([1], dtype=np.int64)),
        _const("s_start1", np.array([1], dtype=np.int64)),
        _const("s_end_big", np.array([np.iinfo(np.int64).max], dtype=np.int64)),
        _const("s_start0", np.array([0], dtype=np.int64)),
        _const("s_end_m1", np.array([-1], dtype=np.int64)),
        _const("axis2", np.array([2], dtype=np.int64)),
        _const("eps", np.array(1e-10, dtype=np.float32)),
        _const("e_off", np.array(23.0, dtype=np.float32)),
        _const("e_scale", np.array(1023.0 / 23.0, dtype=np.float32)),
        _const("z_scale", np.array(4096.0 / 2.0, dtype=np.float32)),
        _const("p_scale", np.array(1023.0, dtype=np.float32)),
        _const("q_min", np.array(0.0, dtype=np.float32)),
        _const("q_max", np.array(float(AUDIO_VOCAB - 1), dtype=np.float32)),
        _const("w_z", col(0)),
        _const("w_e", col(1)),
        _const("w_p", col(2)),
        _const("offsets", offsets.reshape(N_VQ, 1, 1)),
        _const("vocab", np.array(AUDIO_VOCAB, dtype=np.int64)),
        _const("vq_index", np.arange(N_VQ, dtype=np.int64).reshape(N_VQ, 1, 1)),
        h.make_node("Reshape", ["input_values", "frame_shape"], ["x"]),  # (B, F, 1920)
        # zero-crossing rate
        h.make_node("Sign", ["x"], ["sgn"]),
        h.make_node("Slice", ["sgn", "s_start1", "s_end_big", "axis2"], ["sgn_next"]),
        h.make_node("Slice", ["sgn", "s_start0", "s_end_m1", "axis2"], ["sgn_prev"]),
        h.make_node("Sub", ["sgn_next", "sgn_prev"], ["sgn_diff"]),
        h.make_node("Abs", ["sgn_diff"], ["sgn_abs"]),
        h.make_node("ReduceMean", ["sgn_abs"], ["zcr"], axes=[2], keepdims=0),
        h.make_node("Mul", ["zcr", "z_scale"], ["zcr_s"]),
        # log energy
        h.make_node("Mul", ["x", "x"], ["x2"]),
        h.make_node("ReduceMean", ["x2"], ["energy"], axes=[2], keepdims=0),
        h.make_node("Add", ["energy", "eps"], ["energy_e"]),
        h.make_node("Log", ["energy_e"], ["log_e"]),
        h.make_node("Add", ["log_e", "e_off"], ["log_e_off"]),
        h.make_node("Mul", ["log_e_off", "e_scale"], ["energy_s"]),
        # peak
        h.make_node("Abs", ["x"], ["x_abs"]),
        h.make_node("ReduceMax", ["x_abs"], ["peak"], axes=[2], keepdims=0),
        h.make_node("Mul", ["peak", "p_scale"], ["peak_s"]),
    ]
    for name in ("zcr_s", "energy_s", "peak_s"):
        nodes += [
            h.make_node("Clip", [name, "q_min", "q_max"], [f"{name}_c"]),
            h.make_node("Floor", [f"{name}_c"], [f"{name}_f"]),
            h.make_node("Cast", [f"{name}_f"], [f"{name}_i"], to=tp.INT64),
            h.make_node("Unsqueeze", [f"{name}_i", "axis0"], [f"{name}_q"]),  # (1, B, F)
        ]
    nodes += [
        h.make_node("Mul", ["zcr_s_q", "w_z"], ["m_z"]),
        h.make_node("Mul", ["energy_s_q", "w_e"], ["m_e"]),
        h.make_node("Mul", ["peak_s_q", "w_p"], ["m_p"]),
        h.make_node("Add", ["m_z", "m_e"], ["m_ze"]),
        h.make_node("Add", ["m_ze", "m_p"], ["m_zep"]),
        h.make_node("Add", ["m_zep", "offsets"], ["mixed"]),
        h.make_node("Mod", ["mixed", "vocab"], ["codes_all"], fmod=0),  # (32, B, F)
        h.make_node("Less", ["vq_index", "n_quantizers"], ["keep_b"]),
        h.make_node("Cast", ["keep_b"], ["keep"], to=tp.INT64),
        h.make_node("Mul", ["codes_all", "keep"], ["audio_codes"]),
        h.make_node("Shape", ["x"], ["x_shape"]),
        h.make_node("Gather", ["x_shape", "axis0"], ["batch"]),
        h.make_node("Gather", ["x_shape", "axis1"], ["n_frames"]),
        h.make_node("Expand", ["n_frames", "batch"], ["code_lengths"]),
    ]
    samples: _Value = ("input_values", tp.FLOAT, ["batch", 1, "samples"])
    outputs: list[_Value] = [("audio_codes", tp.INT64, [N_VQ, "batch", "frames"]), ("code_lengths", tp.INT64, ["batch"])]
    return _model(nodes, "encoder", samples, outputs, "waveform statistics -> codes")


def _toposort(nodes: list[NodeProto], inputs: tuple[str, ...]) -> list[NodeProto]:
    """Order nodes so every input is produced before use (ONNX requires it)."""
    produced = set(inputs)
    pending = list(nodes)
    ordered = []
    while pending:
        progress = False
        rest = []
        for node in pending:
            if all(i in produced or i == "" for i in node.input):
                ordered.append(node)
                produced.update(node.output)
                progress = True
            else:
                rest.append(node)
        if not progress:
            missing = {i for n in rest for i in n.input if i not in produced}
            raise RuntimeError(f"demo codec graph: unresolved inputs {sorted(missing)}")
        pending = rest
    return ordered


def _model(nodes: list[NodeProto], kind: str, main: _Value, outputs: list[_Value], doc: str) -> ModelProto:
    """The checked demo ``kind`` (decoder, encoder) model of ``nodes`` (in any order); its
    inputs are ``main`` and, as the official codec's, ``n_quantizers``."""
    onnx = _onnx()
    h = onnx.helper
    inputs = [main, ("n_quantizers", onnx.TensorProto.INT64, [])]
    graph = h.make_graph(
        _toposort(nodes, tuple(name for name, _, _ in inputs)),
        f"streamtts_demo_{kind}",
        [h.make_tensor_value_info(*v) for v in inputs],
        [h.make_tensor_value_info(*v) for v in outputs],
    )
    model: ModelProto = h.make_model(
        graph,
        opset_imports=[h.make_opsetid("", OPSET)],
        producer_name="streamtts.demo",
        doc_string=f"streamtts demo {kind}: {doc}",
    )
    model.ir_version = 8  # readable by every onnxruntime >= 1.14
    onnx.checker.check_model(model, full_check=True)
    return model


def write_codec(out_dir: str | Path, n_vq: int = N_VQ) -> tuple[Path, Path]:
    """Write ``encoder.onnx`` (32 levels, as the published one) and ``decoder.onnx`` (for
    ``n_vq`` levels) into ``out_dir``."""
    onnx = _onnx()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    enc, dec = out / "encoder.onnx", out / "decoder.onnx"
    onnx.save_model(build_encoder_model(), str(enc))
    model = build_decoder_model(n_vq)
    # The windowed path reads this: more left context than the receptive field changes no
    # sample, only costs (codec/onnx.py: RECEPTIVE_FRAMES_KEY).
    onnx.helper.set_model_props(model, {RECEPTIVE_FRAMES_KEY: str(DEMO_DECODER_RECEPTIVE_FRAMES)})
    onnx.save_model(model, str(dec))
    return enc, dec
