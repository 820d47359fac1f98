"""The kernels' choice (config, :class:`Kernels`), the bridge's struct checks, and what only a
twin promises (its errors, the buffers it refuses); twin-vs-spec is ``test_conformance.py``."""

from __future__ import annotations

import asyncio
import ctypes
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import SMALL_IDS

from streamtts import Engine
from streamtts.config import KERNEL_NAMES, EngineConfig, SamplingParams, load_config
from streamtts.core.frames import FrameAssembler
from streamtts.core.sampling import sample_rows
from streamtts.core.tokens import TokenIds
from streamtts.errors import ConfigError, NativeLibraryError, NonFiniteLogitsError
from streamtts.kernels import Kernels, SpecDelayStep, SpecFramePush, SpecStepEmbed, select_twins
from streamtts.kernels.tick_pool import CHUNK_ROWS, CHUNKS_PER_THREAD, MIN_ROWS, TickPool
from streamtts.model import _llama
from streamtts.model.tables import Embedder
from streamtts.request import StreamOptions

REAL = TokenIds()
ALL = {"row_sampler", "delay_step", "frame_push", "step_embed"}
STATE = ("audio_length", "delayed_length", "is_audio", "is_stopping", "audio_ended", "time_step", "seen")


# -- the choice --------------------------------------------------------------------------------


def test_sampler_sets_all_and_kernels_override_each_in_order() -> None:
    assert select_twins("native") == ALL
    assert select_twins("numpy") == set()
    assert select_twins("native", ["-delay_step"]) == ALL - {"delay_step"}
    assert select_twins("numpy", ["+row_sampler", "+frame_push", "-row_sampler"]) == {"frame_push"}
    assert Kernels().describe() == dict.fromkeys(("row_sampler", "delay_step", "frame_push", "step_embed"), "numpy")
    assert Kernels().row_sampler is sample_rows


@pytest.mark.parametrize("bad", ["delay_step", "+delay", "*row_sampler", "-"])
def test_a_bad_kernels_entry_is_a_config_error(bad: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"kernels: {bad!r} is not '+name' or '-name'")):
        EngineConfig(kernels=[bad]).validate()
    with pytest.raises(ConfigError, match="row_sampler, delay_step, frame_push, step_embed"):
        select_twins("native", [bad])
    with pytest.raises(ValueError, match="no kernel named delay"):
        Kernels({"delay"})


def test_unknown_sampler_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="sampler must be 'native' or 'numpy'"):
        EngineConfig(sampler="fast").validate()


def test_no_twin_is_discovered_by_getattr() -> None:
    """Each twin is chosen in Kernels, by name: nothing probes an object for a hook."""
    pkg = Path(__file__).resolve().parents[2] / "streamtts"
    hook = re.compile(r"getattr\([^)]*[\"'](bind_\w*|accepts_strided)[\"']")
    found = [f"{p.relative_to(pkg)}: {m.group(0)}" for p in pkg.rglob("*.py") for m in hook.finditer(p.read_text())]
    assert not found, found


def test_the_c_files_share_one_header() -> None:
    """STT_API and every mirrored struct are defined once, in native/stt.h."""
    native = Path(__file__).resolve().parents[2] / "native"
    for c in sorted(native.glob("*.c")):
        text = c.read_text()
        assert '#include "stt.h"' in text, c.name
        assert "#define STT_API" not in text, c.name
        assert not re.search(r"\}\s*stt_(params|delay_states|frames|embed);", text), c.name
    header = (native / "stt.h").read_text()
    for name in _llama.MIRRORED:
        assert re.search(rf"\}}\s*stt_{name};", header), name
        assert f"stt_sizeof_{name}(void)" in header, name


