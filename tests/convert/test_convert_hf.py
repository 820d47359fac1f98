"""``streamtts convert-hf``: the original checkpoint -> the published bundle, with real llama.cpp.

The fixture (tests/fixtures/hf_checkpoint, see its README) is a small random checkpoint
written by the official ``MossTTSDelayModel``; ``official-outputs.json`` lists what the
official three-step chain made of it. Every .npy table and every tensor of the F16 and
Q4_K_M GGUFs must come out byte-identical.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fixtures.hf_checkpoint import checkpoint_dir

from streamtts import cli
from streamtts.config import SamplingParams
from streamtts.convert import hf as cmod
from streamtts.convert.download import CODEC_DIR, GGUF_DIR, check_layout
from streamtts.convert.hf import STAGING_DIR, convert_hf
from streamtts.errors import ConfigError, ModelFileError
from streamtts.request import StreamOptions

FIXTURE = checkpoint_dir()
MANIFEST = json.loads((FIXTURE / "official-outputs.json").read_text())
GREEDY = StreamOptions(sampling=SamplingParams.greedy(), seed=1)
TEXT = "Hello there, this is a streaming test."


def _sha(b: bytes | memoryview) -> str:
    return hashlib.sha256(b).hexdigest()


def _link_codec(root: Path, demo_model_dir: Path) -> None:
    """The codec sits next to the bundle (as `streamtts download` lays it out)."""
    (root / CODEC_DIR).symlink_to(demo_model_dir / CODEC_DIR, target_is_directory=True)


@pytest.fixture(scope="module")
def fixture_bundle(tmp_path_factory: pytest.TempPathFactory, bridge_lib: Any) -> Path:
    """The fixture converted to Q4_K_M (the config's backbone, with its fused-heads GGUF)
    and F16: ``root/MOSS-TTS-GGUF``."""
    root = tmp_path_factory.mktemp("converted")
    convert_hf(FIXTURE, root / GGUF_DIR, ["Q4_K_M", "F16"], fused=True, n_threads=2, gpu=False)
    return root / GGUF_DIR


# -- the official chain's outputs, byte for byte -------------------------------------------------


def test_npy_tables_match_the_official_extract(fixture_bundle: Path) -> None:
    assert len(MANIFEST["npy"]) == 66
    for name, want in MANIFEST["npy"].items():
        sub = "embeddings" if name.startswith("emb") else "lm_heads"
        a = np.load(fixture_bundle / sub / name, allow_pickle=False)
        assert str(a.dtype) == want["dtype"] and list(a.shape) == want["shape"], name
        assert _sha(a.tobytes()) == want["sha256"], name


def _check_gguf(path: Path, want: dict[str, Any]) -> None:
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    got = {t.name: t for t in r.tensors}
    assert sorted(got) == sorted(want["tensors"])
    for name, w in want["tensors"].items():
        t = got[name]
        assert t.tensor_type.name == w["type"], name
        assert [int(d) for d in t.shape] == w["shape"], name
        assert _sha(bytes(t.data)) == w["sha256"], name
    for key, value in want["metadata"].items():
        field = r.fields[key]
        assert (
            field.contents() == pytest.approx(value)
            if isinstance(value, float)
            else field.contents() == value
        ), key


def test_f16_gguf_matches_the_official_converter(fixture_bundle: Path) -> None:
    _check_gguf(fixture_bundle / "MOSS_TTS_F16.gguf", MANIFEST["gguf"]["backbone_f16.gguf"])


def test_q4_k_m_gguf_matches_llama_quantize(fixture_bundle: Path) -> None:
    _check_gguf(fixture_bundle / "MOSS_TTS_Q4_K_M.gguf", MANIFEST["gguf"]["backbone_q4_k_m.gguf"])


def test_gguf_tokenizer_is_what_llama_cpp_loads(fixture_bundle: Path) -> None:
    """Token list and types as convert_hf_to_gguf.py writes them (not in the manifest)."""
    from gguf import GGUFReader
    from tokenizers import Tokenizer

    r = GGUFReader(str(fixture_bundle / "MOSS_TTS_F16.gguf"))
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    merges = r.fields["tokenizer.ggml.merges"].contents()
    tk = Tokenizer.from_file(str(FIXTURE / "tokenizer.json"))
    assert len(tokens) == len(types) == 151936  # the model's padded vocabulary
    for tid in (0, 1000, 151642):
        assert tokens[tid] == tk.id_to_token(tid) and types[tid] == 1  # NORMAL
    assert tokens[151644] == "<|im_start|>" and types[151644] == 3  # CONTROL
    assert tokens[151669] == "[PAD151669]" and types[151669] == 5  # UNUSED
    assert merges[0] == "Ġ t" and len(merges) == 284
    # and the real llama.cpp loads both files (the vocabulary included)
    from streamtts.model.backbone import Backbone, BackboneParams

    for name in ("MOSS_TTS_F16.gguf", "MOSS_TTS_Q4_K_M.gguf"):
        b = Backbone(
            BackboneParams(model_path=str(fixture_bundle / name), n_ctx=64, n_batch=16, n_threads=1)
        )
        try:
            assert b.n_embd == 64
        finally:
            b.close()


# -- the bundle works ----------------------------------------------------------------------------


def test_converted_bundle_keeps_the_layout_and_synthesises(
    fixture_bundle: Path, demo_model_dir: Path, tmp_path: Path
) -> None:
    from streamtts.model.fused import read_fused_info

    root = fixture_bundle.parent
    fused = read_fused_info(fixture_bundle / "MOSS_TTS_Q4_K_M.fused.gguf")
    assert (
        fused.n_vq == 32
        and "fused_gguf: MOSS_TTS_Q4_K_M.fused.gguf" in (fixture_bundle / "config.yaml").read_text()
    )
    _link_codec(root, demo_model_dir)
    try:
        rep = check_layout(root, "Q4_K_M")
        assert rep.ok, rep.problems
        assert rep.n_embd == 64
        wav, codes = tmp_path / "out.wav", tmp_path / "codes.npy"
        rc = cli.main([
            "synth", "--config", str(fixture_bundle / "config.yaml"), "--text", "hi there",
            "--max-new-tokens", "40", "--seed", "1", "--n-threads", "1",
            "--out", str(wav), "--codes-out", str(codes),
        ])  # fmt: skip
        assert rc == 0
        frames = np.load(codes)
        assert frames.ndim == 2 and frames.shape[1] == 32 and frames.shape[0] >= 1
        assert frames.min() >= 0 and frames.max() < 1024
    finally:
        (root / CODEC_DIR).unlink()


def _greedy_codes(config_yaml: Path) -> np.ndarray:
    from streamtts import Engine

    async def main() -> np.ndarray:
        async with Engine.from_config(config_yaml, n_threads=1, max_streams=1) as engine:
            syn = await engine.generate(TEXT, options=GREEDY)
            assert syn.stats.finish_reason == "audio_end"
            return np.asarray(syn.codes)

    return asyncio.run(main())


def test_demo_checkpoint_converts_to_the_demo_bundles_greedy_codes(
    demo_model_dir: Path, tmp_path: Path, bridge_lib: Any
) -> None:
    """Same weights in the HF layout (sharded, transformers-5 config) -> convert -> the
    converted bundle speaks exactly as the demo bundle (greedy codes, real engine)."""
    from streamtts.demo.hf_checkpoint import write_demo_hf_checkpoint

    src = write_demo_hf_checkpoint(
        tmp_path / "hf", "tiny", seed=0, max_shard_bytes=20_000_000, rope_style="transformers5"
    )
    assert (src / "model.safetensors.index.json").is_file()
    out = tmp_path / "root" / GGUF_DIR
    convert_hf(src, out, ["F16"], gpu=False)
    _link_codec(out.parent, demo_model_dir)
    want = _greedy_codes(demo_model_dir / "config.yaml")
    got = _greedy_codes(out / "config.yaml")
    assert want.shape[0] >= 2
    np.testing.assert_array_equal(got, want)
    # the tables are the demo bundle's, bit for bit
    for rel in (
        "embeddings/embed_tokens.npy",
        "embeddings/emb_ext_07.npy",
        "lm_heads/lm_head_text.npy",
    ):
        assert (out / rel).read_bytes() == (demo_model_dir / GGUF_DIR / rel).read_bytes(), rel


def test_rope_theta_from_transformers_4_and_5_configs(tmp_path: Path) -> None:
    from streamtts.convert.hf_source import read_config

    def v4(c: dict[str, Any]) -> None:  # transformers 4.x: top level, rope_scaling null
        lang = c["language_config"]
        lang["rope_theta"] = lang.pop("rope_parameters")["rope_theta"]
        lang["rope_scaling"] = None

    for name, edit in (("t5", lambda c: None), ("t4", v4)):
        src = tmp_path / name
        src.mkdir()
        _edit_config(src, edit)
        assert read_config(src).shape.rope_theta == 1_000_000.0, name
    src = tmp_path / "yarn"
    src.mkdir()
    path = _edit_config(
        src, lambda c: c["language_config"]["rope_parameters"].update(rope_type="yarn", factor=4.0)
    )
    with pytest.raises(ModelFileError, match="plain RoPE") as exc:
        read_config(src)
    assert exc.value.path == str(path)


# -- reruns, interruptions, memory ---------------------------------------------------------------


def _files(d: Path) -> dict[str, int]:
    return {p.relative_to(d).as_posix(): p.stat().st_mtime_ns for p in d.rglob("*") if p.is_file()}


def test_rerun_skips_finished_outputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cmod, "_gpu_default", lambda: False)  # the CLI detects; gpu=False below
    out = tmp_path / "bundle"
    first = convert_hf(FIXTURE, out, ["F16"], gpu=False)
    assert "MOSS_TTS_F16.gguf" in first.written and not first.skipped
    before = _files(out)
    again = convert_hf(FIXTURE, out, ["F16"], gpu=False)
    assert again.written == [] and sorted(again.skipped) == sorted(first.written)
    assert _files(out) == before  # nothing rewritten
    assert not (out / STAGING_DIR).exists()
    # the command line, same inputs: nothing to do either
    assert cli.main(["convert-hf", str(FIXTURE), "--out", str(out), "--quant", "f16"]) == 0
    assert f"wrote 0 file(s) into {out}" in capsys.readouterr().out
    assert _files(out) == before


def test_interrupted_run_leaves_no_half_bundle_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "bundle"
    real = cmod._Writer.direct_gguf

    def interrupted(self: Any, dest: Path, outtype: str = "F16") -> None:
        with open(dest.with_name(f".{dest.name}.{os.getpid()}.tmp"), "wb") as f:
            f.write(b"GGUF half")
        raise KeyboardInterrupt

    monkeypatch.setattr(cmod._Writer, "direct_gguf", interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert_hf(FIXTURE, out, ["F16"], gpu=False)
    # only the hidden staging folder: no bundle file in DIR
    assert sorted(p.name for p in out.iterdir()) == [STAGING_DIR]
    staged = _files(out / STAGING_DIR)
    assert "embeddings/embed_tokens.npy" in staged  # finished before the interruption

    monkeypatch.setattr(cmod._Writer, "direct_gguf", real)
    res = convert_hf(FIXTURE, out, ["F16"], gpu=False)
    assert "embeddings/embed_tokens.npy" in res.skipped  # resumed, not redone
    assert "MOSS_TTS_F16.gguf" in res.written
    assert not (out / STAGING_DIR).exists()
    assert not list(out.rglob("*.tmp"))
    _check_gguf(out / "MOSS_TTS_F16.gguf", MANIFEST["gguf"]["backbone_f16.gguf"])


def test_table_memory_is_bounded_by_the_slab_not_the_tensor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 1 MB slabs, writing the tables (largest: 19 MB as f16) allocates a few MB."""
    monkeypatch.setattr(cmod, "_SLAB_BYTES", 1 << 20)
    peaks: list[int] = []
    real = cmod._Writer.tables

    def measured(self: Any, todo: set[str]) -> None:
        tracemalloc.start()
        try:
            real(self, todo)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()

    monkeypatch.setattr(cmod._Writer, "tables", measured)
    convert_hf(FIXTURE, tmp_path / "bundle", ["F16"], gpu=False)
    largest = 151936 * 64 * 2
    assert peaks and peaks[0] < 8 << 20 < largest


def test_hub_id_is_fetched_like_streamtts_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fnmatch

    monkeypatch.setenv("STREAMTTS_CACHE", str(tmp_path / "cache"))
    calls: list[dict[str, Any]] = []

    def fetcher(repo_id: str, local_dir: str, allow_patterns: list[str], revision: Any) -> None:
        calls.append({"repo": repo_id, "patterns": allow_patterns})
        for f in FIXTURE.iterdir():
            if any(fnmatch.fnmatch(f.name, p) for p in allow_patterns):
                Path(local_dir).mkdir(parents=True, exist_ok=True)
                shutil.copy(f, Path(local_dir) / f.name)

    res = convert_hf(
        "OpenMOSS-Team/MOSS-TTS", tmp_path / "bundle", ["F16"], gpu=False, fetcher=fetcher
    )
    assert [c["repo"] for c in calls] == ["OpenMOSS-Team/MOSS-TTS"] * 2
    # config and tokenizer first (checked), then the weights
    assert not any("safetensors" in p and "index" not in p for p in calls[0]["patterns"])
    assert "model-*.safetensors" in calls[1]["patterns"]
    assert res.source == tmp_path / "cache" / "hf" / "OpenMOSS-Team--MOSS-TTS"
    assert not (res.source / "official-outputs.json").exists()  # only what the conversion reads
    _check_gguf(tmp_path / "bundle" / "MOSS_TTS_F16.gguf", MANIFEST["gguf"]["backbone_f16.gguf"])


# -- bad input: a clear error naming the file, nothing written -----------------------------------


def _source(tmp_path: Path, *, copy_weights: bool = False) -> Path:
    """A copy of the fixture (weights linked unless they are to be damaged)."""
    src = tmp_path / "src"
    src.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        if f == "model.safetensors" and copy_weights:
            shutil.copy(FIXTURE / f, src / f)
        else:
            (src / f).symlink_to(FIXTURE / f)
    return src


def _edit_config(src: Path, edit: Any) -> Path:
    cfg = json.loads((FIXTURE / "config.json").read_text())
    edit(cfg)
    (src / "config.json").unlink(missing_ok=True)
    (src / "config.json").write_text(json.dumps(cfg))
    return src / "config.json"


def _fails(src: Path, out: Path, quants: list[str] | None = None) -> ModelFileError | ConfigError:
    with pytest.raises((ModelFileError, ConfigError)) as exc:
        convert_hf(src, out, quants or ["Q4_K_M"], gpu=False)
    assert not out.exists(), "nothing may be written for bad input"
    return exc.value


def test_missing_config_json(tmp_path: Path) -> None:
    src = _source(tmp_path)
    (src / "config.json").unlink()
    err = _fails(src, tmp_path / "out")
    assert isinstance(err, ModelFileError) and err.path == str(src / "config.json")
    assert "MOSS-TTS-Delay config.json" in str(err) and "file not found" in str(err)


def test_config_without_language_config(tmp_path: Path) -> None:
    src = _source(tmp_path)
    path = _edit_config(src, lambda c: c.pop("language_config"))
    err = _fails(src, tmp_path / "out")
    assert isinstance(err, ModelFileError) and err.path == str(path)
    assert "no language_config" in str(err)


def test_config_with_the_wrong_n_vq(tmp_path: Path) -> None:
    src = _source(tmp_path)
    path = _edit_config(src, lambda c: c.update(n_vq=16))
    err = _fails(src, tmp_path / "out")
    assert isinstance(err, ModelFileError) and err.path == str(path)
    assert "32 audio embedding tables" in str(err) and "n_vq is 16" in str(err)


def test_missing_shard(tmp_path: Path) -> None:
    from streamtts.demo.hf_checkpoint import write_demo_hf_checkpoint

    src = write_demo_hf_checkpoint(tmp_path / "src", "tiny", max_shard_bytes=20_000_000)
    shard = src / "model-00002-of-00004.safetensors"
    shard.unlink()
    err = _fails(src, tmp_path / "out")
    assert isinstance(err, ModelFileError) and err.path == str(shard)
    assert "named by model.safetensors.index.json" in str(err) and "missing" in str(err)


def test_truncated_safetensors(tmp_path: Path) -> None:
    src = _source(tmp_path, copy_weights=True)
    f = src / "model.safetensors"
    with f.open("r+b") as fh:
        fh.truncate(f.stat().st_size - 1000)
    err = _fails(src, tmp_path / "out")
    assert isinstance(err, ModelFileError) and err.path == str(f)
    assert "truncated" in str(err)


def test_tensor_of_the_wrong_shape(tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.numpy import save_file

    src = _source(tmp_path)
    (src / "model.safetensors").unlink()
    with safe_open(str(FIXTURE / "model.safetensors"), framework="numpy") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    tensors["emb_ext.3.weight"] = tensors["emb_ext.3.weight"][:1000]
    save_file(tensors, str(src / "model.safetensors"))
    err = _fails(src, tmp_path / "out")
    assert isinstance(err, ModelFileError) and err.path == str(src / "model.safetensors")
    assert "'emb_ext.3.weight' of shape (1025, 64)" in str(err) and "(1000, 64)" in str(err)


def test_output_disk_too_small(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cmod, "free_bytes", lambda path: 10_000_000)
    out = tmp_path / "out"
    err = _fails(FIXTURE, out)
    assert isinstance(err, ModelFileError) and err.path == str(out)
    assert "free disk space" in str(err) and "only 10.0 MB free" in str(err)


def test_unknown_quant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _fails(FIXTURE, tmp_path / "out", ["Q4_K_M", "Q9_X"])
    assert isinstance(err, ConfigError) and "unknown --quant 'Q9_X'" in str(err)
    assert "Q4_K_M" in str(err) and "Q8_0" in str(err)
    # the command line says the same and exits 2
    rc = cli.main(["convert-hf", str(FIXTURE), "--out", str(tmp_path / "out"), "--quant", "Q9_X"])
    assert rc == 2 and "unknown --quant 'Q9_X'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
