"""The tick's threads (``native/pool.c``): a step's compiled kernels cut into chunks of rows.

Why: with many streams (a GPU's 64-128) the CPU work after each decode, mostly sampling
32 codebooks per stream, is a tick's largest part on one core (about the time an 8B decode
of 128 rows takes on an H200). The rows are independent, so a step's chunks run on several
cores. The pool is native: one call releases the GIL once and its threads never take it (a
Python pool's threads each waited for the GIL behind the asyncio and decode threads, twice
a step, and two cores stepped no faster than one). Chunks are taken from a shared counter,
so a worker whose core is busy elsewhere leaves its chunks to the caller instead of being
waited for. A chunk's rows and states come out the same however a step is cut
(counter-based RNG per stream and step; ``tests/kernels/test_conformance.py`` runs
lifecycles across threads), so the thread count changes no output.

What the cut relies on: a step's slots are distinct (the engine's always are; a slot
repeated in two chunks is not detected), and a chunk that fails (non-finite logits) leaves
the other chunks stepped, where one call would have changed nothing: the engine fails every
stream of a step that raised, so no stream goes on from a half step.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

from ..errors import NativeLibraryError

MIN_ROWS = 32
"""The smallest step that is cut: below it, waking a thread costs more than it saves."""
CHUNK_ROWS = 1
"""Rows a chunk holds at the least: one stream's row is already tens of microseconds of work."""
CHUNKS_PER_THREAD = 32
"""Chunks per thread in a step. Small chunks, because the caller waits for every chunk a worker
took: a worker sharing its core with the codec's thread runs at half speed, and with 16-row
chunks that wait was most of what the second core saved (128 streams on 2 cores, a level of
150 frames: 1.09-1.15 s with 16-row chunks, 1.07-1.11 s with 4, 0.94-1.00 s with 1)."""


def auto_threads() -> int:
    """The cores this process may run on, at most 8 (a tick's chunks rarely fill more)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


class TickPool:
    """``threads`` - 1 native worker threads that, with the caller, run a step's chunks."""

    def __init__(self, lib: ctypes.CDLL, threads: int) -> None:
        self.threads = max(1, threads)
        self._lib = lib
        self.handle: int | None = None
        """The ``stt_pool *`` the pooled kernels take (None once closed)."""
        self.handle = lib.stt_pool_new(self.threads)
        if not self.handle:
            raise NativeLibraryError(f"could not start {self.threads - 1} tick threads (stt_pool_new)")
        self._chunks: dict[int, int] = {}
        self.parallel_runs = 0
        """Calls that were cut into chunks (a plain int: counted by the engine thread)."""

    def chunk_rows(self, b: int) -> int:
        """Rows per chunk for a step of ``b`` rows; 0 when the step is not cut."""
        rows = self._chunks.get(b)
        if rows is None:
            n = self.threads * CHUNKS_PER_THREAD
            rows = 0 if b < MIN_ROWS or self.threads < 2 else max(CHUNK_ROWS, -(-b // n))
            self._chunks[b] = rows
        return rows

    @staticmethod
    def chunk_codes(rows: int) -> np.ndarray:
        """A buffer for the codes of the chunks of a step of up to ``rows`` rows."""
        return np.zeros(max(1, -(-rows // CHUNK_ROWS)), dtype=np.int32)

    def close(self) -> None:
        """Stop and join the threads (idempotent)."""
        handle, self.handle = self.handle, None
        if handle:
            self._lib.stt_pool_free(handle)

    def __del__(self) -> None:
        self.close()