def test_every_mirrored_struct_is_size_checked(bridge_lib: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, mirror in _llama.MIRRORED.items():
        assert getattr(bridge_lib, f"stt_sizeof_{name}")() == ctypes.sizeof(mirror), name

    class Shorter(ctypes.Structure):
        _fields_ = [("capacity", ctypes.c_int32)]

    monkeypatch.setitem(_llama.MIRRORED, "frames", Shorter)
    with pytest.raises(NativeLibraryError, match=r"stt_frames is 32 bytes in the library but 4 in streamtts/model/_llama.py \(Shorter\)"):
        _llama.check_layouts(bridge_lib, Path("libstreamtts_bridge.so"))


# -- the delay step's twin ----------------------------------------------------------------------


def _states(kernels: Kernels, ids: TokenIds, cap: int) -> Any:
    states = kernels.delay_states(cap, ids)
    prompt = np.full((3, 1 + ids.n_vq), ids.audio_pad_code, np.int64)
    prompt[:, 0] = [100, 100, ids.audio_start]
    for s in range(cap):
        states.reset(s, prompt, SamplingParams(), seed=s)
    return states


def test_delay_twin_errors_leave_the_states_unchanged(bridge_lib: Any) -> None:
    ids, cap = REAL, 4
    kernels = Kernels({"delay_step"}, bridge_lib)
    states = _states(kernels, ids, cap)
    slots, pair = np.zeros(cap, np.int64), np.zeros((cap, 2), np.float32)
    audio, out = np.zeros((cap, ids.n_vq, ids.audio_rows), np.float32), np.zeros((cap, 1 + ids.n_vq), np.int64)
    step = kernels.bind_delay_step(SpecDelayStep(states, slots, pair, audio, out, lambda i: np.zeros(1, np.float32)))
    assert step.compiled
    before = {n: getattr(states, n).copy() for n in STATE}
    for bad in ([0, 0], [-1, 0], [0, 4]):
        slots[:2] = bad
        with pytest.raises(ValueError, match=re.escape(f"slots must be distinct and in [0, 4), got {bad}")):
            step(0, 2)
    slots[:2] = [2, 3]
    audio[1, 0, 5] = np.nan
    with pytest.raises(NonFiniteLogitsError, match=r"audio of slots \[3\]"):
        step(0, 2)
    audio[1, 0, 5] = 0.0
    pair[0, 0] = np.nan
    with pytest.raises(NonFiniteLogitsError, match=r"text of slots \[2\]"):
        step(0, 2)
    for n, v in before.items():
        np.testing.assert_array_equal(getattr(states, n), v, err_msg=n)
    assert step.handed_back == 0  # type: ignore[attr-defined]  # every one of those raised from the twin
    with pytest.raises(ValueError, match=re.escape("rows [3, 5) do not fit the 4 rows bound")):
        step(3, 5)


def test_buffers_a_twin_cannot_read_leave_the_kernel_to_its_spec(bridge_lib: Any, tmp_path: Path) -> None:
    ids, cap = SMALL_IDS, 4
    k, a = ids.n_vq, ids.audio_rows
    ok = (np.zeros(cap, np.int64), np.zeros((cap, 2), np.float32), np.zeros((cap, k, a), np.float32), np.zeros((cap, 1 + k), np.int64))
    kernels = Kernels(ALL, bridge_lib)
    states = kernels.delay_states(cap, ids)
    full = lambda i: np.zeros(1, np.float32)  # noqa: E731
    assert kernels.bind_delay_step(SpecDelayStep(states, *ok, full)).compiled
    for i, bad in enumerate((np.zeros(cap, np.int32), np.zeros((3, 2), np.float32), np.zeros((cap, k, a), np.float64), np.zeros((cap, 1 + k), np.int32))):
        args = list(ok)
        args[i] = bad
        fresh = Kernels({"delay_step"}, bridge_lib)
        assert not fresh.bind_delay_step(SpecDelayStep(states, *args, full)).compiled, i
        assert fresh.describe()["delay_step"] == "numpy" and "delay_step" in fresh.fallbacks
    asm = FrameAssembler(cap, k, ids.audio_pad_code)
    assert kernels.bind_frame_push(SpecFramePush(asm, ok[0], ok[3][:, 1:])).compiled
    assert not Kernels({"frame_push"}, bridge_lib).bind_frame_push(SpecFramePush(asm, ok[0], ok[3][:, 1::2])).compiled
    assert not Kernels({"frame_push"}, bridge_lib).bind_frame_push(SpecFramePush(asm, ok[0].astype(np.int32), ok[3][:, 1:])).compiled
    emb = _embedder(tmp_path, ids, 8, 10)
    rows, out = np.zeros((cap, 1 + k), np.int64), np.zeros((cap, 8), np.float32)
    assert kernels.bind_step_embed(SpecStepEmbed(emb, ok[0], rows, out)).compiled
    for bad_args in ((ok[0].astype(np.int32), rows, out), (ok[0], rows[:, :-1], out), (ok[0], rows, out[:, ::2])):
        assert not Kernels({"step_embed"}, bridge_lib).bind_step_embed(SpecStepEmbed(emb, *bad_args)).compiled
    emb.text = np.asfortranarray(emb.text)
    assert not Kernels({"step_embed"}, bridge_lib).bind_step_embed(SpecStepEmbed(emb, ok[0], rows, out)).compiled


# -- the frame push's and the embedding's twins -------------------------------------------------


def test_frame_twin_bad_slots_change_nothing(bridge_lib: Any) -> None:
    k, cap = 32, 3
    asm = FrameAssembler(cap, k, 1024)
    slots, rows = np.zeros(cap, np.int64), np.zeros((cap, k), np.int64)
    push = Kernels({"frame_push"}, bridge_lib).bind_frame_push(SpecFramePush(asm, slots, rows))
    assert push.compiled
    slots[:2] = [0, 3]
    before = (asm.ring.copy(), asm.count.copy())
    with pytest.raises(ValueError, match=re.escape("slots must be in [0, 3), got [0, 3]")):
        push(0, 2)
    np.testing.assert_array_equal(asm.ring, before[0])
    np.testing.assert_array_equal(asm.count, before[1])
    with pytest.raises(ValueError, match=re.escape("rows [0, 4) do not fit the 3 rows bound")):
        push(0, 4)


def _embedder(d: Path, ids: TokenIds, h: int, text_rows: int) -> Embedder:
    rng = np.random.default_rng(2)
    np.save(d / "embed_tokens.npy", rng.standard_normal((text_rows, h)).astype(np.float16))
    for c in range(ids.n_vq):
        np.save(d / f"emb_ext_{c:02d}.npy", rng.standard_normal((ids.audio_rows, h)).astype(np.float16))
    return Embedder(d, ids)


def test_embed_twin_bad_slots_and_ids_write_nothing(bridge_lib: Any, tmp_path: Path) -> None:
    ids = SMALL_IDS
    emb = _embedder(tmp_path, ids, 8, 10)
    rows, slots, out = np.zeros((3, 1 + ids.n_vq), np.int64), np.zeros(3, np.int64), np.full((3, 8), 7.0, np.float32)
    embed = Kernels({"step_embed"}, bridge_lib).bind_step_embed(SpecStepEmbed(emb, slots, rows, out))
    assert embed.compiled
    slots[:2] = [0, 3]
    with pytest.raises(ValueError, match=re.escape("slots must be in [0, 3), got [0, 3]")):
        embed(0, 2)
    slots[:2] = [0, 1]
    rows[1, 0] = 10  # text ids run to 9
    with pytest.raises(ValueError, match="an id out of range in rows"):
        embed(0, 2)
    rows[1, 0] = 0
    rows[0, 2] = ids.audio_rows
    with pytest.raises(ValueError, match="an id out of range in rows"):
        embed(0, 2)
    assert (out == 7.0).all()  # nothing written
    with pytest.raises(ValueError, match=re.escape("rows [0, 4) do not fit the 3 rows bound")):
        embed(0, 4)


# -- the tick's threads (native/pool.c) -----------------------------------------------------------


def test_tick_pool_threads_and_close(bridge_lib: Any) -> None:
    pool = TickPool(bridge_lib, 3)
    assert bridge_lib.stt_pool_threads(pool.handle) == 3
    assert pool.chunk_rows(MIN_ROWS - 1) == 0  # too few rows to cut
    for b in (MIN_ROWS, 128, 1000):  # at least CHUNK_ROWS a chunk, at most CHUNKS_PER_THREAD a thread
        rows = pool.chunk_rows(b)
        assert rows >= CHUNK_ROWS and -(-b // rows) <= 3 * CHUNKS_PER_THREAD
    pool.close()
    pool.close()  # idempotent
    assert pool.handle is None
    with pytest.raises(NativeLibraryError, match="could not start 99 tick threads"):
        TickPool(bridge_lib, 100)


def test_pooled_row_gather_is_a_take(bridge_lib: Any) -> None:
    pool = TickPool(bridge_lib, 2)
    src = np.arange(64 * 7, dtype=np.float32).reshape(64, 7)
    idx = np.random.default_rng(0).integers(0, 64, 100).astype(np.int64)
    dst = np.zeros((120, 9), np.float32)  # wider rows: strides differ
    assert bridge_lib.stt_pool_gather_rows(pool.handle, 100, src.ctypes.data, 7, idx.ctypes.data, dst.ctypes.data, 9, 7) == 0
    np.testing.assert_array_equal(dst[:100, :7], src[idx])
    assert not dst[:, 7:].any() and not dst[100:].any()
    idx[50] = -1
    assert bridge_lib.stt_pool_gather_rows(pool.handle, 100, src.ctypes.data, 7, idx.ctypes.data, dst.ctypes.data, 9, 7) == -1
    pool.close()


def test_pooled_delay_step_names_the_bad_rows_of_any_chunk(bridge_lib: Any) -> None:
    ids, cap = REAL, 96
    kernels = Kernels({"delay_step"}, bridge_lib, threads=2)
    states = _states(kernels, ids, cap)
    slots, pair = np.arange(cap, dtype=np.int64), np.zeros((cap, 2), np.float32)
    audio, out = np.zeros((cap, ids.n_vq, ids.audio_rows), np.float32), np.zeros((cap, 1 + ids.n_vq), np.int64)
    step = kernels.bind_delay_step(SpecDelayStep(states, slots, pair, audio, out, lambda i: np.zeros(1, np.float32)))
    assert kernels.pool is not None
    audio[90, 0, 7] = np.nan  # in the last chunk
    with pytest.raises(NonFiniteLogitsError, match=r"audio of slots \[90\]"):
        step(0, cap)
    assert kernels.pool.parallel_runs == 1
    audio[90, 0, 7] = 0.0
    slots[70] = 71  # repeated inside one chunk
    with pytest.raises(ValueError, match="slots must be distinct"):
        step(0, cap)
    kernels.close()


def test_pooled_step_embed_names_a_bad_id(bridge_lib: Any, tmp_path: Path) -> None:
    ids = SMALL_IDS
    emb = _embedder(tmp_path, ids, 8, 10)
    n = 64
    rows, slots, out = np.zeros((n, 1 + ids.n_vq), np.int64), np.arange(n, dtype=np.int64), np.zeros((n, 8), np.float32)
    kernels = Kernels({"step_embed"}, bridge_lib, threads=2)
    embed = kernels.bind_step_embed(SpecStepEmbed(emb, slots, rows, out))
    rows[50, 1] = ids.audio_rows
    with pytest.raises(ValueError, match="an id out of range in rows"):
        embed(0, n)
    rows[50, 1] = 0
    embed(0, n)
    assert kernels.pool is not None and kernels.pool.parallel_runs == 2
    kernels.close()


# -- the row sampler's twin ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def native(bridge_lib: Any) -> Any:
    return Kernels({"row_sampler"}, bridge_lib).row_sampler


def test_sampler_twin_only_reads_and_names_bad_rows(native: Any) -> None:
    rng = np.random.default_rng(6)
    n, v = 8, 1025
    lg = rng.standard_normal((n, v)).astype(np.float32)
    lg[1, 700] = np.nan
    lg[3, 5] = np.inf
    lg[5] = -np.inf
    lg[6] = 1e38  # finite, but the temperature below overflows it
    temp = np.full(n, 1.7, np.float32)
    temp[6] = 1e-3
    args = (temp, np.full(n, 25, np.int64), np.full(n, 0.8), rng.random(n))
    before = lg.copy()
    with pytest.raises(NonFiniteLogitsError) as ei:
        native(lg, *args)
    assert ei.value.rows == (1, 3, 5, 6)
    with pytest.raises(NonFiniteLogitsError) as eg:
        native(lg, np.zeros(n, np.float32), *args[1:])
    assert eg.value.rows == (1, 5)  # +inf is a fine argmax
    np.testing.assert_array_equal(lg, before)  # only read (the spec scales in place)


def test_sampler_twin_bad_arguments_are_named(native: Any) -> None:
    lg = np.zeros((4, 10), np.float32)
    ok = (np.ones(4, np.float32), np.zeros(4, np.int64), np.ones(4), np.zeros(4))
    with pytest.raises(TypeError, match="float32"):
        native(lg.astype(np.float64), *ok)
    with pytest.raises(ValueError, match="contiguous"):
        native(lg[:, ::2], *ok)
    with pytest.raises(ValueError, match="temperature"):
        native(lg, np.ones(3, np.float32), *ok[1:])
    with pytest.raises(IndexError, match=r"rows must be in \[0, 4\)"):
        native(lg, *ok, rows=np.array([0, 1, 2, 4]))
    with pytest.raises(ValueError, match="penalty needs seen"):
        native(lg, *ok, penalty=np.ones(4, np.float32))
    assert native(lg[:0], *(a[:0] for a in ok)).shape == (0,)


# -- the engine ---------------------------------------------------------------------------------


def test_engine_streams_the_same_codes_whichever_kernels_run(demo_model_dir: Path) -> None:
    async def codes(**kw: Any) -> tuple[list[np.ndarray], dict[str, str]]:
        async with Engine.from_config(demo_model_dir / "config.yaml", n_threads=1, max_streams=2, **kw) as e:
            out = [(await e.generate("Hello there, how are you?", options=StreamOptions(seed=s, fixed_frames=40))).codes for s in (1, 2)]
            return out, dict(e.info["kernels"])

    spec, spec_info = asyncio.run(codes(sampler="numpy"))
    twins, twin_info = asyncio.run(codes(sampler="native"))
    mixed, mixed_info = asyncio.run(codes(sampler="numpy", kernels=["+delay_step", "+step_embed"]))
    assert set(spec_info.values()) == {"numpy"} and set(twin_info.values()) == {"native"}
    assert mixed_info == {"row_sampler": "numpy", "delay_step": "native", "frame_push": "numpy", "step_embed": "native"}
    for x, y, z in zip(spec, twins, mixed, strict=True):
        assert x.shape[0] >= 40
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(x, z)
    assert not np.array_equal(spec[0], spec[1])  # seeds differ: sampled


def test_kernels_is_one_switch_and_sampler_its_alias(tmp_path: Path) -> None:
    assert EngineConfig(kernels="numpy").validate().twins() == frozenset()
    assert EngineConfig(sampler="numpy").validate().twins() == frozenset()
    assert EngineConfig(kernels="native").twins() == frozenset(KERNEL_NAMES)
    assert EngineConfig(sampler="numpy", kernels=["+row_sampler"]).twins() == {"row_sampler"}
    with pytest.raises(ConfigError, match="sampler is another name for kernels"):
        EngineConfig(sampler="numpy", kernels="native").validate()
    with pytest.raises(ConfigError, match="kernels must be 'native', 'numpy' or a list"):
        EngineConfig(kernels="fast").validate()
    (tmp_path / "c.yaml").write_text("kernels: numpy\n")
    cfg = load_config(tmp_path / "c.yaml")
    assert cfg.kernels == "numpy" and cfg.twins() == frozenset()
