"""The models one server serves, each under its id: loaded at start or on a request's demand,
leased by the requests that use them, and unloaded when idle (``--idle-unload``).

Each model keeps its own engine (its loop, batching and ``max_streams``); the server's session
limit holds for all of them together. A request names a model by id (``model`` in the speech
body or the WebSocket ``start``, ``?model=`` on the WebSocket URL); with one model every name
is that model (OpenAI clients send ``tts-1``), with several OpenAI's own names mean the first.

A model with no lease for ``idle_unload_s`` seconds (and no stream in its engine) is closed:
its engine frees its native memory and the process hands freed heap back to the OS
(``malloc_trim``), and the next request for it loads it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from ..config import EngineConfig
from ..engine.client import EngineClient
from ..engine.frontend import WARMUP_TEXT
from ..errors import ConfigError, ModelLoadError
from .model_names import DEFAULT_MODEL_ID, resolve_model

log = logging.getLogger(__name__)

__all__ = ["ModelSet", "ModelSpec", "ServedModel"]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One model as configured: what is known of it before it loads, and how to make its
    engine (a new one each load: a closed engine does not start again)."""

    id: str
    config: EngineConfig  # read from its config file; the engine's own once loaded
    make: Callable[[], EngineClient]
    kind: str  # its family member (config.json's model_kind)
    n_vq: int
    on_demand: bool = False  # starts unloaded: the first request loads it
    reloadable: bool = True  # False: an engine handed in (tests, the Python API): never unloaded


@dataclass(slots=True)
class ServedModel:
    spec: ModelSpec
    engine: EngineClient | None = None
    leases: int = 0
    idle_since: float = field(default_factory=time.monotonic)
    loads: int = 0
    unloads: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def busy(self) -> bool:
        e = self.engine
        return self.leases > 0 or (e is not None and (e.active_streams > 0 or e.queued_streams > 0))


