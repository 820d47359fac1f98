"""GPU tests (``pytest -m gpu``): CUDA llama.cpp, fused heads on the GPU, TensorRT and ORT CUDA codecs.

Skipped, with the reason, on machines without an NVIDIA GPU and the CUDA build of
the bridge (``STREAMTTS_CUDA=1 native/build.sh``); ``scripts/gpu_check.sh`` runs them.
The TensorRT / onnxruntime-gpu tests also skip when those packages are missing.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamtts import Engine
from streamtts.config import SamplingParams
from streamtts.core.tokens import TokenIds
from streamtts.model import _llama
from streamtts.request import StreamOptions

IDS = TokenIds()
TEXT = "Hello there, this is a streaming test."
GREEDY = StreamOptions(sampling=SamplingParams.greedy(), seed=1)


def _no_gpu_reason() -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "no NVIDIA GPU: nvidia-smi not found"
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"no NVIDIA GPU: nvidia-smi failed ({exc})"
    if out.returncode != 0 or "GPU" not in out.stdout:
        return "no NVIDIA GPU visible to nvidia-smi"
    if not _llama._variant_lib("cuda").is_file():
        return "the CUDA bridge is not built (STREAMTTS_CUDA=1 native/build.sh)"
    return None


_REASON = _no_gpu_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]


@pytest.fixture(scope="module", autouse=True)
def cuda_bridge() -> None:
    """The process must have loaded the CUDA build of the bridge (one bridge per process)."""
    _llama.load_bridge()
    info = _llama.system_info()
    if "CUDA" not in info:
        pytest.skip(
            f"the loaded bridge has no CUDA backend ({_llama.loaded_path()}); run with STREAMTTS_CUDA=1"
        )


@pytest.fixture(scope="module")
def fused16(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from streamtts.convert.fused_writer import convert

    gg = demo_model_dir / "MOSS-TTS-GGUF"
    return Path(
        convert(
            gg / "MOSS_TTS_Q4_K_M.gguf", gg / "lm_heads", tmp_path_factory.mktemp("f") / "f16.gguf"
        ).path
    )


def test_full_offload_fused_logits_match_numpy_heads(demo_model_dir: Path, fused16: Path) -> None:
    from streamtts.model.backbone import Backbone, BackboneParams
    from streamtts.model.fused import read_fused_info
    from streamtts.model.tables import AudioHeads, Embedder

    gg = demo_model_dir / "MOSS-TTS-GGUF"
    emb = Embedder(gg / "embeddings", IDS)
    heads = AudioHeads(gg / "lm_heads", IDS, emb.n_embd)
    rows = np.full((24, 33), 1024)
    rows[:, 0] = np.arange(1000, 1024)
    x = emb.embed_rows(rows)
    pos = np.arange(24, dtype=np.int32)
    seq = np.zeros(24, np.int32)
    out = np.zeros(24, np.int8)
    out[-1] = 1

    def run(path: Path, hidden: bool, cols: Any) -> tuple[np.ndarray | None, np.ndarray]:
        p = BackboneParams(
            model_path=str(path), n_ctx=256, n_batch=64, n_gpu_layers=-1, flash_attn="enabled"
        )
        with Backbone(p) as bb:
            bb.set_logit_columns(cols)
            h = np.zeros((1, bb.n_embd), np.float32) if hidden else None
            lg = np.zeros((1, bb.n_logit_columns), np.float32)
            bb.decode(x, pos, seq, out, h, lg)
            return h, lg

    h, _ = run(gg / "MOSS_TTS_Q4_K_M.gguf", True, None)
    _, lg = run(fused16, False, read_fused_info(fused16).columns(IDS))
    assert h is not None
    audio = heads(h, np.zeros((1, 32 * 1025), np.float32)).reshape(-1)
    np.testing.assert_allclose(lg[0, 2:], audio, atol=2e-3 * float(np.abs(audio).max()), rtol=0)


def _codes(demo_model_dir: Path, **kw: Any) -> tuple[np.ndarray, dict[str, Any]]:
    async def main() -> tuple[np.ndarray, dict[str, Any]]:
        async with Engine.from_config(
            demo_model_dir / "config.yaml", n_gpu_layers=-1, max_streams=2, **kw
        ) as e:
            return (await e.generate(TEXT, options=GREEDY)).codes, dict(e.info)

    return asyncio.run(main())


def test_engine_on_gpu_greedy_codes_fused_vs_numpy(demo_model_dir: Path, fused16: Path) -> None:
    """On CUDA a single-row f16 matmul accumulates the f32 hidden state in f32 (no f16
    rounding as on CPU), so even the f16 fused file should give NumPy mode's codes."""
    ref, info_n = _codes(demo_model_dir, heads_backend="numpy")
    got, info_f = _codes(demo_model_dir, fused_gguf=str(fused16))
    assert info_f["heads"] == "fused (llama.cpp)" and info_n["heads"] == "numpy"
    assert ref.shape[0] >= 2
    np.testing.assert_array_equal(got, ref)


