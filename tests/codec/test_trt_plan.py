"""TensorRT codec bookkeeping on CPU: profiles, buffer plan, splitting, and the call path
driven through a stand-in runtime (ONNX Runtime on CPU plays the engine)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamtts import Engine
from streamtts.codec import trt as trt_mod
from streamtts.codec.onnx import OnnxDecoder, OnnxEncoder
from streamtts.codec.trt import TrtDecoder, TrtEncoder, import_cudart, import_tensorrt
from streamtts.codec.trt_plan import (
    BufferPlan,
    IOTensor,
    Kind,
    ProfileShape,
    batch_buckets,
    choose_profile,
    main_input_shape,
    plan_buffers,
    profile_from_input,
    split_batch,
    split_frames,
    streaming_profiles,
)
from streamtts.config import SamplingParams
from streamtts.errors import CodecError, ConfigError, ModelFileError
from streamtts.request import StreamOptions

DEC_IO = [
    IOTensor("audio_codes", True, "int64", (32, -1, -1)),
    IOTensor("n_quantizers", True, "int64", ()),
    IOTensor("audio", False, "float32", (-1, 1, -1)),
    IOTensor("audio_lengths", False, "int64", (-1,)),
]
OFFICIAL = [ProfileShape((1, 1, 1), (1, 100, 500))]  # build_engine.sh: batch 1, up to 40 s


# -- pure planning ----------------------------------------------------------------------------


def test_streaming_profiles_cover_the_scheduler_batches() -> None:
    ps = streaming_profiles(32, context_frames=125, chunk_frames=8)
    assert [p.batch for p in ps] == [(1, 1, 1), (2, 4, 4), (5, 16, 16), (17, 32, 32)]
    assert all(p.frames == (1, 133, 133) for p in ps)
    assert batch_buckets(6, [1, 4, 16]) == [1, 4, 6]
    assert batch_buckets(1) == [1]
    with pytest.raises(ValueError):
        batch_buckets(0)
    assert streaming_profiles(8, 10, 4, max_frames=300)[0].frames == (1, 14, 300)


def test_choose_profile_narrowest_and_uncovered() -> None:
    ps = streaming_profiles(32, 125, 8)
    assert [choose_profile(ps, b, 50) for b in (1, 2, 4, 5, 16, 17, 32)] == [0, 1, 1, 2, 2, 3, 3]
    assert choose_profile(ps, 33, 10) == -1
    assert choose_profile(ps, 1, 134) == -1
    wide = [ProfileShape((1, 16, 32), (1, 8, 64)), ProfileShape((1, 1, 4), (1, 8, 64))]
    assert choose_profile(wide, 3, 8) == 1


def test_profile_from_input_round_trip() -> None:
    for kind in ("decoder", "encoder"):
        k: Kind = "decoder" if kind == "decoder" else "encoder"
        p = ProfileShape((1, 4, 8), (2, 30, 133))
        assert profile_from_input(k, *p.input_shapes(k)) == p
    assert ProfileShape((1, 1, 1), (1, 1, 500)).input_shapes("encoder")[2] == (1, 1, 960000)
    with pytest.raises(ValueError, match="rank 3"):
        profile_from_input("decoder", (1, 2), (1, 2), (1, 2))


def test_split_frames_covers_every_frame_with_context() -> None:
    for t, max_t, ctx in [(10, 10, 5), (50, 20, 8), (133, 40, 125), (7, 3, 1), (1000, 500, 125)]:
        pieces = split_frames(t, max_t, ctx)
        kept: list[int] = []
        for s, k, e in pieces:
            assert 0 <= s <= k < e <= t and e - s <= max_t
            assert k == 0 or k - s == min(ctx, max_t - 1)
            kept.extend(range(k, e))
        assert kept == list(range(t))


def test_split_batch_for_the_official_engine() -> None:
    assert split_batch(3, 40, OFFICIAL) == [(0, 1), (1, 2), (2, 3)]
    assert split_batch(40, 10, streaming_profiles(32, 8, 4)) == [(0, 32), (32, 40)]
    with pytest.raises(ValueError, match="no optimisation profile accepts 600 frames"):
        split_batch(1, 600, OFFICIAL)


def test_buffer_plan_sizes_and_reuse() -> None:
    ps = streaming_profiles(32, 125, 8)
    plan = plan_buffers("decoder", DEC_IO, ps)
    assert (plan.max_batch, plan.max_frames) == (32, 133)
    sizes = {b.role: b.nbytes for b in plan.buffers}
    assert sizes == {
        "main_in": 32 * 32 * 133 * 8,
        "n_quantizers": 8,
        "main_out": 32 * 133 * 1920 * 4,
        "lengths": 32 * 8,
    }
    assert all(b.device and b.host for b in plan.buffers)
    assert plan.transfer_bytes("main_in", 3, 20) == 32 * 3 * 20 * 8
    assert plan.transfer_bytes("main_out", 3, 20) == 3 * 20 * 1920 * 4
    assert plan.transfer_bytes("n_quantizers", 3, 20) == 0  # written once at load
    with pytest.raises(ValueError, match="needs"):
        plan.transfer_bytes("main_in", 33, 20)
    # int32 codes (an engine that cast them) and n_quantizers as a shape tensor (host only)
    io32 = [
        IOTensor("codes", True, "int32", (32, -1, -1)),
        IOTensor("nq", True, "int32", (1,), shape_tensor=True),
        *DEC_IO[2:],
    ]
    plan32 = plan_buffers("decoder", io32, OFFICIAL)
    nq = plan32.by_role("n_quantizers")
    assert not nq.device and nq.host and nq.nbytes == 4
    assert plan32.by_role("main_in").nbytes == 32 * 1 * 500 * 4


def test_plan_rejects_wrong_io() -> None:
    with pytest.raises(ValueError, match="expected 2 inputs and 2 outputs"):
        plan_buffers("decoder", DEC_IO[:3], OFFICIAL)


# -- the call path, on a stand-in runtime ---------------------------------------------------


class FakeRuntime:
    """TrtRuntime on CPU: "device" buffers are NumPy arrays, the engine is ONNX Runtime."""

    def __init__(
        self,
        onnx_path: Path,
        kind: Kind,
        profiles: list[ProfileShape],
        *,
        nq_shape_tensor: bool = False,
        codes_int32: bool = False,
        n_quantizers: int = 32,  # what the codec must be given (the model's n_vq)
    ) -> None:
        import onnxruntime as ort

        self.n_quantizers = n_quantizers
        self.kind: Kind = kind
        self.profiles = profiles
        self.sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        ins, outs = self.sess.get_inputs(), self.sess.get_outputs()
        main_dtype = ("int32" if codes_int32 else "int64") if kind == "decoder" else "float32"
        out_dtype = "float32" if kind == "decoder" else "int64"
        self.io = [
            IOTensor(
                ins[0].name, True, main_dtype, (32, -1, -1) if kind == "decoder" else (-1, 1, -1)
            ),
            IOTensor(ins[1].name, True, "int64", (), shape_tensor=nq_shape_tensor),
            IOTensor(
                outs[0].name, False, out_dtype, (-1, 1, -1) if kind == "decoder" else (32, -1, -1)
            ),
            IOTensor(outs[1].name, False, "int64", (-1,)),
        ]
        self.allocations = 0
        self.executed: list[int] = []
        self.uploaded: list[tuple[str, int]] = []
        self.shapes: dict[int, dict[str, tuple[int, ...]]] = {i: {} for i in range(len(profiles))}
        self.host_bufs: dict[str, np.ndarray] = {}
        self.dev: dict[str, np.ndarray] = {}
        self.plan: BufferPlan | None = None
        self.closed = False

    def allocate(self, plan: BufferPlan) -> None:
        self.allocations += 1
        self.plan = plan
        for spec in plan.buffers:
            self.host_bufs[spec.name] = np.zeros(spec.nbytes, np.uint8)
            if spec.device:
                self.dev[spec.name] = np.zeros(spec.nbytes, np.uint8)

    def host(self, name: str) -> np.ndarray:
        return self.host_bufs[name]

    def upload(self, name: str, nbytes: int) -> None:
        self.uploaded.append((name, nbytes))
        self.dev[name][:nbytes] = self.host_bufs[name][:nbytes]

    def set_shape(self, profile: int, name: str, shape: tuple[int, ...]) -> None:
        if name == self.io[0].name:
            b, t = (shape[1], shape[2]) if self.kind == "decoder" else (shape[0], shape[2] // 1920)
            if not self.profiles[profile].covers(b, t):
                raise CodecError(f"shape {shape} outside profile {profile}")
        self.shapes[profile][name] = shape

    def output_shape(self, profile: int, name: str) -> tuple[int, ...]:
        s = self.shapes[profile][self.io[0].name]
        if self.kind == "decoder":
            return (s[1], 1, s[2] * 1920)
        return (32, s[0], s[2] // 1920)

    def _array(self, t: IOTensor, shape: tuple[int, ...], device: bool = True) -> np.ndarray:
        n = int(np.prod(shape)) * np.dtype(t.dtype).itemsize
        src = self.dev[t.name] if device else self.host_bufs[t.name]
        return src[:n].view(np.dtype(t.dtype)).reshape(shape)

    def execute(self, profile: int) -> None:
        self.executed.append(profile)
        main, nq, out, lens = self.io
        x = self._array(main, self.shapes[profile][main.name])
        q = self._array(nq, (1,), device=not nq.shape_tensor).reshape(())
        assert int(q) == self.n_quantizers
        feed_dtype = np.int64 if self.kind == "decoder" else np.float32
        y, n = self.sess.run(None, {main.name: x.astype(feed_dtype), nq.name: q.astype(np.int64)})
        self._array(out, y.shape)[...] = y
        self._array(lens, n.shape)[...] = n

    def download(self, name: str, nbytes: int) -> None:
        self.host_bufs[name][:nbytes] = self.dev[name][:nbytes]

    def synchronize(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


@pytest.fixture(scope="module")
def codec_dir(demo_model_dir: Path) -> Path:
    return demo_model_dir / "MOSS-Audio-Tokenizer-ONNX"


def _codes(rng: np.random.Generator, b: int, t: int) -> np.ndarray:
    return rng.integers(0, 1024, size=(b, t, 32), dtype=np.int64)


def test_decoder_matches_onnx_and_allocates_once(codec_dir: Path) -> None:
    rt = FakeRuntime(
        codec_dir / "decoder.onnx", "decoder", streaming_profiles(8, 8, 4, max_frames=20)
    )
    dec = TrtDecoder(rt, split_context=8)
    ref = OnnxDecoder(codec_dir / "decoder.onnx")
    assert dec.max_batch == 8 and dec.max_frames == 20
    host_ids = {k: v.ctypes.data for k, v in rt.host_bufs.items()}
    rng = np.random.default_rng(0)
    for b, t, profile in [(1, 5, 0), (3, 12, 1), (8, 20, 2), (1, 1, 0), (2, 20, 1)]:
        rt.executed.clear()
        rt.uploaded.clear()
        codes = _codes(rng, b, t)
        got = dec.decode(codes)
        np.testing.assert_allclose(got, ref.decode(codes), atol=1e-6)
        assert rt.executed == [profile]
        # only the call's prefix crosses to the device; n_quantizers never again
        assert rt.uploaded == [("audio_codes", 32 * b * t * 8)]
    assert rt.allocations == 1
    assert {k: v.ctypes.data for k, v in rt.host_bufs.items()} == host_ids
    assert dec.decode(np.zeros((0, 4, 32), np.int64)).shape == (0, 4 * 1920)
    with pytest.raises(CodecError, match="outside"):
        dec.decode(np.full((1, 2, 32), 1024))  # the pad code must never reach the codec


def test_long_windows_and_big_batches_are_split(codec_dir: Path) -> None:
    """Pieces get `split_context` frames of left context: with the demo decoder's
    4-frame receptive field the stitched result equals one offline decode."""
    rt = FakeRuntime(
        codec_dir / "decoder.onnx", "decoder", streaming_profiles(4, 8, 4, max_frames=20)
    )
    dec = TrtDecoder(rt, split_context=8)
    ref = OnnxDecoder(codec_dir / "decoder.onnx")
    codes = _codes(np.random.default_rng(1), 6, 57)
    np.testing.assert_allclose(dec.decode(codes), ref.decode(codes), atol=1e-6)
    assert rt.allocations == 1


def test_official_single_profile_engine_and_int32_shape_tensor(codec_dir: Path) -> None:
    rt = FakeRuntime(
        codec_dir / "decoder.onnx", "decoder", OFFICIAL, nq_shape_tensor=True, codes_int32=True
    )
    dec = TrtDecoder(rt)
    assert dec.max_batch == 1 and "n_quantizers" not in rt.dev  # read on the host by TensorRT
    codes = _codes(np.random.default_rng(2), 3, 30)
    np.testing.assert_allclose(
        dec.decode(codes), OnnxDecoder(codec_dir / "decoder.onnx").decode(codes), atol=1e-6
    )
    assert rt.executed == [0, 0, 0]


def test_a_16_codebook_model_on_the_32_level_engines(codec_dir: Path) -> None:
    """n_quantizers = 16; the decoder's codes padded to the engine's 32 levels, the
    encoder's first 16 levels kept: as the ONNX Runtime backend does."""
    prof = streaming_profiles(4, 8, 4, max_frames=20)
    dec = TrtDecoder(FakeRuntime(codec_dir / "decoder.onnx", "decoder", prof, n_quantizers=16), n_vq=16)
    codes = _codes(np.random.default_rng(3), 2, 9)[:, :, :16]
    ref = OnnxDecoder(codec_dir / "decoder.onnx", n_vq=16)
    np.testing.assert_allclose(dec.decode(codes), ref.decode(codes), atol=1e-6)
    with pytest.raises(CodecError, match=r"shape \(B, T, 16\)"):
        dec.decode(_codes(np.random.default_rng(3), 1, 2))
    rt = FakeRuntime(codec_dir / "encoder.onnx", "encoder", [ProfileShape((1, 1, 1), (1, 50, 100))], n_quantizers=16)
    enc = TrtEncoder(rt, n_vq=16)
    wav = (0.3 * np.sin(2 * np.pi * 220 * np.arange(1920 * 5) / 24000)).astype(np.float32)
    got = enc.encode(wav)
    assert got.shape == (5, 16)
    np.testing.assert_array_equal(got, OnnxEncoder(codec_dir / "encoder.onnx", n_vq=16).encode(wav))
    assert main_input_shape("decoder", 2, 5, 16) == (16, 2, 5)


