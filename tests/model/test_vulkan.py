"""The GPU path on llama.cpp's Vulkan backend (``pytest -m vulkan``), on any Vulkan device:
Mesa's lavapipe (a CPU-type device) in CI, an AMD/Intel/NVIDIA GPU elsewhere.

The Vulkan side runs in one child process (tests/model/vulkan_run.py: one bridge build per process,
and llama.cpp compiles its Vulkan pipelines once per process); this process, on the CPU build,
compares. Skipped, with the reason, only where the Vulkan loader lists no device; a device
without the Vulkan build (``STREAMTTS_VULKAN=1 bash native/build.sh``) is a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from vulkan_run import (  # the Vulkan side's inputs
    BATCH_FRAMES,
    BATCH_TEXTS,
    GREEDY,
    STAND_INS,
    TEXT,
)

from streamtts import Engine
from streamtts.codec import load_decoder
from streamtts.config import SamplingParams, load_config
from streamtts.core.tokens import TokenIds
from streamtts.engine.decoding import _END_RAMP, END_FADE_SAMPLES
from streamtts.model import _llama
from streamtts.model.tables import AudioHeads
from streamtts.model.vulkan_probe import vulkan_devices
from streamtts.request import StreamOptions

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# leading greedy frames the Vulkan build must give exactly as the CPU build does (lavapipe
# rounds its f16 work differently, so longer runs may part at a near tie; the figures found
# are in the test's message and docstring)
MIN_AGREE_FRAMES = 3
# the fused f16 heads (llama.cpp on the device) against NumPy's f32 heads on the same hidden
# state, as a fraction of the largest |logit|: the f16 rows carry 2^-11 relative rounding
# each; seen on lavapipe 7.6e-6 (6.2e-5 of 8.2)
HEADS_RTOL = 1e-3

_DEVICES, _WHY = vulkan_devices()
pytestmark = [
    pytest.mark.vulkan,
    pytest.mark.skipif(not _DEVICES, reason=f"no Vulkan device: {_WHY}"),
]


def _child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("STREAMTTS_BRIDGE_LIB", "STREAMTTS_CUDA")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def vk_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Its own demo model (the Vulkan engine writes its f16 fused file next to the backbone)."""
    from streamtts.demo.model import write_demo_model

    root = tmp_path_factory.mktemp("vk-model")
    write_demo_model(root, "tiny", seed=0)
    return root