class ModelSet:
    """The served models by id (the first is the default)."""

    def __init__(self, specs: Sequence[ModelSpec], *, idle_unload_s: float | None = None, warmup: bool = True) -> None:
        if not specs:
            raise ConfigError("a server needs at least one model")
        ids = [s.id for s in specs]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"model ids must differ, got {', '.join(ids)}")
        if idle_unload_s is not None and idle_unload_s <= 0:
            raise ConfigError(f"idle_unload_s must be > 0, got {idle_unload_s}")
        self.models = {s.id: ServedModel(s) for s in specs}
        self.ids = ids
        self.idle_unload_s = idle_unload_s
        self.warmup = warmup
        self._idle_task: asyncio.Task[None] | None = None
        # idle-watch rounds left in which freed memory is collected and trimmed again: what a
        # finished request still held when its model was unloaded goes a moment later
        self._trim_rounds = 0

    @classmethod
    def of_engine(cls, engine: EngineClient, *, warmup: bool = True) -> ModelSet:
        """One engine handed in, under the default id (never unloaded)."""
        n_vq = int(engine.info.get("n_vq") or 0) if engine.info else 0
        spec = ModelSpec(DEFAULT_MODEL_ID, engine.config, lambda: engine, str(engine.info.get("model_kind", "")), n_vq, reloadable=False)
        return cls([spec], warmup=warmup)

    # -- choosing ------------------------------------------------------------------------------
    @property
    def default(self) -> ServedModel:
        return self.models[self.ids[0]]

    def resolve(self, name: str | None) -> ServedModel:
        return self.models[resolve_model(name, self.ids)]

    @property
    def encoder_id(self) -> str:
        """The model whose codec encodes uploaded voices: the one with the most codebooks (a
        member with fewer takes their first levels)."""
        return max(self.ids, key=self.n_vq)

    def n_vq(self, model_id: str) -> int:
        """A model's codebooks: its engine's once loaded, else its config's."""
        m = self.models[model_id]
        return int(m.engine.info.get("n_vq", m.spec.n_vq)) if m.engine is not None and m.engine.info else m.spec.n_vq

    def loaded(self) -> list[ServedModel]:
        return [m for m in self.models.values() if m.engine is not None]

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Load every model not marked on demand (a failure here is the server's: the cause
        is raised as it is); start the idle watch."""
        for m in self.models.values():
            if not m.spec.on_demand:
                try:
                    await self._ensure(m, quiet=True)
                except ModelLoadError as exc:
                    assert exc.__cause__ is not None
                    raise exc.__cause__ from None
        if self.idle_unload_s is not None and self._idle_task is None:
            self._idle_task = asyncio.create_task(self._watch_idle(), name="streamtts-idle-unload")

    async def aclose(self) -> None:
        if self._idle_task is not None:
            self._idle_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._idle_task
            self._idle_task = None
        for m in self.models.values():
            if m.engine is not None:
                engine, m.engine = m.engine, None
                await engine.aclose()

    async def acquire(self, m: ServedModel) -> EngineClient:
        """``m``'s engine, loaded if it is not, held loaded until :meth:`release`. A load
        failure is :class:`ModelLoadError` (the caller's, not the server's; nothing is held)."""
        m.leases += 1  # before any await: the idle watch must not unload it meanwhile
        try:
            return await self._ensure(m)
        except BaseException:
            self.release(m)
            raise

    def release(self, m: ServedModel) -> None:
        m.leases -= 1
        if not m.leases:
            m.idle_since = time.monotonic()

    @contextlib.asynccontextmanager
    async def lease(self, name: str | None) -> AsyncIterator[EngineClient]:
        """:meth:`acquire` and :meth:`release` around a block, for the model ``name`` names."""
        m = self.resolve(name)
        engine = await self.acquire(m)
        try:
            yield engine
        finally:
            self.release(m)

    async def _ensure(self, m: ServedModel, *, quiet: bool = False) -> EngineClient:
        if m.engine is not None:
            return m.engine
        async with m.lock:
            if m.engine is None:
                m.engine = await self._load(m, quiet)
            return m.engine

    async def _load(self, m: ServedModel, quiet: bool = False) -> EngineClient:
        """``quiet``: a failure is the caller's to report (at start: the server's error)."""
        t0 = time.monotonic()
        log.info("loading model %s (%s) ...", m.id, m.spec.kind or "?")
        try:
            engine = m.spec.make()
            await engine.start()
            if self.warmup and engine.warmup_s is None:
                # the first generation pays one-off costs (threads, the ONNX session's first
                # run): the first client does not
                await engine.generate(WARMUP_TEXT, seed=0, max_new_tokens=48)
                engine.forget_ticks()  # its ticks paid one-off costs (admission by capacity)
        except Exception as exc:
            if not quiet:
                log.error("model %s could not be loaded: %s", m.id, exc)
            raise ModelLoadError(m.id, exc) from exc
        m.loads += 1
        m.idle_since = time.monotonic()
        log.info("model %s loaded in %.1f s", m.id, time.monotonic() - t0)
        return engine

    async def unload(self, m: ServedModel) -> bool:
        """Close ``m``'s engine if nothing uses it; True if it was unloaded."""
        async with m.lock:
            if m.engine is None or m.busy or not m.spec.reloadable:
                return False
            engine, m.engine = m.engine, None
            await engine.aclose()
        del engine
        gc.collect()  # the engine's buffers go now, not at some later collection
        _trim_heap()
        m.unloads += 1
        self._trim_rounds = 8
        log.info("model %s unloaded (idle %.0f s)", m.id, time.monotonic() - m.idle_since)
        return True

    async def _watch_idle(self) -> None:
        idle = self.idle_unload_s
        assert idle is not None
        while True:
            await asyncio.sleep(min(1.0, idle / 4))
            now = time.monotonic()
            for m in self.models.values():
                if m.engine is not None and not m.busy and now - m.idle_since >= idle:
                    await self.unload(m)
            if self._trim_rounds:
                self._trim_rounds -= 1
                gc.collect()
                _trim_heap()

    # -- what the server reports ---------------------------------------------------------------
    def active_streams(self) -> int:
        return sum(m.engine.active_streams for m in self.loaded() if m.engine is not None)

    def queued_streams(self) -> int:
        return sum(m.engine.queued_streams for m in self.loaded() if m.engine is not None)

    def max_streams(self) -> int:
        return sum(m.spec.config.max_streams if m.engine is None else m.engine.config.max_streams for m in self.models.values())

    def listing(self) -> list[dict[str, object]]:
        """Every model: id, member, codebooks, whether it is loaded (``/v1/models``, ``/readyz``)."""
        out: list[dict[str, object]] = []
        for m in self.models.values():
            info = m.engine.info if m.engine is not None else {}
            out.append({
                "id": m.id,
                "model_kind": info.get("model_kind", m.spec.kind) or "moss-tts",
                "n_vq": info.get("n_vq", m.spec.n_vq),
                "loaded": m.engine is not None,
                "name": info.get("model", ""),
                "demo": bool(info.get("demo", False)),
            })  # fmt: skip
        return out


def _trim_heap() -> None:
    """Hand the heap's free pages back to the OS (glibc keeps them for reuse otherwise)."""
    name = ctypes.util.find_library("c")
    if not name:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(name).malloc_trim(0)