def test_onnx_cuda_bound_decoder(demo_model_dir: Path) -> None:
    from streamtts.codec.onnx import OnnxDecoder
    from streamtts.codec.onnx_cuda import OnnxBoundDecoder, cuda_provider_available

    if not cuda_provider_available():
        pytest.skip("onnxruntime-gpu (CUDAExecutionProvider) is not installed")
    path = demo_model_dir / "MOSS-Audio-Tokenizer-ONNX" / "decoder.onnx"
    dec = OnnxBoundDecoder(path, device="cuda")
    ref = OnnxDecoder(path)
    rng = np.random.default_rng(0)
    bufs = dec.buffers()
    for b, t in [(1, 3), (8, 40), (32, 133)]:
        codes = rng.integers(0, 1024, (b, t, 32))
        np.testing.assert_allclose(dec.decode(codes), ref.decode(codes), atol=1e-4)
    assert dec.buffers() == bufs and dec.allocations == 1


def _trt_or_skip() -> None:
    from streamtts.codec.trt import import_cudart, import_tensorrt
    from streamtts.errors import CodecError

    try:
        import_tensorrt()
        import_cudart()
    except CodecError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def trt_engine(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    _trt_or_skip()
    from streamtts.codec.build.tensorrt import BuildOptions, build_decoder_engine

    onnx = demo_model_dir / "MOSS-Audio-Tokenizer-ONNX" / "decoder.onnx"
    opts = BuildOptions(
        max_batch=8, context_frames=16, chunk_frames=8, precision="fp32", workspace_bytes=1 << 30
    )
    return build_decoder_engine(onnx, tmp_path_factory.mktemp("trt") / "decoder.engine", opts)


def test_trt_decoder_matches_onnx_with_fixed_buffers(
    demo_model_dir: Path, trt_engine: Path
) -> None:
    from streamtts.codec.onnx import OnnxDecoder
    from streamtts.codec.trt import CudaTrtRuntime, TrtDecoder

    rt = CudaTrtRuntime(trt_engine, "decoder")
    dec = TrtDecoder(rt, split_context=16)
    assert len(rt.profiles) == 3 and dec.max_batch == 8 and dec.max_frames == 24
    ref = OnnxDecoder(demo_model_dir / "MOSS-Audio-Tokenizer-ONNX" / "decoder.onnx")
    dev = dict(rt._dev)
    rng = np.random.default_rng(0)
    for b, t in [(1, 1), (3, 24), (8, 10), (2, 70), (11, 5)]:
        codes = rng.integers(0, 1024, (b, t, 32))
        np.testing.assert_allclose(dec.decode(codes), ref.decode(codes), atol=1e-4)
    assert rt._dev == dev  # no device allocation after load
    dec.close()


def test_engine_with_trt_codec(demo_model_dir: Path, trt_engine: Path) -> None:
    opts = StreamOptions(sampling=SamplingParams.greedy(), fixed_frames=20)

    async def run(**kw: Any) -> np.ndarray:
        async with Engine.from_config(
            demo_model_dir / "config.yaml", n_gpu_layers=-1, max_streams=2, **kw
        ) as e:
            return np.concatenate([c.pcm async for c in e.stream(TEXT, options=opts)])

    trt = asyncio.run(
        run(audio_backend="trt", audio_decoder_trt=str(trt_engine), decode_context_frames=16)
    )
    onnx = asyncio.run(run(decode_context_frames=16))
    np.testing.assert_allclose(trt, onnx, atol=1e-4)