@pytest.fixture(scope="module")
def vk(vk_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Any]:
    lib = _llama._variant_lib("vulkan")
    if not lib.is_file():
        pytest.fail(
            f"a Vulkan device is here ({_DEVICES[0].name}) but the Vulkan build is not ({lib}): "
            "run `STREAMTTS_VULKAN=1 bash native/build.sh` (scripts/setup.sh --test does)",
            pytrace=False,
        )
    out = tmp_path_factory.mktemp("vk-out")
    proc = subprocess.run(
        [sys.executable, str(HERE / "vulkan_run.py"), str(vk_model), str(out)],
        env=_child_env(STREAMTTS_BACKEND="vulkan"), capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads((out / "results.json").read_text())
    res["stderr"] = proc.stderr
    return res, np.load(out / "arrays.npz")


def test_layers_are_on_the_vulkan_device_as_llama_cpp_reports(vk: tuple[dict[str, Any], Any]) -> None:
    res, _ = vk
    info = res["info"]
    assert res["loaded_backend"] == "vulkan"
    names = {d.name for d in _DEVICES}
    for place in (info, res["plain_placement"]):
        assert place["backend"] == "vulkan"
        assert place["device"].startswith("Vulkan") and place["device_description"] in names
        assert place["layers_offloaded"] == place["layers_total"] == 3  # 2 layers + the output layer
        assert place["device_memory_mib"] > 0
    # what the engine does on a GPU: the f16 heads in the graph, written on first load; no turns
    assert info["heads"] == "fused (llama.cpp)" and info["backbone"].endswith(".fused-f16.gguf")
    assert info["codec_turns"] is False
    if all(d.kind == "cpu" for d in _DEVICES):  # selected by the engine, with its warning
        assert "a CPU-type device: using it" in res["stderr"]


def _agree(a: np.ndarray, b: np.ndarray) -> int:
    """Leading frames on which two code arrays agree."""
    n = min(len(a), len(b))
    same = np.all(a[:n] == b[:n], axis=1)
    return n if same.all() else int(np.argmin(same))


def test_greedy_codes_agree_with_the_cpu_build_at_the_start(vk: tuple[dict[str, Any], Any], vk_model: Path) -> None:
    """The Vulkan engine (f16 heads in the graph) against the CPU build's (f32 NumPy heads) on
    TEXT and the batching test's five streams, each alone, greedy. Seen here (lavapipe, LLVM
    15, 256 bits): TEXT agrees for its first 4 of 35 frames, then a near tie goes the other
    way; the five fixed-length streams for 72/72, 8/8, 72/72, 7/72 and 12/12."""
    if _llama.loaded_backend() != "cpu":
        pytest.skip("this process must run the CPU build (unset STREAMTTS_BACKEND)")
    _, arr = vk
    greedy = SamplingParams.greedy()

    async def main() -> list[np.ndarray]:
        async with Engine.from_config(vk_model / "config.yaml", n_threads=1, max_streams=2, prefix_cache_mib=0) as e:
            out = [(await e.generate(TEXT, options=GREEDY)).codes]
            for i, (t, f) in enumerate(zip(BATCH_TEXTS, BATCH_FRAMES, strict=True)):
                o = StreamOptions(seed=20 + i, fixed_frames=f, sampling=greedy)
                out.append((await e.generate(t, options=o)).codes)
            return out

    cpu = asyncio.run(main())
    gpu = [arr["greedy"], *(arr[f"alone{i}"] for i in range(len(BATCH_TEXTS)))]
    _assert_leading_agreement(cpu, gpu, "Vulkan and CPU greedy codes")


def _assert_leading_agreement(refs: list[Any], others: list[Any], what: str) -> None:
    """Each pair of code arrays agrees for its first MIN_AGREE_FRAMES frames (or all of a shorter one)."""
    agree = [_agree(r, o) for r, o in zip(refs, others, strict=True)]
    msg = f"{what} agree for the first " + ", ".join(f"{n} of {len(r)}" for n, r in zip(agree, refs, strict=True)) + " frames"
    print(msg)
    assert all(n >= min(MIN_AGREE_FRAMES, len(r)) for n, r in zip(agree, refs, strict=True)), msg


def test_four_batched_streams_with_gaps_give_what_each_gives_alone(vk: tuple[dict[str, Any], Any]) -> None:
    """Batched rows take other kernels than one row (lavapipe rounds them differently), so a
    stream may part from itself alone at a near tie, but no earlier than the CPU comparison's
    bar. Seen here: 72/72, 8/8, 14/72, 72/72 and 12/12 leading frames; the streams of slot 1
    (the one stepped as a stand-in, whose leftover cells would corrupt the late stream from
    its first frame) agree throughout."""
    res, arr = vk
    assert res["max_rows"] == 4  # the four streams' rows came out of one decode
    assert res["stand_ins"] >= STAND_INS  # slot 1 stepped as a stand-in between slots 0 and 2
    alone = [arr[f"alone{i}"] for i in range(len(BATCH_TEXTS))]
    together = [arr[f"together{i}"] for i in range(len(BATCH_TEXTS))]
    assert [len(t) for t in together] == BATCH_FRAMES
    _assert_leading_agreement(alone, together, "batched and alone")


def test_prefix_cache_restore_of_the_device_kv_gives_the_uncached_codes(vk: tuple[dict[str, Any], Any]) -> None:
    res, arr = vk
    assert res["prefix_cache"]["hits"] >= 2  # both requests restored a snapshot
    np.testing.assert_array_equal(arr["cached_first"], arr["greedy"])
    np.testing.assert_array_equal(arr["cached_second"], arr["greedy"])


def test_cancel_frees_the_slot(vk: tuple[dict[str, Any], Any]) -> None:
    res, arr = vk
    assert res["slots_after_cancel"] == [-1, -1, -1, -1]
    np.testing.assert_array_equal(arr["greedy_after_cancel"], arr["greedy"])


def test_streamed_audio_equals_the_offline_decode(vk: tuple[dict[str, Any], Any], vk_model: Path) -> None:
    _, arr = vk
    codes, pcm = arr["stream_codes"], arr["stream_pcm"]
    offline = load_decoder(load_config(vk_model / "config.yaml")).decode(codes[None])[0]
    assert codes.shape[0] == 30 and pcm.shape == offline.shape == (30 * 1920,)
    n = END_FADE_SAMPLES
    assert np.max(np.abs(pcm[:-n] - offline[:-n])) <= 1e-5
    assert np.max(np.abs(pcm[-n:] - offline[-n:] * _END_RAMP)) <= 1e-5


def test_fused_f16_heads_on_the_device_match_numpy_heads(vk: tuple[dict[str, Any], Any], vk_model: Path) -> None:
    _, arr = vk
    ids = TokenIds()
    h, lg = arr["heads_hidden"], arr["heads_logits"]
    heads = AudioHeads(vk_model / "MOSS-TTS-GGUF" / "lm_heads", ids, h.shape[1])
    try:
        audio = heads(h, np.zeros((1, ids.n_vq * (ids.audio_vocab_size + 1)), np.float32)).reshape(-1)
    finally:
        heads.close()
    err = float(np.max(np.abs(lg[0, 2:] - audio)))
    scale = float(np.abs(audio).max())
    print(f"fused f16 heads vs NumPy: max |diff| {err:.3g} = {err / scale:.3g} of max |logit| {scale:.3g}")
    assert err <= HEADS_RTOL * scale