def test_encoder_matches_onnx(codec_dir: Path) -> None:
    rt = FakeRuntime(codec_dir / "encoder.onnx", "encoder", [ProfileShape((1, 1, 1), (1, 50, 100))])
    enc = TrtEncoder(rt)
    t = np.arange(1920 * 13) / 24000
    wav = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    np.testing.assert_array_equal(
        enc.encode(wav), OnnxEncoder(codec_dir / "encoder.onnx").encode(wav)
    )
    with pytest.raises(CodecError, match="longer than the TensorRT encoder accepts"):
        enc.encode(np.zeros(1920 * 101, np.float32))
    with pytest.raises(CodecError, match="multiple of 1920"):
        enc.encode(np.zeros(1000, np.float32))


def test_engine_with_audio_backend_trt(
    demo_model_dir: Path, codec_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The official configs' path (audio_backend: trt, audio_decoder_trt: ...) end to end,
    with the stand-in runtime in place of TensorRT: same audio as the ONNX codec."""
    made: list[FakeRuntime] = []

    def fake(path: Any, kind: Kind, device: int = 0) -> FakeRuntime:
        rt = FakeRuntime(
            codec_dir / f"{kind}.onnx",
            kind,
            OFFICIAL if kind == "decoder" else [ProfileShape((1, 1, 1), (1, 100, 500))],
        )
        made.append(rt)
        return rt

    monkeypatch.setattr(trt_mod, "CudaTrtRuntime", fake)
    engine_file = tmp_path / "decoder.engine"
    engine_file.write_bytes(b"stand-in")
    opts = StreamOptions(sampling=SamplingParams.greedy(), fixed_frames=12)

    async def run(**kw: Any) -> np.ndarray:
        async with Engine.from_config(
            demo_model_dir / "config.yaml", n_threads=1, max_streams=2, **kw
        ) as e:
            chunks = [c async for c in e.stream("Hello there.", options=opts)]
            return np.concatenate([c.pcm for c in chunks])

    trt_pcm = asyncio.run(run(audio_backend="trt", audio_decoder_trt=str(engine_file)))
    onnx_pcm = asyncio.run(run())
    assert made and made[0].kind == "decoder" and made[0].executed
    np.testing.assert_allclose(trt_pcm, onnx_pcm, atol=1e-6)


# -- errors when TensorRT is not there ----------------------------------------------------------


def test_missing_packages_name_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(CodecError, match="pip install tensorrt cuda-python"):
        import_tensorrt()
    monkeypatch.setitem(sys.modules, "cuda", None)
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    with pytest.raises(CodecError, match="cuda-python"):
        import_cudart()
    with pytest.raises(ModelFileError, match="file not found"):
        trt_mod.CudaTrtRuntime(tmp_path / "nope.engine", "decoder")
    engine = tmp_path / "d.engine"
    engine.write_bytes(b"x")
    with pytest.raises(CodecError, match="pip install tensorrt"):
        trt_mod.CudaTrtRuntime(engine, "decoder")


def test_trt_backend_config_errors(demo_model_dir: Path) -> None:
    from streamtts.config import load_config

    cfg = load_config(demo_model_dir / "config.yaml", audio_backend="trt")
    with pytest.raises(ConfigError, match="streamtts build-engine"):
        trt_mod.load_trt_decoder(cfg)


def test_cli_build_engine(
    demo_model_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamtts.cli.main import main

    onnx = demo_model_dir / "MOSS-Audio-Tokenizer-ONNX" / "decoder.onnx"
    assert main(["build-engine", "--onnx", str(onnx), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "profile 3: batch 17..32 (opt 32), frames 1..133 (opt 133)" in out
    assert "MB device" in out
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    assert main(["build-engine", "--onnx", str(onnx), "--out", "/tmp/never.engine"]) == 2
    assert "pip install tensorrt" in capsys.readouterr().err


def test_main_input_shape() -> None:
    assert main_input_shape("decoder", 2, 5) == (32, 2, 5)
    assert main_input_shape("encoder", 1, 5) == (1, 1, 9600)
