"""Fused-heads GGUF (streamtts convert): file contents, llama.cpp loading, logits, engine codes."""

from __future__ import annotations

import asyncio
import logging
import shutil
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader

from streamtts import Engine
from streamtts.config import SamplingParams, load_config
from streamtts.convert import fused_writer as fused_convert
from streamtts.convert.fused_writer import convert
from streamtts.core.tokens import TokenIds
from streamtts.demo import random_quant
from streamtts.errors import ConfigError, ModelFileError
from streamtts.model import fused
from streamtts.model.backbone import Backbone, BackboneParams
from streamtts.model.fused import (
    FUSED_VERSION,
    find_fused_gguf,
    fused_columns,
    fused_path_for,
    read_fused_info,
)
from streamtts.model.official import official_greedy_frames
from streamtts.model.tables import AudioHeads, Embedder
from streamtts.request import StreamOptions

IDS = TokenIds()
N_AUDIO = IDS.n_vq * IDS.audio_rows
TEXT = "Hello there, this is a streaming test."
GREEDY = StreamOptions(sampling=SamplingParams.greedy(), seed=1)


def gg(root: Path) -> Path:
    return root / "MOSS-TTS-GGUF"


def src_gguf(root: Path) -> Path:
    return gg(root) / "MOSS_TTS_Q4_K_M.gguf"


