"""streamtts download: hub fetching (stand-in fetcher), local mirror copy, layout check, config."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamtts import Engine
from streamtts.config import load_config
from streamtts.convert.download import (
    CODEC_CKPT_DIR,
    CODEC_CKPT_REPO,
    CODEC_DIR,
    CODEC_REPO,
    GGUF_DIR,
    GGUF_REPO,
    DownloadError,
    check_layout,
    download,
)
from streamtts.errors import ModelFileError
from streamtts.request import StreamOptions


@pytest.fixture(scope="module")
def hub(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local folder laid out like the two hub repositories (the demo model), plus decoys."""
    root = tmp_path_factory.mktemp("hub")
    for sub in (GGUF_DIR, CODEC_DIR):
        shutil.copytree(demo_model_dir / sub, root / sub)
    # other quants of the backbone live in the same repository: never fetched
    (root / GGUF_DIR / "MOSS_TTS_Q8_0.gguf").write_bytes(b"GGUF" + b"\0" * 64)
    (root / GGUF_DIR / "README.md").write_text("model card\n")
    (root / CODEC_DIR / "notes.txt").write_text("not a pattern we fetch\n")
    # the codec's own checkpoint (what the exact streaming decoder is built from), sharded:
    # only the shard holding decoder tensors is fetched
    from streamtts.codec.build.random_ckpt import write_random_checkpoint
    from streamtts.demo.real_codec import demo_codec_config

    ck = root / CODEC_CKPT_DIR
    write_random_checkpoint(ck, demo_codec_config())
    (ck / "model.safetensors").rename(ck / "model-00001-of-00002.safetensors")
    (ck / "model-00002-of-00002.safetensors").write_bytes(b"encoder shard: never fetched")
    import json

    from safetensors import safe_open

    with safe_open(str(ck / "model-00001-of-00002.safetensors"), "numpy") as f:
        names = list(f.keys())
    wm = {n: "model-00001-of-00002.safetensors" for n in names}
    wm["encoder.0.weight"] = "model-00002-of-00002.safetensors"
    (ck / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    return root


def fake_fetcher(hub: Path, calls: list[dict[str, Any]]) -> Any:
    """snapshot_download stand-in: the hub's own pattern filter over the local repositories."""
    from huggingface_hub.utils import filter_repo_objects  # type: ignore[attr-defined]

    def fetch(
        repo_id: str, *, local_dir: str, allow_patterns: list[str], revision: str | None = None
    ) -> str:
        calls.append({"repo": repo_id, "patterns": allow_patterns, "revision": revision})
        src = hub / {GGUF_REPO: GGUF_DIR, CODEC_REPO: CODEC_DIR, CODEC_CKPT_REPO: CODEC_CKPT_DIR}[repo_id]
        files = [p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file()]
        for rel in filter_repo_objects(files, allow_patterns=allow_patterns):
            out = Path(local_dir) / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, out)
        return local_dir

    return fetch


