"""Codec contract on real ONNX Runtime: the demo graphs and the ONNX backend."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from streamtts.codec import AudioDecoder, AudioEncoder, load_decoder, load_encoder
from streamtts.codec.onnx import OnnxDecoder, OnnxEncoder
from streamtts.config import EngineConfig, load_config
from streamtts.demo.codec import DEMO_DECODER_RECEPTIVE_FRAMES as R
from streamtts.demo.codec import NOTES_HZ
from streamtts.errors import CodecError, ConfigError, ModelFileError

F = 1920
SR = 24000


@pytest.fixture(scope="module")
def codec_dir(demo_model_dir: Path) -> Path:
    return demo_model_dir / "MOSS-Audio-Tokenizer-ONNX"


@pytest.fixture(scope="module")
def cfg(demo_model_dir: Path) -> EngineConfig:
    return load_config(demo_model_dir / "config.yaml")


@pytest.fixture(scope="module")
def dec(cfg: EngineConfig) -> AudioDecoder:
    return load_decoder(cfg)


@pytest.fixture(scope="module")
def enc(cfg: EngineConfig) -> AudioEncoder:
    return load_encoder(cfg)


def _codes(seed: int, b: int, t: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1024, size=(b, t, 32), dtype=np.int64)


# -- the raw graphs on ONNX Runtime (contract section 7) -------------------------------


@pytest.mark.parametrize("b", [1, 3])
@pytest.mark.parametrize("t", [1, 7, 50])
def test_decoder_graph_dynamic_batch_and_length(codec_dir: Path, b: int, t: int) -> None:
    s = ort.InferenceSession(str(codec_dir / "decoder.onnx"), providers=["CPUExecutionProvider"])
    ins, outs = s.get_inputs(), s.get_outputs()
    assert [i.name for i in ins] == ["audio_codes", "n_quantizers"]
    assert [i.type for i in ins] == ["tensor(int64)", "tensor(int64)"]
    assert [o.type for o in outs] == ["tensor(float)", "tensor(int64)"]
    codes = _codes(b * 100 + t, b, t).transpose(2, 0, 1).copy()
    audio, lengths = s.run(None, {"audio_codes": codes, "n_quantizers": np.array(32, np.int64)})
    assert audio.shape == (b, 1, t * F) and audio.dtype == np.float32
    assert lengths.shape == (b,) and lengths.dtype == np.int64
    assert np.all(lengths == t * F)
    assert np.all(np.isfinite(audio))


@pytest.mark.parametrize("b", [1, 3])
@pytest.mark.parametrize("t", [1, 7, 50])
def test_encoder_graph_dynamic_batch_and_length(codec_dir: Path, b: int, t: int) -> None:
    s = ort.InferenceSession(str(codec_dir / "encoder.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in s.get_inputs()] == ["input_values", "n_quantizers"]
    x = (np.random.default_rng(t).standard_normal((b, 1, t * F)) * 0.1).astype(np.float32)
    codes, lengths = s.run(None, {"input_values": x, "n_quantizers": np.array(32, np.int64)})
    assert codes.shape == (32, b, t) and codes.dtype == np.int64
    assert codes.min() >= 0 and codes.max() < 1024
    assert lengths.shape == (b,) and np.all(lengths == t)
    # batch items are independent
    single, _ = s.run(None, {"input_values": x[-1:], "n_quantizers": np.array(32, np.int64)})
    assert np.array_equal(single[:, 0], codes[:, -1])


def test_encoder_graph_honours_n_quantizers(codec_dir: Path) -> None:
    s = ort.InferenceSession(str(codec_dir / "encoder.onnx"), providers=["CPUExecutionProvider"])
    x = (np.random.default_rng(0).standard_normal((1, 1, 4 * F)) * 0.1).astype(np.float32)
    codes, _ = s.run(None, {"input_values": x, "n_quantizers": np.array(8, np.int64)})
    assert not codes[8:].any()
    assert codes[:8].any()


# -- the backend: protocol, validation, batching --------------------------------------


def test_backend_satisfies_the_protocols(dec: AudioDecoder, enc: AudioEncoder) -> None:
    assert isinstance(dec, AudioDecoder) and isinstance(enc, AudioEncoder)
    assert isinstance(dec, OnnxDecoder) and dec.max_batch == 32
    assert dec.provider == "CPUExecutionProvider"  # the demo config has use_gpu_audio: false


@pytest.mark.parametrize(("b", "t"), [(1, 1), (3, 7), (2, 50), (4, 0)])
def test_decode_shapes(dec: AudioDecoder, b: int, t: int) -> None:
    out = dec.decode(_codes(t, b, t))
    assert out.shape == (b, t * F) and out.dtype == np.float32
    assert out.flags.c_contiguous


def test_decode_accepts_other_integer_dtypes(dec: AudioDecoder) -> None:
    c = _codes(1, 2, 5)
    assert np.array_equal(dec.decode(c.astype(np.int32)), dec.decode(c))


def test_batch_equals_per_item_and_big_batches_split(dec: AudioDecoder) -> None:
    c = _codes(7, 40, 3)  # > max_batch: two codec calls
    out = dec.decode(c)
    assert out.shape == (40, 3 * F)
    for i in (0, 17, 31, 32, 39):
        assert np.abs(out[i] - dec.decode(c[i : i + 1])[0]).max() <= 1e-6


def test_decoder_is_causal_with_finite_receptive_field(dec: AudioDecoder) -> None:
    c = _codes(3, 1, 30)
    base = dec.decode(c)[0].reshape(30, F)
    for t in (0, 9, 20, 29):
        c2 = c.copy()
        c2[0, t] = (c2[0, t] + 512) % 1024  # every codebook changes (pitch, loudness, timbre)
        frames = np.abs(dec.decode(c2)[0].reshape(30, F) - base).max(axis=1)
        changed = np.nonzero(frames > 0)[0]
        assert changed.min() == t  # nothing before frame t moves
        assert changed.max() == min(t + R - 1, 29)  # nor anything from frame t + R on
        assert np.all(frames[t : t + R] > 0)


def test_no_absolute_time_dependence(dec: AudioDecoder) -> None:
    c = _codes(4, 1, 12)
    prefix = _codes(5, 1, 9)
    a = dec.decode(c)[0]
    b = dec.decode(np.concatenate([prefix, c], axis=1))[0]
    # Once R-1 frames of c are inside the receptive field, the samples are the same
    # whatever the frames' absolute index.
    assert np.abs(a[(R - 1) * F :] - b[(9 + R - 1) * F :]).max() <= 1e-5


@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_windowed_decode_with_context_equals_offline(dec: AudioDecoder, chunk: int) -> None:
    t_total = 40
    c = _codes(chunk, 2, t_total)
    offline = dec.decode(c)
    parts = []
    for s in range(0, t_total, chunk):
        e = min(t_total, s + chunk)
        ctx = max(0, s - (R - 1))
        parts.append(dec.decode(c[:, ctx:e])[:, (s - ctx) * F :])
    streamed = np.concatenate(parts, axis=1)
    assert streamed.shape == offline.shape
    assert np.abs(streamed - offline).max() <= 1e-5
    # One frame of context less is audibly different: R is tight.
    parts = []
    for s in range(0, t_total, chunk):
        e = min(t_total, s + chunk)
        ctx = max(0, s - (R - 2))
        parts.append(dec.decode(c[:, ctx:e])[:, (s - ctx) * F :])
    assert np.abs(np.concatenate(parts, axis=1) - offline).max() > 1e-3


def _flatness(x: np.ndarray) -> float:
    p = np.abs(np.fft.rfft(x * np.hanning(len(x)))) ** 2 + 1e-20
    return float(np.exp(np.mean(np.log(p))) / np.mean(p))


def test_decoder_makes_soft_tones_not_noise(dec: AudioDecoder) -> None:
    c = _codes(11, 1, 50)
    audio = dec.decode(c)[0]
    steady = audio[R * F :]
    peak = float(np.abs(steady).max())
    rms = float(np.sqrt(np.mean(steady**2)))
    assert 0.05 <= rms and peak <= 0.45  # soft: amplitudes ~0.1-0.3
    noise = np.random.default_rng(0).standard_normal(len(steady)) * rms
    assert _flatness(steady) < 0.01 < 0.3 < _flatness(noise)
    # One held note: its energy sits at the note's pitch (and harmonics).
    held = np.repeat(c[:, :1], 25, axis=1)
    held[0, :, 0] = 0  # codebook 0 = 0 -> the lowest note
    held[0, :, 2] = 0  # no harmonics
    tone = dec.decode(held)[0][R * F :]
    spec = np.abs(np.fft.rfft(tone))
    freqs = np.fft.rfftfreq(len(tone), 1 / SR)
    assert abs(freqs[int(np.argmax(spec))] - NOTES_HZ[0]) < 2.0
    assert spec[np.abs(freqs - NOTES_HZ[0]) < 20].sum() > 0.9 * spec.sum()


def test_stream_fades_in_from_silence(dec: AudioDecoder) -> None:
    audio = dec.decode(_codes(2, 1, 4))[0]
    assert abs(audio[0]) < 1e-6  # frames before the first are silent


# -- encoder backend ------------------------------------------------------------------


def test_encode_contract_and_determinism(enc: AudioEncoder, dec: AudioDecoder) -> None:
    wav = dec.decode(_codes(8, 1, 9))[0]
    codes = enc.encode(wav)
    assert codes.shape == (9, 32) and codes.dtype == np.int64
    assert codes.min() >= 0 and codes.max() < 1024
    assert np.array_equal(enc.encode(wav.copy()), codes)
    assert not np.array_equal(enc.encode(wav * 0.5), codes)  # depends on the signal


def test_a_16_codebook_model_decodes_and_encodes_16_levels(
    demo_model_16_dir: Path, codec_dir: Path, dec: AudioDecoder, enc: AudioEncoder
) -> None:
    """A 16-codebook model: its decoder takes (B, T, 16) codes; the encoder keeps the first
    16 of the codec's 32 levels; the 32-level decoder given 16 codebooks (the rest padded,
    n_quantizers = 16) decodes them as the 16-level one."""
    cfg16 = load_config(demo_model_16_dir / "config.yaml")
    dec16, enc16 = load_decoder(cfg16), load_encoder(cfg16)  # n_vq from the model's config.json
    codes = _codes(4, 2, 6)[:, :, :16]
    out = dec16.decode(codes)
    assert out.shape == (2, 6 * F)
    assert np.array_equal(OnnxDecoder(codec_dir / "decoder.onnx", n_vq=16).decode(codes), out)
    with pytest.raises(CodecError, match=r"shape \(B, T, 16\)"):
        dec16.decode(_codes(4, 1, 2))
    wav = dec.decode(_codes(8, 1, 9))[0]
    c16 = enc16.encode(wav)
    assert c16.shape == (9, 16)
    np.testing.assert_array_equal(c16, enc.encode(wav)[:, :16])
    with pytest.raises(ConfigError, match="n_vq must be a positive integer"):
        OnnxDecoder(codec_dir / "decoder.onnx", n_vq=0)


@pytest.mark.parametrize(
    ("wav", "match"),
    [
        (np.zeros(1000, np.float32), "multiple of 1920"),
        (np.zeros(0, np.float32), "multiple of 1920"),
        (np.zeros((1, 1920), np.float32), "1-D"),
        (np.full(1920, np.nan, np.float32), "non-finite"),
    ],
)
def test_encode_rejects_bad_waveforms(enc: AudioEncoder, wav: np.ndarray, match: str) -> None:
    with pytest.raises(CodecError, match=match):
        enc.encode(wav)


# -- errors ---------------------------------------------------------------------------


def test_pad_code_is_rejected_with_its_position(dec: AudioDecoder) -> None:
    c = _codes(1, 2, 6)
    c[1, 4, 17] = 1024
    with pytest.raises(CodecError, match=r"code 1024 at item 1, frame 4, codebook 17.*pad code"):
        dec.decode(c)


def test_negative_code_is_rejected(dec: AudioDecoder) -> None:
    c = _codes(1, 1, 3)
    c[0, 0, 0] = -1
    with pytest.raises(CodecError, match=r"code -1 at item 0, frame 0, codebook 0"):
        dec.decode(c)


@pytest.mark.parametrize(
    ("codes", "match"),
    [
        (np.zeros((1, 5, 31), np.int64), r"shape \(B, T, 32\)"),
        (np.zeros((5, 32), np.int64), r"shape \(B, T, 32\)"),
        (np.zeros((1, 5, 32), np.float32), "integers"),
        ([[0] * 32], "numpy array"),
    ],
)
def test_bad_code_arrays(dec: AudioDecoder, codes: np.ndarray, match: str) -> None:
    with pytest.raises(CodecError, match=match):
        dec.decode(codes)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope" / "decoder.onnx"
    with pytest.raises(
        ModelFileError, match="decoder.onnx.*audio_codes int64.*file not found"
    ) as ei:
        OnnxDecoder(path)
    assert ei.value.path == str(path)
    with pytest.raises(ModelFileError, match="input_values float32"):
        OnnxEncoder(tmp_path / "encoder.onnx")


def test_corrupt_file(tmp_path: Path) -> None:
    path = tmp_path / "decoder.onnx"
    path.write_bytes(b"\x08\x07not really an onnx model" * 10)
    with pytest.raises(
        ModelFileError, match="decoder.onnx: expected an ONNX codec decoder.*cannot load"
    ):
        OnnxDecoder(path)


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="not a file"):
        OnnxDecoder(tmp_path)


def _identity_model(
    path: Path,
    inputs: list[tuple[str, int, list[object]]],
    outputs: list[tuple[str, int, list[object]]],
) -> Path:
    nodes = [
        helper.make_node("Identity", [inputs[i % len(inputs)][0]], [o[0]])
        for i, o in enumerate(outputs)
    ]
    graph = helper.make_graph(
        nodes,
        "wrong",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(path))
    return path


def test_onnx_with_wrong_input_dtype(tmp_path: Path) -> None:
    # The encoder's signature is not the decoder's: a swapped file is caught at load.
    p = _identity_model(
        tmp_path / "decoder.onnx",
        [
            ("input_values", TensorProto.FLOAT, ["b", 1, "n"]),
            ("n_quantizers", TensorProto.INT64, []),
        ],
        [("a", TensorProto.FLOAT, ["b", 1, "n"]), ("l", TensorProto.INT64, [])],
    )
    with pytest.raises(
        ModelFileError,
        match=r"input 0 \('input_values', the codes\) is tensor\(float\), expected tensor\(int64\)",
    ):
        OnnxDecoder(p)


def test_onnx_with_wrong_input_count(tmp_path: Path) -> None:
    p = _identity_model(
        tmp_path / "decoder.onnx",
        [("audio_codes", TensorProto.INT64, [32, "b", "t"])],
        [("a", TensorProto.INT64, [32, "b", "t"]), ("l", TensorProto.INT64, [32, "b", "t"])],
    )
    with pytest.raises(ModelFileError, match="it has 1 inputs.*expected 2"):
        OnnxDecoder(p)


def test_onnx_with_wrong_rank_or_size(tmp_path: Path) -> None:
    p = _identity_model(
        tmp_path / "decoder.onnx",
        [("audio_codes", TensorProto.INT64, ["b", "t"]), ("n_quantizers", TensorProto.INT64, [])],
        [("a", TensorProto.INT64, ["b", "t"]), ("l", TensorProto.INT64, [])],
    )
    with pytest.raises(ModelFileError, match=r"input 0 .* rank 2"):
        OnnxDecoder(p)
    from streamtts.demo.codec import build_decoder_model

    p = tmp_path / "decoder2.onnx"
    onnx.save_model(build_decoder_model(16), str(p))
    # 16 levels: too few for the published model's 32 codebooks, right for a 16-codebook one
    with pytest.raises(ModelFileError, match="its codes have 16 codebook levels, the model has n_vq 32"):
        OnnxDecoder(p)
    assert OnnxDecoder(p, n_vq=16)._s.levels == 16


def test_n_quantizers_of_shape_one_is_fed_as_such(tmp_path: Path) -> None:
    # Some exports declare n_quantizers as (1,) instead of a scalar: fed accordingly.
    from streamtts.demo.codec import build_decoder_model

    m = build_decoder_model()
    m.graph.input[1].type.tensor_type.shape.dim.add().dim_value = 1
    onnx.save_model(m, str(tmp_path / "decoder.onnx"))
    d = OnnxDecoder(tmp_path / "decoder.onnx")
    assert d.decode(_codes(0, 1, 2)).shape == (1, 2 * F)


def test_config_errors(cfg: EngineConfig) -> None:
    import msgspec

    empty = msgspec.structs.replace(cfg, audio_decoder_onnx="", audio_encoder_onnx="")
    with pytest.raises(ConfigError, match="audio_decoder_onnx is not set"):
        load_decoder(empty)
    with pytest.raises(ConfigError, match="audio_encoder_onnx is not set"):
        load_encoder(empty)
    torch = msgspec.structs.replace(cfg, audio_backend="torch")
    with pytest.raises(ConfigError, match="not supported"):
        load_decoder(torch)


def test_missing_onnxruntime_says_how_to_install(
    codec_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import now raises ImportError
    with pytest.raises(CodecError, match="pip install onnxruntime"):
        OnnxDecoder(codec_dir / "decoder.onnx")


def test_gpu_request_without_cuda_falls_back_to_cpu(
    codec_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this ONNX Runtime has CUDA")
    caplog.set_level(logging.INFO, logger="streamtts")
    d = OnnxDecoder(codec_dir / "decoder.onnx", use_gpu=True, threads=1)
    assert d.provider == "CPUExecutionProvider"
    assert any("no CUDA provider" in r.getMessage() for r in caplog.records)


@pytest.mark.gpu
def test_gpu_decoder_matches_cpu(codec_dir: Path) -> None:
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("needs onnxruntime-gpu with CUDA")
    gpu = OnnxDecoder(codec_dir / "decoder.onnx", use_gpu=True)
    cpu = OnnxDecoder(codec_dir / "decoder.onnx")
    assert gpu.provider == "CUDAExecutionProvider"
    c = _codes(0, 3, 20)
    assert np.abs(gpu.decode(c) - cpu.decode(c)).max() <= 1e-4


def test_decoders_of_one_graph_share_its_session_until_the_last_goes(codec_dir: Path) -> None:
    """Engines in one process (a server's several members) that load the same codec graph
    hold one ONNX Runtime session (codec/sessions.py): its weights once in memory. A 16-level
    member uses the 32-level graph's first 16 (as above); other threads make another session.
    When the last holder goes, so does the session (a model unloaded when idle frees it)."""
    import gc

    from streamtts.codec.sessions import shared_sessions

    a = OnnxDecoder(codec_dir / "decoder.onnx", n_vq=32, threads=3)
    b = OnnxDecoder(codec_dir / "decoder.onnx", n_vq=16, threads=3)
    c = OnnxDecoder(codec_dir / "decoder.onnx", n_vq=32, threads=2)
    assert a._s.session is b._s.session and c._s.session is not a._s.session
    codes = _codes(5, 1, 4)
    np.testing.assert_array_equal(a.decode(codes), c.decode(codes))
    alive = shared_sessions()
    del a
    gc.collect()
    assert shared_sessions() == alive  # b still holds it
    del b
    gc.collect()
    assert shared_sessions() == alive - 1
    del c
