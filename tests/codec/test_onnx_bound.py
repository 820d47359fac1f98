"""ONNX Runtime decoder with I/O binding (the CUDA middle option), exercised on the CPU provider."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamtts.codec import load_decoder, onnx_cuda
from streamtts.codec.onnx import OnnxDecoder
from streamtts.codec.onnx_cuda import OnnxBoundDecoder
from streamtts.config import load_config
from streamtts.errors import CodecError


@pytest.fixture(scope="module")
def decoder_path(demo_model_dir: Path) -> Path:
    return demo_model_dir / "MOSS-Audio-Tokenizer-ONNX" / "decoder.onnx"


def test_bound_decoder_matches_plain_and_reuses_buffers(decoder_path: Path) -> None:
    dec = OnnxBoundDecoder(decoder_path, device="cpu", max_frames=40)
    ref = OnnxDecoder(decoder_path)
    rng = np.random.default_rng(0)
    first = dec.buffers()
    for b, t in [(1, 1), (3, 17), (32, 40), (2, 5)]:
        codes = rng.integers(0, 1024, (b, t, 32))
        got = dec.decode(codes)
        assert got.shape == (b, t * 1920) and got.dtype == np.float32
        np.testing.assert_allclose(got, ref.decode(codes), atol=1e-6)
    assert dec.buffers() == first and dec.allocations == 1
    # a longer window grows the buffers once; a bigger batch is split
    codes = rng.integers(0, 1024, (40, 41, 32))
    np.testing.assert_allclose(dec.decode(codes), ref.decode(codes), atol=1e-6)
    assert dec.allocations == 2
    assert dec.decode(np.zeros((0, 3, 32), np.int64)).shape == (0, 3 * 1920)


def test_results_do_not_alias_the_reused_buffer(decoder_path: Path) -> None:
    dec = OnnxBoundDecoder(decoder_path, device="cpu")
    a = dec.decode(np.full((1, 4, 32), 7))
    keep = a.copy()
    dec.decode(np.full((1, 4, 32), 900))
    np.testing.assert_array_equal(a, keep)


def test_load_decoder_picks_bound_decoder_only_with_cuda(
    demo_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = load_config(demo_model_dir / "config.yaml", use_gpu_audio=True)
    assert type(load_decoder(cfg)) is OnnxDecoder  # CPU onnxruntime: no CUDA provider
    # provider listed but unusable (missing CUDA libraries): a warning, then the CPU decoder
    monkeypatch.setattr(onnx_cuda, "cuda_provider_available", lambda: True)
    assert type(load_decoder(cfg)) is OnnxDecoder
    with pytest.raises(CodecError, match="did not load the CUDA provider"):
        OnnxBoundDecoder(cfg.audio_decoder_onnx, device="cuda")
