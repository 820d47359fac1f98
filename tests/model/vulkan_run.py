"""What the Vulkan tests check, computed in one process on the Vulkan build of the bridge.

A process loads one build of the bridge, and llama.cpp's Vulkan backend compiles its pipelines
once per process (about 30 s on lavapipe), so tests/model/test_vulkan.py runs this once per session:

    STREAMTTS_BACKEND=vulkan python tests/model/vulkan_run.py MODEL_DIR OUT_DIR

and compares what it writes (OUT_DIR/results.json, OUT_DIR/arrays.npz) with the CPU build in
the test process. Everything runs on the demo model with ``n_gpu_layers: -1``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from streamtts import Engine
from streamtts.config import SamplingParams
from streamtts.core.tokens import TokenIds
from streamtts.model import _llama
from streamtts.model.backbone import Backbone, BackboneParams
from streamtts.model.fused import read_fused_info
from streamtts.model.tables import Embedder
from streamtts.request import StreamOptions

TEXT = "Hello there, this is a streaming test."
GREEDY = StreamOptions(sampling=SamplingParams.greedy(), seed=1)
# four streams submitted together (slots 0-3, one decode of 4 rows); slot 1's ends first and
# leaves a gap between slots 0 and 2 (stand-in rows); a fifth then joins slot 1, its prompt
# prefilled in pieces between steps
BATCH_TEXTS = [
    "Hello there, this is stream one.",
    "Short.",
    "Numbers: one, two, three, four.",
    "A second voice joins the conversation.",
    "A late stream with a longer prompt, prefilled in small pieces.",
]
BATCH_FRAMES = [72, 8, 72, 72, 12]
STAND_INS = 5  # steps slot 1 is held empty between stepped slots before the late stream


def engine(model_dir: Path, **kw: Any) -> Engine:
    kw.setdefault("n_threads", 1)
    kw.setdefault("max_streams", 4)
    # llama.cpp compiles a graph's Vulkan pipelines on its first use (lavapipe: up to ~30 s,
    # inside one engine tick); a request waiting for a slot meanwhile must not expire
    kw.setdefault("queue_timeout_s", 900.0)
    return Engine.from_config(model_dir / "config.yaml", n_gpu_layers=-1, **kw)


async def codes_of(e: Engine, text: str, opts: StreamOptions) -> np.ndarray:
    return (await e.generate(text, options=opts)).codes


async def slots_once_idle(e: Engine) -> list[int]:
    """Each slot's last KV position once no stream is active and the cells are gone (the
    engine thread removes them just after it releases the slot), or as they are after 30 s."""
    pos: list[int] = []
    for _ in range(3000):
        pos = [e._backbone.seq_pos_max(i) for i in range(e.config.max_streams)]
        if e.active_streams == 0 and all(p == -1 for p in pos):
            break
        await asyncio.sleep(0.01)
    return pos


async def batched(e: Engine, removed: list[tuple[int, int]]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    greedy = SamplingParams.greedy()
    opts = [StreamOptions(seed=20 + i, fixed_frames=f, sampling=greedy) for i, f in enumerate(BATCH_FRAMES)]
    alone = [await codes_of(e, t, o) for t, o in zip(BATCH_TEXTS, opts, strict=True)]

    async def rest(s: Any) -> np.ndarray:
        async with s:
            return np.concatenate([c.codes async for c in s])

    removed.clear()
    # one at a time, each in a slot before the next is made: a request is prepared on a worker
    # thread, so four started at once would reach the engine (and its slots) in any order
    tasks: list[asyncio.Task[np.ndarray]] = []
    for i, (t, o) in enumerate(zip(BATCH_TEXTS[:4], opts[:4], strict=True)):
        tasks.append(asyncio.create_task(rest(e.stream(t, options=o)) if i == 0 else codes_of(e, t, o)))
        while e.active_streams + e.queued_streams <= i:
            await asyncio.sleep(0.001)
    short = await tasks[1]  # slot 1 is free from here; slots 0, 2 and 3 step on
    # keep the gap open until the engine has stepped slot 1 as a stand-in STAND_INS times
    # (the cells it removed say so), whatever the device's speed, then a fifth stream takes it
    before = len(removed)
    while sum(1 for seq, _ in removed[before:] if seq == 1) < STAND_INS and not tasks[0].done():
        await asyncio.sleep(0.01)
    late = await codes_of(e, BATCH_TEXTS[4], opts[4])
    together = [await tasks[0], short, await tasks[2], await tasks[3], late]
    return alone, together


async def main(model_dir: Path, out_dir: Path) -> None:
    res: dict[str, Any] = {"seconds": {}}
    arr: dict[str, np.ndarray] = {}
    t0 = time.monotonic()

    def lap(what: str) -> None:
        res["seconds"][what] = round(time.monotonic() - t0, 1)
    removed: list[tuple[int, int]] = []
    max_rows = 0

    def recording(params: Any) -> Backbone:
        b = Backbone(params)
        real = b.seq_rm

        def seq_rm(seq: int, start: int = 0) -> None:
            removed.append((seq, start))
            real(seq, start)

        real_decode = b.decode_bound

        def decode_bound(n_rows: int, want_hidden: bool = True, out_offset: int = 0, lend: bool = False) -> int:
            nonlocal max_rows
            n = real_decode(n_rows, want_hidden, out_offset, lend)
            max_rows = max(max_rows, n)
            return n

        b.seq_rm = seq_rm  # type: ignore[method-assign]
        b.decode_bound = decode_bound  # type: ignore[method-assign]
        return b

    e = engine(model_dir, prefix_cache_mib=0, prefill_chunk=8, step_slack_s=0.0)
    e.backbone_factory = recording
    async with e:
        res["info"] = {k: v for k, v in e.info.items() if isinstance(v, (str, int, float, bool))}
        res["loaded_backend"] = _llama.loaded_backend()
        res["devices"] = _llama.devices()
        lap("engine started")
        arr["greedy"] = await codes_of(e, TEXT, GREEDY)
        lap("greedy")
        alone, together = await batched(e, removed)
        lap("batched")
        res["stand_ins"] = sum(1 for seq, _ in removed if seq == 1)
        res["max_rows"] = max_rows
        for i, (a, t) in enumerate(zip(alone, together, strict=True)):
            arr[f"alone{i}"], arr[f"together{i}"] = a, t
        # cancel: leave the stream after its first chunk
        async for _ in e.stream(TEXT, options=StreamOptions(fixed_frames=200)):
            break
        res["slots_after_cancel"] = await slots_once_idle(e)
        arr["greedy_after_cancel"] = await codes_of(e, TEXT, GREEDY)
        # streamed audio, for the offline decode of the same codes (in the test process)
        s = e.stream(TEXT, options=StreamOptions(seed=7, fixed_frames=30))
        async with s:
            chunks = [c async for c in s]
        arr["stream_codes"] = np.concatenate([c.codes for c in chunks])
        arr["stream_pcm"] = np.concatenate([c.pcm for c in chunks])
        lap("cancel and stream")

    # the prefix cache: snapshots of the device-resident KV cache, restored for the second
    async with engine(model_dir, prefix_cache_mib=256) as e:
        arr["cached_first"] = await codes_of(e, TEXT, GREEDY)
        arr["cached_second"] = await codes_of(e, TEXT, GREEDY)
        res["prefix_cache"] = e.prefix_cache_info()
    lap("prefix cache")

    # the fused f16 heads in the graph against the plain backbone's hidden states
    fused = Path(str(res["info"]["backbone"]))
    gg = model_dir / "MOSS-TTS-GGUF"
    ids = TokenIds()
    emb = Embedder(gg / "embeddings", ids)
    rows = np.full((24, ids.n_vq + 1), ids.audio_pad_code)
    rows[:, 0] = np.arange(1000, 1024)
    x = emb.embed_rows(rows)
    pos, seq = np.arange(24, dtype=np.int32), np.zeros(24, np.int32)
    out = np.zeros(24, np.int8)
    out[-1] = 1
    p = BackboneParams(model_path=str(gg / "MOSS_TTS_Q4_K_M.gguf"), n_ctx=256, n_batch=64, n_seq_max=1, n_gpu_layers=-1, n_threads=1)
    with Backbone(p) as bb:
        h = np.zeros((1, bb.n_embd), np.float32)
        bb.decode(x, pos, seq, out, h, None)
        res["plain_placement"] = bb.placement.info()
    with Backbone(msgspec_replace(p, model_path=str(fused))) as bb:
        bb.set_logit_columns(read_fused_info(fused).columns(ids))
        lg = np.zeros((1, bb.n_logit_columns), np.float32)
        bb.decode(x, pos, seq, out, None, lg)
    arr["heads_x"], arr["heads_hidden"], arr["heads_logits"] = x, h, lg
    lap("heads")

    (out_dir / "results.json").write_text(json.dumps(res, indent=1, default=str))
    np.savez(out_dir / "arrays.npz", **arr)


def msgspec_replace(p: BackboneParams, **kw: Any) -> BackboneParams:
    import msgspec

    return msgspec.structs.replace(p, **kw)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2])))
