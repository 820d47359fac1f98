"""One table of the per-step kernels, and :class:`Kernels`: which implementation each runs.

Every kernel is a specification (the NumPy code, which stays the definition) and a compiled
twin in ``native/`` promising the same outputs bit for bit. Which one runs is chosen once per
engine from the config: ``sampler: native | numpy`` sets all of them, ``kernels: ["+name",
"-name", ...]`` then turns single twins on or off, in order (as vLLM's ``custom_ops``).
A twin that cannot read the buffers it is offered leaves that kernel to its spec (logged).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from ..config import KERNEL_NAMES, EngineConfig
from ..core.delay_state import DelayStates
from ..core.sampling import RowSampler, sample_rows
from ..core.tokens import TokenIds
from .entries import DelayStep, FramePush, StepEmbed, Unreadable
from .spec import SpecDelayStep, SpecFramePush, SpecStepEmbed
from .tick_pool import TickPool, auto_threads

log = logging.getLogger(__name__)

_E = TypeVar("_E", DelayStep, FramePush, StepEmbed)


@dataclass(frozen=True)
class Kernel:
    name: str  # as the config's `kernels` key names it
    spec: str  # the specification (NumPy)
    twin: str  # the compiled twin


TABLE = (
    Kernel("row_sampler", "core/sampling.py sample_rows", "native/sampler.c (kernels/sampler.py)"),
    Kernel("delay_step", "core/delay_state.py DelayStates.step", "native/delay.c (kernels/delay_step.py)"),
    Kernel("frame_push", "core/frames.py FrameAssembler.push", "native/frames.c (kernels/frame_push.py)"),
    Kernel("step_embed", "model/tables.py Embedder.__call__", "native/embed.c (kernels/embed.py)"),
)
assert tuple(k.name for k in TABLE) == KERNEL_NAMES


class Kernels:
    """The engine's kernels, built once (``engine/assemble.py``): ``twins`` names the ones
    that run compiled; each ``bind_*`` returns that kernel's entry on the caller's buffers."""

    def __init__(self, twins: Iterable[str] = (), lib: ctypes.CDLL | None = None, threads: int = 1) -> None:
        self.twins = frozenset(twins)
        self.threads = max(1, threads)
        """The threads a step's compiled kernels are cut across (``tick_threads``)."""
        unknown = self.twins - set(KERNEL_NAMES)
        if unknown:
            raise ValueError(f"no kernel named {', '.join(sorted(unknown))} (kernels: {', '.join(KERNEL_NAMES)})")
        self._lib = lib
        if self.twins and lib is None:
            from ..model._llama import load_bridge

            self._lib = load_bridge()
        self.fallbacks: dict[str, str] = {}
        """Kernels left to their spec because the twin did not read the buffers: why."""
        self.row_sampler: RowSampler = sample_rows
        if "row_sampler" in self.twins:
            from .sampler import NativeSampler

            self.row_sampler = NativeSampler(self._lib)
        self.pool: TickPool | None = None
        """The tick's threads, when a step's twins are cut across more than one."""
        if self.twins & {"delay_step", "step_embed"} and self.threads > 1:
            self.pool = TickPool(self._bridge, self.threads)

    @classmethod
    def from_config(cls, cfg: EngineConfig) -> Kernels:
        return cls(cfg.twins(), threads=cfg.tick_threads or auto_threads())

    @property
    def reads_strided_audio(self) -> bool:
        """The audio logits may reach the step as a strided view (the fused heads' rows
        between text columns) without a copy: a twin reads them where they lie."""
        return bool(self.twins & {"row_sampler", "delay_step"})

    def describe(self) -> dict[str, str]:
        """Each kernel: "native" or "numpy", as it runs."""
        return {n: "native" if n in self.twins and n not in self.fallbacks else "numpy" for n in KERNEL_NAMES}

    def delay_states(self, capacity: int, ids: TokenIds) -> DelayStates:
        """The state machine for ``capacity`` streams, sampling with this row sampler."""
        return DelayStates(capacity, ids, self.row_sampler, strided_rows="row_sampler" in self.twins)

    def bind_delay_step(self, spec: SpecDelayStep) -> DelayStep:
        """The delay step on ``spec``'s buffers: the spec, or its twin (cut across threads
        when ``tick_threads`` > 1)."""
        if "delay_step" not in self.twins:
            return spec
        from .delay_step import DelayStepTwin

        return self._twin("delay_step", spec, lambda: DelayStepTwin(self._bridge, spec, self.pool))

    def bind_frame_push(self, spec: SpecFramePush) -> FramePush:
        """The frame push on ``spec``'s buffers: the spec, or its twin."""
        if "frame_push" not in self.twins:
            return spec
        from .frame_push import FramePushTwin

        return self._twin("frame_push", spec, lambda: FramePushTwin(self._bridge, spec.assembler, spec.slots, spec.rows))

    def bind_step_embed(self, spec: SpecStepEmbed) -> StepEmbed:
        """The step embedding on ``spec``'s buffers: the spec, or its twin (cut across threads
        when ``tick_threads`` > 1)."""
        if "step_embed" not in self.twins:
            return spec
        from .embed import StepEmbedTwin

        return self._twin(
            "step_embed", spec, lambda: StepEmbedTwin(self._bridge, spec.embedder, spec.slots, spec.rows, spec.out, self.pool)
        )

    def close(self) -> None:
        """The tick's threads (idempotent)."""
        if self.pool is not None:
            self.pool.close()

    @property
    def _bridge(self) -> ctypes.CDLL:
        assert self._lib is not None  # loaded in __init__ whenever a twin is on
        return self._lib

    def _twin(self, name: str, spec: _E, make: Callable[[], _E]) -> _E:
        try:
            return make()
        except Unreadable as exc:
            self.fallbacks[name] = str(exc)
            log.info("kernel %s: the compiled twin does not read these buffers (%s); running its spec", name, exc)
            return spec