def test_download_fetches_one_quant_checks_and_writes_config(hub: Path, tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    dest = tmp_path / "weights"
    cfg_path, rep = download(dest, "Q4_K_M", fetcher=fake_fetcher(hub, calls), gpu=False)
    assert rep.ok and rep.n_embd == 64
    assert [c["repo"] for c in calls] == [GGUF_REPO, CODEC_REPO, CODEC_CKPT_REPO, CODEC_CKPT_REPO]
    assert calls[3]["patterns"] == ["model-00001-of-00002.safetensors"]  # the decoder's shard only
    assert not (dest / CODEC_CKPT_DIR / "model-00002-of-00002.safetensors").exists()
    assert "MOSS_TTS_Q4_K_M.gguf" in calls[0]["patterns"]
    assert (dest / GGUF_DIR / "MOSS_TTS_Q4_K_M.gguf").is_file()
    assert not (dest / GGUF_DIR / "MOSS_TTS_Q8_0.gguf").exists()  # other quants stay on the hub
    assert not (dest / CODEC_DIR / "notes.txt").exists()
    assert (dest / CODEC_DIR / "decoder.onnx").is_file()

    cfg = load_config(cfg_path)
    assert cfg_path == dest / "streamtts.yaml"
    for key in (
        "backbone_gguf",
        "embedding_dir",
        "lm_head_dir",
        "tokenizer_dir",
        "audio_decoder_onnx",
    ):
        assert Path(getattr(cfg, key)).exists(), key
    assert cfg.n_gpu_layers == 0 and cfg.use_gpu_audio is False

    async def speak() -> int:
        async with Engine.from_config(cfg_path, n_threads=1, max_streams=1) as engine:
            syn = await engine.generate("Hello.", options=StreamOptions(seed=1, fixed_frames=3))
            return int(syn.codes.shape[0])

    assert asyncio.run(speak()) == 3


def test_from_dir_copies_and_reruns_cheaply(hub: Path, tmp_path: Path) -> None:
    dest = tmp_path / "w"
    cfg, rep = download(dest, from_dir=hub, gpu=True)
    assert rep.ok
    text = cfg.read_text()
    assert "n_gpu_layers: -1" in text and "use_gpu_audio: true" in text
    stamp = (dest / GGUF_DIR / "MOSS_TTS_Q4_K_M.gguf").stat().st_mtime_ns
    download(dest, from_dir=hub, gpu=True)  # present files are kept
    assert (dest / GGUF_DIR / "MOSS_TTS_Q4_K_M.gguf").stat().st_mtime_ns == stamp


def test_download_with_fuse_writes_fused_gguf(hub: Path, tmp_path: Path) -> None:
    cfg_path, _ = download(tmp_path / "w", from_dir=hub, gpu=False, fuse=True)
    cfg = load_config(cfg_path)
    assert cfg.fused_gguf.endswith("MOSS_TTS_Q4_K_M.fused.gguf") and Path(cfg.fused_gguf).is_file()


def test_layout_check_names_every_problem(hub: Path, tmp_path: Path) -> None:
    dest = tmp_path / "w"
    download(dest, from_dir=hub, gpu=False)
    gg = dest / GGUF_DIR
    (gg / "embeddings" / "emb_ext_05.npy").unlink()
    np.save(gg / "lm_heads" / "lm_head_audio_09.npy", np.zeros((1024, 64), np.float16))
    (gg / "lm_heads" / "lm_head_audio_10.npy").write_bytes(b"\x93NUMPY truncated")
    (gg / "tokenizer" / "tokenizer.json").unlink()
    (dest / CODEC_DIR / "decoder.onnx").unlink()
    rep = check_layout(dest)
    assert not rep.ok
    text = "\n".join(rep.problems)
    for needle in (
        "emb_ext_05.npy: missing",
        "lm_head_audio_09.npy: expected shape (1025, 64), got (1024, 64)",
        "lm_head_audio_10.npy: not a readable .npy",
        "tokenizer.json: missing",
        "decoder.onnx: missing",
    ):
        assert needle in text, text
    assert len(rep.problems) == 5
    (dest / "streamtts.yaml").unlink()
    with pytest.raises(ModelFileError, match="5 problem"):
        download(dest, gpu=False, fetcher=lambda *a, **k: None)
    assert not (dest / "streamtts.yaml").exists()  # no config for a broken layout


def test_wrong_quant_says_what_is_there(hub: Path, tmp_path: Path) -> None:
    dest = tmp_path / "w"
    download(dest, from_dir=hub, gpu=False)
    rep = check_layout(dest, "Q6_K")
    assert any(
        "MOSS_TTS_Q6_K.gguf: missing (found MOSS_TTS_Q4_K_M.gguf: pass --quant)" in p
        for p in rep.problems
    )


def test_onnx_external_data_checked(hub: Path, tmp_path: Path) -> None:
    import onnx

    dest = tmp_path / "w"
    download(dest, from_dir=hub, gpu=False)
    dec = dest / CODEC_DIR / "decoder.onnx"
    model = onnx.load(str(dec))
    onnx.save_model(
        model,
        str(dec),
        save_as_external_data=True,
        location="decoder.onnx.data",
        size_threshold=0,
        convert_attribute=True,
    )
    assert check_layout(dest).ok
    (dest / CODEC_DIR / "decoder.onnx.data").unlink()
    assert any(
        "decoder.onnx.data: missing (external weights of decoder.onnx)" in p
        for p in check_layout(dest).problems
    )


def test_fetch_errors_are_download_errors(tmp_path: Path) -> None:
    def offline(*a: Any, **k: Any) -> None:
        raise OSError("network unreachable")

    with pytest.raises(
        DownloadError, match=r"downloading OpenMOSS-Team/MOSS-TTS-GGUF failed \(network unreachable\).*--from-dir"
    ):
        download(tmp_path / "w", fetcher=offline)
    assert not (tmp_path / "w").exists()  # no empty folder left behind


def test_cli_download_from_dir(
    hub: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from streamtts.cli.main import main

    dest = tmp_path / "w"
    assert main(["download", "--from-dir", str(hub), "--dest", str(dest), "--cpu"]) == 0
    out = capsys.readouterr().out
    assert "weights checked (Q4_K_M, hidden size 64)" in out and str(dest / "streamtts.yaml") in out
    # the exact streaming decoder is built beside decoder.onnx, where the engine picks it up
    assert "codec: built" in out and (dest / CODEC_DIR / "decoder_streaming.onnx").is_file()
    assert main(["download", "--from-dir", str(hub), "--dest", str(dest), "--cpu"]) == 0
    assert "is up to date" in capsys.readouterr().out  # a rerun does not rebuild it

    async def codec_kind() -> str:
        async with Engine.from_config(dest / "streamtts.yaml", n_threads=1, max_streams=1) as e:
            return str(e.info["codec"])

    assert asyncio.run(codec_kind()) == "streaming"
    assert (
        main(["download", "--from-dir", str(tmp_path / "nowhere"), "--dest", str(tmp_path / "x")])
        == 2
    )
