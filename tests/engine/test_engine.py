"""The engine end to end: real bridge + llama.cpp, real ONNX Runtime, demo model."""

from __future__ import annotations

import asyncio
import gc
import math
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import demo_dir_for

from streamtts import Engine
from streamtts.codec import load_decoder
from streamtts.config import SamplingParams, find_model_config, load_config
from streamtts.core.tokens import load_token_ids
from streamtts.engine.decoding import _END_RAMP, END_FADE_SAMPLES
from streamtts.engine.loop import PAUSED_POLL_S
from streamtts.errors import InputError, PromptTooLongError, ReferenceAudioError
from streamtts.model import official
from streamtts.model.tables import AudioHeads
from streamtts.request import StreamOptions

TEXT = "Hello there, this is a streaming test."
GREEDY = StreamOptions(sampling=SamplingParams.greedy(), seed=1)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def make_engine(demo_model_dir: Path, **kw: Any) -> Engine:
    kw.setdefault("n_threads", 1)
    kw.setdefault("max_streams", 2)
    return Engine.from_config(demo_model_dir / "config.yaml", **kw)


async def collect(engine: Engine, text: str = TEXT, **kw: Any) -> tuple[list[Any], Any]:
    s = engine.stream(text, **kw)
    chunks = []
    async with s:
        async for c in s:
            chunks.append(c)
    return chunks, s.stats


def official_greedy_frames(demo_model_dir: Path, text: str, max_new: int) -> np.ndarray:
    """The official llama.cpp pipeline's algorithm on the demo model (streamtts.model.official)."""
    return official.official_greedy_frames(load_config(demo_model_dir / "config.yaml"), text, max_new)


@pytest.mark.determinism
@pytest.mark.parametrize("n_vq", [32, 16])
def test_greedy_codes_match_official_algorithm(request: pytest.FixtureRequest, n_vq: int) -> None:
    # without the prefix cache the prompt is fed in one call, exactly as the official pipeline
    demo_model_dir = demo_dir_for(request, n_vq)

    async def main() -> tuple[np.ndarray, Any]:
        async with make_engine(demo_model_dir, prefix_cache_mib=0) as engine:
            syn = await engine.generate(TEXT, options=GREEDY)
            return syn.codes, syn.stats

    codes, stats = run(main())
    ref = official_greedy_frames(demo_model_dir, TEXT, 400)
    assert stats.finish_reason == "audio_end"
    assert codes.shape[0] >= 2 and codes.shape[1] == n_vq
    np.testing.assert_array_equal(codes, ref)


@pytest.mark.parametrize(
    ("n_vq", "chunks"), [(32, [1]), (32, [1, 2, 4, 8]), (32, [3]), (32, [8, 1]), (16, [1, 2, 4, 8])]
)
def test_streamed_equals_offline_decode(
    request: pytest.FixtureRequest, n_vq: int, chunks: list[int]
) -> None:
    demo_model_dir = demo_dir_for(request, n_vq)

    async def main() -> tuple[list[Any], Any]:
        async with make_engine(demo_model_dir, chunk_frames=chunks) as engine:
            # the chunk targets alone: the lateness rule (a listener about to run dry sends
            # early, tests/engine/test_chunk_policy.py) reads the wall clock, and a busy
            # machine's ticks would make it cut the [1, 2, 4, 8] ramp short
            assert engine._core is not None
            engine._core.policy.decode_margin_s = -math.inf
            return await collect(engine, options=StreamOptions(seed=7, fixed_frames=30))

    got, stats = run(main())
    codes = np.concatenate([c.codes for c in got])
    pcm = np.concatenate([c.pcm for c in got])
    assert codes.shape == (30, n_vq) and stats.frames == 30
    assert [c.frames.start for c in got] == sorted(c.frames.start for c in got)
    assert sum(len(c.frames) for c in got) == 30
    cfg = load_config(demo_model_dir / "config.yaml")
    offline = load_decoder(cfg).decode(codes[None])[0]
    assert pcm.shape == offline.shape == (30 * 1920,)
    n = END_FADE_SAMPLES  # the stream's end fades out to exactly 0 (no click)
    assert np.max(np.abs(pcm[:-n] - offline[:-n])) <= 1e-5
    assert pcm[-1] == 0.0 and np.all(np.abs(pcm[-n:]) <= np.abs(offline[-n:]) + 1e-5)
    assert np.max(np.abs(pcm[-n:] - offline[-n:] * _END_RAMP)) <= 1e-5
    if chunks == [1, 2, 4, 8]:
        assert [len(c.frames) for c in got][:4] == [1, 2, 4, 8]