@pytest.fixture(scope="module")
def fused_files(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """f16 and f32 fused files of the demo model, written outside the demo folder.

    (A ``<backbone>.fused.gguf`` inside the shared demo folder would switch every other
    test's engine to fused heads.)
    """
    out = tmp_path_factory.mktemp("fused")
    heads = gg(demo_model_dir) / "lm_heads"
    return {
        "f16": Path(convert(src_gguf(demo_model_dir), heads, out / "f16.gguf").path),
        "f32": Path(
            convert(src_gguf(demo_model_dir), heads, out / "f32.gguf", audio_dtype="f32").path
        ),
    }


@pytest.fixture(scope="module")
def quant_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Q4_K_M model (Q4_K / Q6_K blocks) of the tiny GPU-check shape."""
    root = tmp_path_factory.mktemp("q4km")
    random_quant.write_model(root, random_quant.SHAPES["tiny"], "Q4_K_M")
    return root


def _fields(path: Path) -> dict[str, Any]:
    r = GGUFReader(str(path))
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


# -- file contents ------------------------------------------------------------------------


def test_round_trip_metadata_and_rows(demo_model_dir: Path, fused_files: dict[str, Path]) -> None:
    src = src_gguf(demo_model_dir)
    info = read_fused_info(fused_files["f16"])
    assert info.version == FUSED_VERSION
    assert (info.n_vq, info.audio_rows, info.audio_offset) == (32, 1025, 2)
    assert info.text_ids == (IDS.gen_slot, IDS.delay_slot)
    assert info.rows == 2 + N_AUDIO and not info.has_text_head
    assert info.dtype == "F16" and info.text_source == "gguf:output.weight (F16)"
    assert info.source_name == src.name and info.source_bytes == src.stat().st_size
    assert read_fused_info(fused_files["f32"]).dtype == "F32"

    a, b = _fields(src), _fields(fused_files["f16"])
    assert b["tokenizer.ggml.model"] == "none"
    assert b["qwen3.vocab_size"] == info.rows
    assert not [k for k in b if k.startswith("tokenizer.") and k != "tokenizer.ggml.model"]
    for k, v in a.items():  # every other key is copied unchanged
        if not k.startswith("tokenizer.") and k != "qwen3.vocab_size":
            assert b[k] == v, k
    assert {k for k in b if k.startswith("streamtts.fused.")} >= {
        "streamtts.fused.version", "streamtts.fused.n_vq", "streamtts.fused.audio_rows",
        "streamtts.fused.text_ids", "streamtts.fused.has_text_head",
    }  # fmt: skip


def test_tensors_copied_unchanged_and_heads_in_place(
    demo_model_dir: Path, fused_files: dict[str, Path]
) -> None:
    r_src = {t.name: t for t in GGUFReader(str(src_gguf(demo_model_dir))).tensors}
    r_out = {t.name: t for t in GGUFReader(str(fused_files["f16"])).tensors}
    assert set(r_src) == set(r_out)
    for name, t in r_src.items():
        if name in ("output.weight", "token_embd.weight"):
            continue
        o = r_out[name]
        assert o.tensor_type == t.tensor_type and list(o.shape) == list(t.shape), name
        assert np.array_equal(np.asarray(o.data), np.asarray(t.data)), name
    emb = r_out["token_embd.weight"]
    assert emb.tensor_type == Q.Q4_0 and int(emb.shape[1]) == 2 + N_AUDIO
    assert not np.asarray(emb.data).any()  # zeros: never read
    out = np.asarray(r_out["output.weight"].data)
    text = np.asarray(r_src["output.weight"].data)
    np.testing.assert_array_equal(out[:2], text[[IDS.gen_slot, IDS.delay_slot]])
    heads = gg(demo_model_dir) / "lm_heads"
    for k in (0, 17, 31):
        want = np.load(heads / f"lm_head_audio_{k:02d}.npy")
        np.testing.assert_array_equal(out[2 + k * 1025 : 2 + (k + 1) * 1025], want)


@pytest.mark.parametrize("text_source", ["gguf", "npy"])
def test_full_text_head_on_request(demo_model_dir: Path, tmp_path: Path, text_source: str) -> None:
    info = convert(
        src_gguf(demo_model_dir),
        gg(demo_model_dir) / "lm_heads",
        tmp_path / "th.gguf",
        include_text_head=True,
        text_source=text_source,  # type: ignore[arg-type]
    )
    assert info.text_source.startswith(text_source)
    assert (
        info.has_text_head
        and info.text_head_offset == 2 + N_AUDIO
        and info.text_head_rows == 151936
    )
    assert info.rows == 2 + N_AUDIO + 151936
    out = {t.name: t for t in GGUFReader(info.path).tensors}["output.weight"]
    text = np.load(gg(demo_model_dir) / "lm_heads" / "lm_head_text.npy", mmap_mode="r")
    np.testing.assert_array_equal(np.asarray(out.data)[info.text_head_offset + 1000], text[1000])


def test_convert_streams_with_bounded_memory(
    quant_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fused_convert, "_CHUNK_BYTES", 1 << 20)
    src = src_gguf(quant_model)
    tracemalloc.start()
    info = convert(src, gg(quant_model) / "lm_heads", tmp_path / "q.gguf")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    size = Path(info.path).stat().st_size
    assert size > 20 << 20
    # tensors go from the memory-mapped source to the file in 1 MB chunks; only the
    # header, the 2 dequantized text rows and one head table sit in memory at a time
    assert peak < 8 << 20, f"peak {peak / 1e6:.1f} MB for a {size / 1e6:.0f} MB file"


def test_convert_resident_memory_stays_small(quant_model: Path, tmp_path: Path) -> None:
    """Resident memory, not just Python allocations: the source is read with file reads,
    not through a memory map whose touched pages would all count as resident."""
    import subprocess

    def peak_kb(code: str) -> int:
        code += "; import resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
        out = subprocess.run(
            [sys.executable, "-c", code], check=True, capture_output=True, text=True
        )
        return int(out.stdout.split()[-1])

    src = src_gguf(quant_model)
    base = peak_kb("import numpy, gguf, streamtts.model.fused")
    conv = peak_kb(
        "import streamtts.convert.fused_writer as f; f._CHUNK_BYTES = 1 << 20; "
        f"f.convert({str(src)!r}, {str(gg(quant_model) / 'lm_heads')!r}, {str(tmp_path / 'r.gguf')!r})"
    )
    size_kb = src.stat().st_size // 1024
    assert size_kb > 40_000
    assert conv - base < 16_000, (
        f"{conv - base} kB over the import baseline for a {size_kb} kB source"
    )


def test_quantized_source_raw_blocks_and_dequantized_text_rows(
    quant_model: Path, tmp_path: Path
) -> None:
    from gguf.quants import dequantize

    src = src_gguf(quant_model)
    info = convert(src, gg(quant_model) / "lm_heads", tmp_path / "q32.gguf", audio_dtype="f32")
    assert info.text_source == "gguf:output.weight (Q6_K)"
    r_src = {t.name: t for t in GGUFReader(str(src)).tensors}
    r_out = {t.name: t for t in GGUFReader(info.path).tensors}
    kinds = {t.tensor_type for t in r_src.values()}
    assert {Q.Q4_K, Q.Q6_K} <= kinds
    for name, t in r_src.items():
        if name not in ("output.weight", "token_embd.weight"):
            assert r_out[name].tensor_type == t.tensor_type
            assert np.array_equal(np.asarray(r_out[name].data), np.asarray(t.data)), (
                name
            )  # no requantisation
    rows = np.asarray(r_src["output.weight"].data)[[IDS.gen_slot, IDS.delay_slot]]
    np.testing.assert_array_equal(
        np.asarray(r_out["output.weight"].data)[:2], dequantize(rows, Q.Q6_K)
    )


# -- llama.cpp (CPU) ----------------------------------------------------------------------


def _decode_logits(
    path: Path, root: Path, *, hidden: bool, cols: np.ndarray | None
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Prefill a 40-row prompt, then 12 single-row steps; the hidden states / logits of each."""
    emb = Embedder(gg(root) / "embeddings", IDS)
    rng = np.random.default_rng(3)
    s = 40
    rows = np.full((s, 33), 1024)
    rows[:, 0] = rng.integers(1000, 100000, s)
    rows[-1, 0] = IDS.audio_start
    with Backbone(BackboneParams(model_path=str(path), n_ctx=256, n_batch=64, n_threads=1)) as bb:
        bb.set_logit_columns(cols)
        h = np.zeros((1, bb.n_embd), np.float32) if hidden else None
        lg = np.zeros((1, bb.n_logit_columns), np.float32)
        out = np.zeros(s, np.int8)
        out[-1] = 1
        hs, ls = [], []
        bb.decode(
            emb.embed_rows(rows), np.arange(s, dtype=np.int32), np.zeros(s, np.int32), out, h, lg
        )
        for t in range(13):
            if h is not None:
                hs.append(h[0].copy())
            ls.append(lg[0].copy())
            r = np.array([[IDS.gen_slot, *rng.integers(0, 1024, 32)]])
            bb.decode(
                emb.embed_rows(r),
                np.array([s + t], np.int32),
                np.zeros(1, np.int32),
                np.ones(1, np.int8),
                h,
                lg,
            )
    return hs, ls


@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_logits_match_numpy_heads(
    demo_model_dir: Path, fused_files: dict[str, Path], dtype: str
) -> None:
    """Fused logits = the NumPy heads' logits, up to llama.cpp's rounding of the hidden state.

    On CPU, ggml multiplies an f16 weight matrix with the activations rounded to f16
    (its vec_dot type); with f32 weights it keeps them in f32. So the f16 file matches
    ``W @ f16(h)`` and the f32 file ``W @ h``, both to float32 accumulation error.
    """
    info = read_fused_info(fused_files[dtype])
    cols = info.columns(IDS)
    hs, _ = _decode_logits(src_gguf(demo_model_dir), demo_model_dir, hidden=True, cols=None)
    _, ls = _decode_logits(fused_files[dtype], demo_model_dir, hidden=False, cols=cols)
    heads = AudioHeads(gg(demo_model_dir) / "lm_heads", IDS, hs[0].size)
    text_w = np.load(gg(demo_model_dir) / "lm_heads" / "lm_head_text.npy", mmap_mode="r")[
        [IDS.gen_slot, IDS.delay_slot]
    ]
    buf = np.zeros((1, N_AUDIO), np.float32)
    worst = 0.0
    for h, lg in zip(hs, ls, strict=True):
        x = h.astype(np.float16).astype(np.float32) if dtype == "f16" else h
        audio = heads(x[None], buf).reshape(-1)
        text = text_w.astype(np.float32) @ x
        scale = float(np.abs(audio).max())
        np.testing.assert_allclose(lg[2:], audio, atol=2e-5 * scale, rtol=0)
        np.testing.assert_allclose(lg[:2], text, atol=2e-5 * float(np.abs(text).max()), rtol=0)
        # against the NumPy heads on the unrounded hidden state (what NumPy mode uses)
        worst = max(worst, float(np.abs(lg[2:] - heads(h[None], buf).reshape(-1)).max()) / scale)
    assert worst < (1e-3 if dtype == "f16" else 1e-5)


def test_text_logits_bit_identical_to_backbone_output_layer(
    demo_model_dir: Path, fused_files: dict[str, Path]
) -> None:
    """f16 file: the gen/delay logits are the very numbers NumPy mode gets from llama.cpp."""
    info = read_fused_info(fused_files["f16"])
    _, ref = _decode_logits(
        src_gguf(demo_model_dir),
        demo_model_dir,
        hidden=True,
        cols=np.array([IDS.gen_slot, IDS.delay_slot]),
    )
    _, got = _decode_logits(
        fused_files["f16"], demo_model_dir, hidden=False, cols=info.columns(IDS)
    )
    for a, b in zip(ref, got, strict=True):
        np.testing.assert_array_equal(a, b[:2])


def test_quantized_fused_model_loads_and_computes_text_rows(
    quant_model: Path, tmp_path: Path
) -> None:
    info = convert(
        src_gguf(quant_model), gg(quant_model) / "lm_heads", tmp_path / "q.gguf", audio_dtype="f32"
    )
    hs, _ = _decode_logits(src_gguf(quant_model), quant_model, hidden=True, cols=None)
    _, ls = _decode_logits(Path(info.path), quant_model, hidden=False, cols=info.columns(IDS))
    w = np.asarray({t.name: t for t in GGUFReader(info.path).tensors}["output.weight"].data)
    for h, lg in zip(hs, ls, strict=True):
        want = w[:2].astype(np.float32) @ h
        np.testing.assert_allclose(
            lg[:2], want, atol=1e-4 * float(np.abs(want).max()) + 1e-6, rtol=0
        )


def test_fused_columns_validates_loaded_model(
    demo_model_dir: Path, fused_files: dict[str, Path]
) -> None:
    with Backbone(
        BackboneParams(model_path=str(fused_files["f16"]), n_ctx=64, n_batch=8, n_threads=1)
    ) as bb:
        assert bb.n_vocab == 2 + N_AUDIO
        cols = fused_columns(bb, IDS)
        assert cols.dtype == np.int32 and cols.tolist() == list(range(2 + N_AUDIO))
    with Backbone(
        BackboneParams(model_path=str(src_gguf(demo_model_dir)), n_ctx=64, n_batch=8, n_threads=1)
    ) as bb:
        with pytest.raises(ModelFileError, match="no streamtts.fused.version"):
            fused_columns(bb, IDS)


# -- the engine -----------------------------------------------------------------------------


def _greedy_codes(
    cfg: Path, texts: list[str], options: StreamOptions = GREEDY, max_streams: int = 2, **kw: Any
) -> tuple[list[np.ndarray], dict[str, Any]]:
    async def main() -> tuple[list[np.ndarray], dict[str, Any]]:
        async with Engine.from_config(cfg, n_threads=1, max_streams=max_streams, **kw) as e:
            codes = [(await e.generate(t, options=options)).codes for t in texts]
            return codes, dict(e.info)

    return asyncio.run(main())


def test_engine_greedy_codes_identical_fused_vs_numpy(
    demo_model_dir: Path, fused_files: dict[str, Path]
) -> None:
    """f32 fused heads: the same greedy codes as NumPy heads (see the logits test for f16)."""
    cfg = demo_model_dir / "config.yaml"
    texts = [TEXT, "Short."]
    ref, info_n = _greedy_codes(cfg, texts, heads_backend="numpy")
    got, info_f = _greedy_codes(cfg, texts, fused_gguf=str(fused_files["f32"]))
    assert info_n["heads"] == "numpy" and info_f["heads"] == "fused (llama.cpp)"
    assert info_n["logits"] == "copied" and info_f["logits"] == "lent"
    for a, b in zip(ref, got, strict=True):
        assert a.shape[0] >= 2
        np.testing.assert_array_equal(a, b)


def test_engine_reads_lent_logits_as_it_reads_copied_ones(demo_model_dir: Path, fused_files: dict[str, Path]) -> None:
    """f32 fused heads: a step with no prompt piece reads the logits where llama.cpp left
    them (stt_decode_lend, nothing copied); the codes are those of copied rows, a forced
    length (its pair logit masked in the lent rows) and sampled codes included."""
    cfg = demo_model_dir / "config.yaml"
    options = [GREEDY, StreamOptions(seed=5, fixed_frames=9), StreamOptions(seed=7)]

    async def main(lend: bool) -> tuple[list[np.ndarray], int]:
        async with Engine.from_config(cfg, n_threads=1, max_streams=2, fused_gguf=str(fused_files["f32"])) as e:
            core = e._core
            assert core.lend_logits, "the fused heads' engine does not lend"
            core.lend_logits, core.lent_steps = lend, 0
            codes = [(await e.generate(TEXT, options=o)).codes for o in options]
            return codes, core.lent_steps

    copied, n_copied = asyncio.run(main(False))
    lent, n_lent = asyncio.run(main(True))
    assert n_copied == 0 and n_lent > 0
    assert copied[1].shape[0] == 9
    for a, b in zip(copied, lent, strict=True):
        np.testing.assert_array_equal(a, b)


def test_engine_picks_up_fused_file_next_to_backbone(
    demo_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "model"
    shutil.copytree(demo_model_dir, root)
    cfg = load_config(root / "config.yaml")
    assert find_fused_gguf(cfg) == ""
    convert(cfg.backbone_gguf, cfg)  # default name: <backbone>.fused.gguf
    target = fused_path_for(cfg.backbone_gguf)
    assert target.is_file()
    assert find_fused_gguf(cfg) == str(target)
    assert find_fused_gguf(load_config(root / "config.yaml", heads_backend="numpy")) == ""
    _, info = _greedy_codes(root / "config.yaml", ["Hi."])
    assert info["heads"] == "fused (llama.cpp)" and info["backbone"] == str(target)

    # a stale file (other audio heads) is ignored, with a warning
    h = root / "MOSS-TTS-GGUF" / "lm_heads" / "lm_head_audio_05.npy"
    arr = np.load(h)
    arr[0, 0] += 1
    np.save(h, arr)
    with caplog.at_level(logging.WARNING, logger="streamtts.model.fused"):
        assert find_fused_gguf(cfg) == ""
    assert "audio heads differ" in caplog.text


# -- bad files ------------------------------------------------------------------------------


def test_bad_files_give_clear_errors(
    demo_model_dir: Path, fused_files: dict[str, Path], tmp_path: Path
) -> None:
    heads = gg(demo_model_dir) / "lm_heads"
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(ModelFileError, match="not a readable GGUF"):
        read_fused_info(junk)
    with pytest.raises(ModelFileError, match="file not found"):
        read_fused_info(tmp_path / "missing.gguf")
    with pytest.raises(ModelFileError, match="no streamtts.fused.version"):
        read_fused_info(src_gguf(demo_model_dir))
    with pytest.raises(ModelFileError, match="already a fused GGUF"):
        convert(fused_files["f16"], heads, tmp_path / "again.gguf")
    with pytest.raises(ConfigError, match="must not overwrite"):
        convert(src_gguf(demo_model_dir), heads, src_gguf(demo_model_dir))
    # head tables that are not there / of the wrong width
    bad_heads = tmp_path / "heads"
    bad_heads.mkdir()
    for k in range(32):
        np.save(
            bad_heads / f"lm_head_audio_{k:02d}.npy",
            np.zeros((1025, 8 if k == 7 else 64), np.float16),
        )
    with pytest.raises(ModelFileError, match="lm_head_audio_07.npy"):
        convert(src_gguf(demo_model_dir), bad_heads, tmp_path / "x.gguf")
    (bad_heads / "lm_head_audio_07.npy").unlink()
    with pytest.raises(ModelFileError, match="lm_head_audio_07.npy.*file not found"):
        convert(src_gguf(demo_model_dir), bad_heads, tmp_path / "x.gguf")
    assert not list(tmp_path.glob(".*tmp"))  # nothing half-written left behind


def test_incompatible_fused_file(
    demo_model_dir: Path,
    fused_files: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    info = read_fused_info(fused_files["f16"])
    other = TokenIds(delay_slot=151661)
    with pytest.raises(ModelFileError, match="delay slot token 151661"):
        info.columns(other)
    with pytest.raises(ModelFileError, match="the file has 32 codebooks, the model has 16"):
        info.columns(TokenIds(n_vq=16))
    monkeypatch.setattr(fused, "FUSED_VERSION", 99)
    convert(src_gguf(demo_model_dir), gg(demo_model_dir) / "lm_heads", tmp_path / "v99.gguf")
    monkeypatch.undo()
    with pytest.raises(ModelFileError, match="version 99"):
        read_fused_info(tmp_path / "v99.gguf")
    # the engine refuses it at load with the same message
    with pytest.raises(ModelFileError, match="version 99"):
        Engine.from_config(
            demo_model_dir / "config.yaml", fused_gguf=str(tmp_path / "v99.gguf")
        ).load()


def test_cli_convert_prints_config_line(
    demo_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from streamtts.cli.main import main

    out = tmp_path / "cli.fused.gguf"
    rc = main(
        [
            "convert",
            "--config",
            str(demo_model_dir / "config.yaml"),
            "--out",
            str(out),
            "--audio-dtype",
            "f32",
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert f"fused_gguf: {out}" in text
    assert read_fused_info(out).dtype == "F32"


# -- written on first load (the default) -----------------------------------------------------


def test_text_only_file_keeps_raw_rows_and_computes_the_same_bits(
    quant_model: Path, tmp_path: Path
) -> None:
    """audio_dtype 'text': the gen/delay rows as the source's raw Q6_K blocks, and llama.cpp
    gives the same hidden states and the same two logits as with the whole text head."""
    src = src_gguf(quant_model)
    info = convert(src, gg(quant_model) / "lm_heads", tmp_path / "t.gguf", audio_dtype="text")
    assert not info.has_audio and info.rows == 2 and info.dtype == "Q6_K"
    assert info.columns(IDS).tolist() == [0, 1]
    r_src = {t.name: t for t in GGUFReader(str(src)).tensors}
    r_out = {t.name: t for t in GGUFReader(info.path).tensors}
    rows = np.asarray(r_src["output.weight"].data)[[IDS.gen_slot, IDS.delay_slot]]
    assert np.array_equal(np.asarray(r_out["output.weight"].data), rows)  # bit for bit
    pair = np.array([IDS.gen_slot, IDS.delay_slot])
    h_ref, l_ref = _decode_logits(src, quant_model, hidden=True, cols=pair)
    h_got, l_got = _decode_logits(Path(info.path), quant_model, hidden=True, cols=info.columns(IDS))
    for a, b in zip(h_ref + l_ref, h_got + l_got, strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ConfigError, match="text rows only"):
        convert(src, gg(quant_model) / "lm_heads", tmp_path / "x.gguf", audio_dtype="text", include_text_head=True)


def _info(cfg: Path, **kw: Any) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        async with Engine.from_config(cfg, n_threads=1, max_streams=1, **kw) as e:
            await e.generate("Hi.", options=StreamOptions(seed=1, max_new_tokens=40))
            return dict(e.info)

    return asyncio.run(main())


def test_engine_writes_its_gguf_on_first_load_and_reuses_it(demo_model_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "model"
    shutil.copytree(demo_model_dir, root, ignore=shutil.ignore_patterns("*.fused*.gguf"))
    cfg = root / "config.yaml"
    backbone = load_config(cfg).backbone_gguf
    want = Path(backbone).with_name(Path(backbone).stem + ".fused-text.gguf")
    info = _info(cfg)  # CPU, heads_backend auto: text rows only, NumPy audio heads
    assert info["backbone"] == str(want) and info["heads"] == "numpy (text rows only in llama.cpp)"
    stamp = want.stat().st_mtime_ns
    assert _info(cfg)["backbone"] == str(want) and want.stat().st_mtime_ns == stamp  # found, not rewritten
    # the switch, and the NumPy backend, run the plain backbone
    for kw in ({"fuse_on_load": False}, {"heads_backend": "numpy"}):
        assert _info(cfg, **kw) == {**info, "backbone": backbone, "heads": "numpy"}
    # heads_backend fused on CPU: the audio rows join the graph, in f32
    f32 = _info(cfg, heads_backend="fused")
    assert f32["heads"] == "fused (llama.cpp)" and f32["backbone"].endswith(".fused-f32.gguf")
    assert read_fused_info(f32["backbone"]).dtype == "F32"


def test_read_only_weights_folder_writes_to_the_cache(
    demo_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "model"
    shutil.copytree(demo_model_dir, root, ignore=shutil.ignore_patterns("*.fused*.gguf"))
    cache = tmp_path / "cache"
    monkeypatch.setenv("STREAMTTS_CACHE", str(cache))
    weights = gg(root).resolve()
    real = fused_convert._unwritable
    # (tests run as root, for whom a read-only mode bit is no obstacle: say it is)
    monkeypatch.setattr(
        fused_convert, "_unwritable", lambda d, n: "not writable" if d.resolve() == weights else real(d, n)
    )
    info = _info(root / "config.yaml")
    assert Path(info["backbone"]).parent == cache / "fused"
    assert not list(weights.glob("*.fused*.gguf"))
    assert _info(root / "config.yaml")["backbone"] == info["backbone"]  # found there next time
    # nowhere to write: a warning, and the plain backbone
    monkeypatch.setattr(fused_convert, "_unwritable", lambda d, n: "not writable")
    monkeypatch.setenv("STREAMTTS_CACHE", str(tmp_path / "cache2"))
    assert _info(root / "config.yaml")["heads"] == "numpy"


def test_engine_greedy_codes_equal_official_algorithm_on_a_quantized_model(quant_model: Path) -> None:
    """The default arrangement (text rows only + NumPy heads) on a Q4_K_M model: the codes of
    the official algorithm, frame for frame (f32 audio rows in llama.cpp would not be)."""
    cfg_path = quant_model / "config.yaml"
    texts = ["Hello there, this is a streaming test.", "Short."]
    # as benchmarks/greedy_check.py runs it: one stream, the prompt fed whole (no prefix cache)
    options = msgspec.structs.replace(GREEDY, max_new_tokens=60)
    got, info = _greedy_codes(cfg_path, texts, options, max_streams=1, prefix_cache_mib=0)
    assert info["heads"] == "numpy (text rows only in llama.cpp)"
    cfg = load_config(cfg_path)
    for text, codes in zip(texts, got, strict=True):
        np.testing.assert_array_equal(codes, official_greedy_frames(cfg, text, 60, threads=1))
