"""StreamSink and Outbox: what the decode thread hands to the event loop, in order, in one wake-up."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np

from streamtts.engine.sink import Outbox, StreamSink
from streamtts.request import AudioChunk, StreamStats


def _chunk(i: int, step: int) -> AudioChunk:
    return AudioChunk(pcm=np.full(4, i, np.float32), frames=range(i, i + 1), codes=np.zeros((1, 2), np.int64), step=step)


def test_an_outbox_hands_every_sink_its_items_in_order_in_one_call_per_loop() -> None:
    async def main() -> tuple[list[list[Any]], int, list[StreamStats]]:
        loop = asyncio.get_running_loop()
        calls = 0
        plain = loop.call_soon_threadsafe

        def counted(*a: Any, **kw: Any) -> Any:
            nonlocal calls
            calls += 1
            return plain(*a, **kw)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        sinks = [StreamSink(loop, StreamStats()) for _ in range(3)]

        def decode_thread() -> None:  # as DecodeWorker._decode: one outbox per codec call
            box = Outbox()
            for i, s in enumerate(sinks):
                s.put_chunk(_chunk(10 * i, 40 + i), box)
                s.put_chunk(_chunk(10 * i + 1, 41 + i), box)
            sinks[1].finish(box)
            assert calls == 0  # nothing handed over before the flush
            box.flush()

        t = threading.Thread(target=decode_thread)
        t.start()
        t.join()
        got: list[list[Any]] = [[], [], []]
        for i, s in enumerate(sinks):
            for _ in range(3 if i == 1 else 2):
                item = await asyncio.wait_for(s.get(), 10)
                got[i].append(None if item is None else int(item.pcm[0]))  # type: ignore[union-attr]
        return got, calls, [s.stats for s in sinks]

    got, calls, stats = asyncio.run(main())
    assert got == [[0, 1], [10, 11, None], [20, 21]]
    assert calls == 1
    assert [st.first_audio_step for st in stats] == [40, 41, 42]  # the first chunk's step
    assert stats[1].t_done > 0 and stats[0].t_done == 0


def test_a_stream_taken_after_it_was_done_has_a_positive_tick() -> None:
    """Many streams on few cores: a consumer may take its first chunk after the decode thread
    finished the stream. The tick is timed on the producer's clock, not negative."""

    async def main() -> StreamStats:
        sink = StreamSink(asyncio.get_running_loop(), StreamStats(steps=50))

        def decode_thread() -> None:
            sink.put_chunk(_chunk(0, 10))
            time.sleep(0.01)  # so the producer's span is not 0 on a coarse clock
            sink.put_chunk(_chunk(1, 50))
            sink.finish()

        t = threading.Thread(target=decode_thread)
        t.start()
        t.join()
        done = sink.stats.t_done
        while time.monotonic() == done:  # the consumer's first look comes strictly later
            await asyncio.sleep(0)
        while await sink.get() is not None:
            pass
        return sink.stats

    st = asyncio.run(main())
    assert st.t_first_audio > st.t_done  # taken after it was done
    assert st.first_audio_step == 10 and st.ms_per_tick > 0