@pytest.mark.parametrize("n_vq", [32, 16])
def test_first_chunk_right_after_step_n_vq_minus_1(request: pytest.FixtureRequest, n_vq: int) -> None:
    async def main() -> tuple[list[Any], Any]:
        async with make_engine(demo_dir_for(request, n_vq)) as engine:
            return await collect(engine, options=StreamOptions(seed=3, fixed_frames=6))

    chunks, stats = run(main())
    assert chunks[0].frames == range(0, 1)
    # frame f completes at step f + n_vq - 1 (0-based): 31 for 32 codebooks, 15 for 16
    assert chunks[0].step == n_vq - 1
    # every later frame needs exactly one more step
    for c in chunks:
        assert c.step == c.frames.stop - 1 + n_vq - 1
        assert c.codes.shape == (len(c.frames), n_vq)
    # the end ramp: after the 6 gen-slot steps, n_vq - 1 forced delay slots finish the frames
    assert stats.finish_reason == "audio_end" and stats.steps == 6 + n_vq - 1


@pytest.mark.determinism
def test_seeded_sampling_is_reproducible(demo_model_dir: Path) -> None:
    async def main() -> list[np.ndarray]:
        async with make_engine(demo_model_dir) as engine:
            a = await engine.generate(TEXT, options=StreamOptions(seed=11, max_new_tokens=80))
            b = await engine.generate(TEXT, options=StreamOptions(seed=11, max_new_tokens=80))
            c = await engine.generate(TEXT, options=StreamOptions(seed=12, max_new_tokens=80))
            return [a.codes, b.codes, c.codes]

    a, b, c = run(main())
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.determinism
def test_two_concurrent_streams_match_alone(demo_model_dir: Path) -> None:
    async def main() -> tuple[list[np.ndarray], list[np.ndarray]]:
        async with make_engine(demo_model_dir, max_streams=2) as engine:
            alone = [
                (await engine.generate(TEXT, options=StreamOptions(seed=s, fixed_frames=20))).codes
                for s in (1, 2)
            ]
            both = await asyncio.gather(
                *(engine.generate(TEXT, options=StreamOptions(seed=s, fixed_frames=20)) for s in (1, 2))
            )
            return alone, [b.codes for b in both]

    alone, both = run(main())
    for x, y in zip(alone, both, strict=True):
        assert x.shape == (20, 32)
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("n_vq", [32, 16])
def test_max_new_tokens_cut_keeps_complete_frames(request: pytest.FixtureRequest, n_vq: int) -> None:
    async def main() -> tuple[list[Any], Any]:
        async with make_engine(demo_dir_for(request, n_vq)) as engine:
            return await collect(engine, options=StreamOptions(seed=5, max_new_tokens=40, fixed_frames=100))

    chunks, stats = run(main())
    # N steps complete frames 0 .. N-n_vq, i.e. N - (n_vq - 1) frames
    assert sum(len(c.frames) for c in chunks) == 40 - (n_vq - 1)
    assert stats.finish_reason == "max_new_tokens"
    assert chunks[-1].is_last


def _slot_positions(engine: Engine) -> list[int]:
    bb = engine._backbone
    return [bb.seq_pos_max(i) for i in range(engine.config.max_streams)]


async def _wait_idle(engine: Engine, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if engine.active_streams == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("engine did not free its slots")


def test_cancel_frees_kv_cache(demo_model_dir: Path) -> None:
    async def main() -> None:
        async with make_engine(demo_model_dir) as engine:
            # leaving the async for
            async for _ in engine.stream(TEXT, options=StreamOptions(fixed_frames=200)):
                break
            await _wait_idle(engine)
            assert _slot_positions(engine) == [-1, -1]
            # aclose()
            s = engine.stream(TEXT, options=StreamOptions(fixed_frames=200))
            await s.__anext__()
            await s.aclose()
            await _wait_idle(engine)
            assert _slot_positions(engine) == [-1, -1]
            # cancelling the consuming task
            started = asyncio.Event()

            async def consume() -> None:
                async for _ in engine.stream(TEXT, options=StreamOptions(fixed_frames=200)):
                    started.set()

            task = asyncio.create_task(consume())
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await _wait_idle(engine)
            assert _slot_positions(engine) == [-1, -1]
            # and the engine still works
            chunks, stats = await collect(engine, options=StreamOptions(seed=1, fixed_frames=4))
            assert stats.frames == 4

    run(main())


def test_200_cancelled_streams_memory_flat(demo_model_dir: Path) -> None:
    async def main() -> list[int]:
        sizes = []
        async with make_engine(demo_model_dir, max_streams=2) as engine:
            tracemalloc.start()
            for i in range(200):
                async for _ in engine.stream(TEXT, options=StreamOptions(seed=i, fixed_frames=300)):
                    break
                if i % 50 == 49:
                    await _wait_idle(engine)
                    gc.collect()
                    sizes.append(tracemalloc.get_traced_memory()[0])
            tracemalloc.stop()
            await _wait_idle(engine)
            assert _slot_positions(engine) == [-1, -1]
            _, stats = await collect(engine, options=StreamOptions(seed=1, fixed_frames=3))
            assert stats.frames == 3
        return sizes

    sizes = run(main())
    # after warm-up, 150 more cancelled streams leave memory where it was
    assert sizes[-1] - sizes[0] < 256 * 1024, sizes


def test_slow_consumer_pauses_generation(demo_model_dir: Path) -> None:
    async def main() -> tuple[float, int, int]:
        async with make_engine(demo_model_dir, max_buffered_s=0.5, resume_buffered_s=0.25, chunk_frames=[1]) as engine:
            s = engine.stream(TEXT, options=StreamOptions(seed=2, fixed_frames=150))
            peak = 0.0
            n = 0
            async with s:
                async for c in s:
                    n += len(c.frames)
                    assert s._sink is not None
                    peak = max(peak, s._sink.buffered_s())
                    if n == 10:
                        await asyncio.sleep(1.0)  # stall: the engine must pause, not run ahead
                        steps_after_stall = s.stats.steps
                        core = engine._core
                        assert core is not None
                        ticks, t0 = core.ticks, time.monotonic()
                        await asyncio.sleep(0.5)
                        assert s.stats.steps == steps_after_stall  # paused
                        # and it waits between its looks, rather than spinning a core
                        looks = core.ticks - ticks
                        assert looks <= (time.monotonic() - t0) / PAUSED_POLL_S + 2, looks
            return peak, n, s.stats.steps

    peak, n, steps = run(main())
    assert n == 150
    assert peak <= 0.5 + 0.1  # high-water mark plus at most one chunk in flight


def test_bad_inputs_give_clear_errors_and_engine_survives(demo_model_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "broken.wav"
    bad.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunkjunk")

    async def main() -> None:
        async with make_engine(demo_model_dir, n_ctx=256) as engine:
            with pytest.raises(InputError, match="empty"):
                await engine.generate("   ")
            with pytest.raises(PromptTooLongError, match="n_ctx"):
                await engine.generate("word " * 400)
            with pytest.raises(ReferenceAudioError, match="broken.wav"):
                await engine.generate(TEXT, reference=str(bad))
            with pytest.raises(InputError, match="max_new_tokens"):
                await engine.generate(TEXT, options=StreamOptions(max_new_tokens=0))
            assert engine.active_streams == 0
            syn = await engine.generate(TEXT, options=StreamOptions(seed=1, fixed_frames=3))
            assert syn.codes.shape == (3, 32)

    run(main())


def test_decode_error_reaches_consumer_with_cause(demo_model_dir: Path) -> None:
    from streamtts.errors import CodecError

    async def main() -> None:
        async with make_engine(demo_model_dir) as engine:
            dec = engine._decoder.codec.decoder
            real = dec.decode
            calls = {"n": 0}

            def flaky(codes: np.ndarray) -> np.ndarray:
                calls["n"] += 1
                if calls["n"] == 2:
                    raise RuntimeError("injected codec failure")
                return real(codes)

            dec.decode = flaky
            with pytest.raises(CodecError) as info:
                await engine.generate(TEXT, options=StreamOptions(seed=1, fixed_frames=30))
            assert isinstance(info.value.__cause__, RuntimeError)
            await _wait_idle(engine)
            dec.decode = real
            syn = await engine.generate(TEXT, options=StreamOptions(seed=1, fixed_frames=5))
            assert syn.codes.shape[0] == 5

    run(main())


@pytest.mark.parametrize("n_vq", [32, 16])
def test_voice_cloning_reference_goes_into_prompt(
    request: pytest.FixtureRequest, n_vq: int, tmp_path: Path
) -> None:
    import soundfile as sf

    demo_model_dir = demo_dir_for(request, n_vq)
    t = np.arange(int(16000 * 1.3)) / 16000
    wav = 0.3 * np.sin(2 * np.pi * 220 * t)
    stereo = np.stack([wav, wav * 0.5], axis=1)
    path = tmp_path / "ref.flac"
    sf.write(path, stereo, 16000)

    async def main() -> tuple[Any, Any, Any]:
        async with make_engine(demo_model_dir) as engine:
            voice = await engine.encode_voice(str(path))
            with_ref = await engine.generate(TEXT, reference=voice, options=StreamOptions(seed=1, fixed_frames=5))
            without = await engine.generate(TEXT, options=StreamOptions(seed=1, fixed_frames=5))
            return voice, with_ref.stats, without.stats

    voice, with_ref, without = run(main())
    # 1.3 s at 24 kHz padded to whole 80 ms frames; the first n_vq of the codec's 32 levels
    assert voice.codes.shape == (17, n_vq)
    # the reference block adds T + n_vq - 1 slot rows plus the "[S1]:" header
    assert with_ref.prompt_rows - without.prompt_rows >= 17 + n_vq - 1


def test_sync_wrapper(demo_model_dir: Path) -> None:
    from streamtts.sync import SyncEngine

    with SyncEngine(demo_model_dir / "config.yaml", n_threads=1) as tts:
        chunks = list(tts.stream(TEXT, options=StreamOptions(seed=1, fixed_frames=4)))
        wav = tts.synthesize(TEXT, options=StreamOptions(seed=1, fixed_frames=4))
    assert sum(len(c.frames) for c in chunks) == 4
    np.testing.assert_array_equal(np.concatenate([c.pcm for c in chunks]), wav)


def test_long_text_is_spoken_in_segments_in_one_voice(demo_model_dir: Path) -> None:
    long = " ".join(
        f"This is sentence number {i}, and it carries on for a little while before it stops." for i in range(12)
    )

    async def main() -> tuple[Any, list[Any], Any]:
        async with make_engine(demo_model_dir, n_ctx=512) as engine:
            s = engine.stream(long, options=StreamOptions(seed=3, sampling=SamplingParams.greedy()))
            chunks = []
            async with s:
                async for c in s:
                    chunks.append(c)
            return s, chunks, engine.active_streams

    s, chunks, active = run(main())
    assert s.segments is not None and len(s.segments) >= 3
    frames = [f for c in chunks for f in c.frames]
    assert frames == list(range(len(frames)))  # continuous numbering across segments
    assert s.stats.frames == len(frames) and s.stats.prompt_rows > 512
    codes = np.concatenate([c.codes for c in chunks])
    assert codes.shape == (len(frames), 32)
    pcm = np.concatenate([c.pcm for c in chunks])
    assert pcm.shape[0] == len(frames) * 1920
    assert active == 0


@pytest.mark.determinism
def test_audio_heads_split_across_threads_give_the_same_bits(demo_model_dir: Path) -> None:
    from threadpoolctl import threadpool_limits

    cfg = load_config(demo_model_dir / "config.yaml")
    ids = load_token_ids(find_model_config(cfg))
    one = AudioHeads(cfg.lm_head_dir, ids, 64)
    three = AudioHeads(cfg.lm_head_dir, ids, 64, threads=3)
    assert len(three._cuts) == 4 and ids.n_vq * ids.audio_rows > 3 * 2048  # really split
    rng = np.random.default_rng(0)
    # by construction on every BLAS kernel set (chunked calls; OpenBLAS's Haswell kernels
    # changed 0.4-0.8 % of the logits of calls cut at 64-aligned columns): the engine runs
    # BLAS single-threaded, as here (more BLAS threads split each call OpenBLAS's own way)
    with threadpool_limits(1, user_api="blas"):
        for b in (1, 3, 5, 8, 16):
            h = rng.standard_normal((b, 64), dtype=np.float32)
            a = one(h, np.zeros((b, ids.n_vq * ids.audio_rows), np.float32)).copy()
            c = three(h, np.zeros((b + 2, ids.n_vq * ids.audio_rows), np.float32))
            assert c.shape == (b, ids.n_vq, ids.audio_rows)
            np.testing.assert_array_equal(a, c)
    threads = list(three._helpers)
    assert len(threads) == 2 and all(t.is_alive() for t in threads)
    three.close()
    for t in threads:
        t.join(timeout=5)
        assert not t.is_alive()
    np.testing.assert_array_equal(three(h, np.zeros((b, ids.n_vq * ids.audio_rows), np.float32)), a)


def test_engine_sets_its_threads_settings(demo_model_dir: Path) -> None:
    """tick_threads and gil_switch_ms (EngineConfig) take effect when the engine starts."""
    import sys

    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)

        async def main() -> tuple[float, int]:
            async with make_engine(demo_model_dir, tick_threads=3, gil_switch_ms=0.25) as engine:
                return sys.getswitchinterval(), engine.info["tick_threads"]

        switch, threads = run(main())
        assert switch == pytest.approx(0.00025) and threads == 3
    finally:
        sys.setswitchinterval(before)
