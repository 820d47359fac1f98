"""Prometheus text exposition (format 0.0.4), written by us: a few counters,
gauges and histograms do not justify a dependency.

Everything is updated on the event loop thread, so no locks. Gauges may be
callbacks (read at scrape time: the engine's active/queued streams).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

__all__ = ["Counter", "CounterFn", "Gauge", "Histogram", "InfoGauge", "Registry", "ServerMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

LabelKey = tuple[tuple[str, str], ...]


def _fmt(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if math.isnan(v):
        return "NaN"
    f = float(v)
    return str(int(f)) if f.is_integer() and abs(f) < 1e15 else repr(f)


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(key: LabelKey, extra: tuple[tuple[str, str], ...] = ()) -> str:
    items = key + extra
    if not items:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in items) + "}"


class _Metric:
    kind = ""

    def __init__(self, name: str, help: str) -> None:
        self.name = name
        self.help = help

    def samples(self) -> Iterable[str]:  # pragma: no cover - overridden
        return ()

    def render(self) -> str:
        head = f"# HELP {self.name} {self.help}\n# TYPE {self.name} {self.kind}\n"
        return head + "".join(line + "\n" for line in self.samples())


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name: str, help: str) -> None:
        super().__init__(name, help)
        self._values: dict[LabelKey, float] = {}

    def inc(self, value: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        self._values[key] = self._values.get(key, 0.0) + value

    def value(self, **labels: str) -> float:
        return self._values.get(tuple(sorted(labels.items())), 0.0)

    def samples(self) -> Iterable[str]:
        if not self._values:
            yield f"{self.name} 0"
        for key, v in sorted(self._values.items()):
            yield f"{self.name}{_labels(key)} {_fmt(v)}"


class Gauge(_Metric):
    kind = "gauge"

    def __init__(self, name: str, help: str, fn: Callable[[], float] | None = None) -> None:
        super().__init__(name, help)
        self._fn = fn
        self.value = 0.0

    def set(self, v: float) -> None:
        self.value = v

    def inc(self, v: float = 1.0) -> None:
        self.value += v

    def dec(self, v: float = 1.0) -> None:
        self.value -= v

    def samples(self) -> Iterable[str]:
        yield f"{self.name} {_fmt(self._fn() if self._fn is not None else self.value)}"


class CounterFn(_Metric):
    """Counters kept elsewhere (the engine thread), read at scrape time: ``fn`` returns
    each label value's count."""

    kind = "counter"

    def __init__(self, name: str, help: str, label: str, fn: Callable[[], dict[str, float]]) -> None:
        super().__init__(name, help)
        self._label = label
        self._fn = fn

    def samples(self) -> Iterable[str]:
        for value, count in sorted(self._fn().items()):
            yield f"{self.name}{_labels(((self._label, value),))} {_fmt(count)}"


class GaugeFn(CounterFn):
    """Gauges kept elsewhere, one per label value, read at scrape time."""

    kind = "gauge"


class InfoGauge(_Metric):
    """A constant 1 whose labels carry text read at scrape time (Prometheus' *_info idiom)."""

    kind = "gauge"

    def __init__(self, name: str, help: str, labels: Callable[[], LabelKey]) -> None:
        super().__init__(name, help)
        self._labels = labels

    def samples(self) -> Iterable[str]:
        key = self._labels()
        if key:
            yield f"{self.name}{_labels(key)} 1"


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name: str, help: str, buckets: Iterable[float]) -> None:
        super().__init__(name, help)
        self.buckets = sorted(buckets)
        self.counts = [0] * len(self.buckets)
        self.count = 0
        self.sum = 0.0

    def observe(self, v: float) -> None:
        if v != v:  # NaN: nothing to count
            return
        self.count += 1
        self.sum += v
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1

    def samples(self) -> Iterable[str]:
        for b, c in zip(self.buckets, self.counts, strict=True):
            yield f'{self.name}_bucket{{le="{_fmt(b)}"}} {c}'
        yield f'{self.name}_bucket{{le="+Inf"}} {self.count}'
        yield f"{self.name}_sum {_fmt(self.sum)}"
        yield f"{self.name}_count {self.count}"


class Registry:
    def __init__(self) -> None:
        self._metrics: list[_Metric] = []

    def add(self, m: _Metric) -> None:
        self._metrics.append(m)

    def render(self) -> str:
        return "".join(m.render() for m in self._metrics)


class ServerMetrics:
    """The server's metrics; ``active``/``queued`` read the engine at scrape time."""

    def __init__(
        self,
        active: Callable[[], float],
        queued: Callable[[], float],
        prefix: Callable[[], dict[str, int]] = dict,
        voice_store_up: Callable[[], float] = lambda: 1.0,
        engine_info: Callable[[], dict[str, object]] = dict,
        admission: Callable[[], dict[str, float]] = dict,
        models: Callable[[], list[dict[str, object]]] = list,
    ) -> None:
        r = self.registry = Registry()
        self.model_loaded = GaugeFn(
            "streamtts_model_loaded",
            "1 for each served model that is loaded, 0 for one that waits unloaded (on demand, or idle).",
            "model",
            lambda: {str(m["id"]): float(bool(m["loaded"])) for m in models()},
        )
        self.capacity = Gauge(
            "streamtts_capacity_streams",
            "Streams the engine steps ahead of real time by its margin, from its own tick times "
            "(admission by capacity admits below it).",
            lambda: admission().get("capacity_streams", 0.0),
        )
        self.tick_at_capacity = Gauge(
            "streamtts_tick_seconds_at_capacity",
            "The estimated tick time with that many streams (a frame is 0.08 s).",
            lambda: max(0.0, admission().get("tick_ms_at_capacity", -1.0)) / 1000,
        )
        self.finish_rate = Gauge(
            "streamtts_streams_finished_per_second",
            "Rate at which streams ended lately (Retry-After and queue waits are computed from it).",
            lambda: admission().get("finish_rate_per_s", 0.0),
        )
        self.capacity_limit = Gauge(
            "streamtts_capacity_limit_streams",
            "The limit on the capacity from the engine's pace over the last seconds: a second in "
            "which its ticks came slower than the margin allows lowers it, one in time raises it.",
            lambda: admission().get("limit_streams", 0.0),
        )
        self.frames_per_step = Gauge(
            "streamtts_frames_per_step",
            "Share of stream-steps that complete an audio frame lately (a segment's first 32 "
            "steps make none): a tick must fit in 0.08 s times it.",
            lambda: admission().get("frames_per_step", 1.0),
        )
        self.lag = Gauge(
            "streamtts_stream_lag_max_seconds",
            "How far the stream furthest behind a real-time listener is behind (0: all ahead).",
            lambda: admission().get("lag_max_s", 0.0),
        )
        self.admission = CounterFn(
            "streamtts_admission_total",
            "Engine admission decisions for new streams: admitted, queued (waited for a slot), "
            "refused (would have waited past the first-audio deadline).",
            "decision",
            lambda: {k: admission().get(k, 0.0) for k in ("admitted", "queued", "refused")},
        )
        self.backbone_info = InfoGauge(
            "streamtts_backbone_info",
            "Where the backbone runs: the llama.cpp build (backend) and device llama.cpp reported.",
            lambda: tuple(
                (k, str(engine_info()[k]))
                for k in ("backend", "device", "device_description")
                if k in engine_info()
            ),
        )
        self.layers_offloaded = Gauge(
            "streamtts_backbone_layers_offloaded",
            "Backbone layers llama.cpp put on a GPU device (0 on the CPU).",
            lambda: float(str(engine_info().get("layers_offloaded", 0))),
        )
        self.device_memory = Gauge(
            "streamtts_backbone_device_memory_bytes",
            "Device memory the backbone's buffers take (model, KV cache, compute; 0 on the CPU).",
            lambda: float(str(engine_info().get("device_memory_mib", 0))) * 2**20,
        )
        self.active_streams = Gauge(
            "streamtts_active_streams", "Streams holding an engine slot.", active
        )
        self.queued_streams = Gauge(
            "streamtts_queued_streams", "Streams waiting for an engine slot.", queued
        )
        self.sessions = Gauge("streamtts_sessions", "Open sessions (WebSocket and HTTP speech).")
        self.sessions_total = Counter("streamtts_sessions_total", "Sessions accepted, by kind.")
        self.refused_total = Counter(
            "streamtts_refused_total", "Sessions refused at the session limit, by kind."
        )
        self.errors_total = Counter("streamtts_errors_total", "Errors sent to clients, by code.")
        self.slow_clients_total = Counter(
            "streamtts_slow_clients_dropped_total", "Clients dropped because they stopped reading."
        )
        self.audio_seconds_total = Counter("streamtts_audio_seconds_total", "Audio seconds sent.")
        self.segments_total = Counter("streamtts_segments_total", "Text segments synthesised.")
        self.ttfa = Histogram(
            "streamtts_ttfa_seconds",
            "Time to first audio of a session (first segment ready -> first audio queued).",
            (0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0),
        )
        self.rtf = Histogram(
            "streamtts_rtf",
            "Real-time factor of a finished session (wall time / audio time; < 1 is faster than real time).",
            (0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0),
        )
        self.prefix_hits = Gauge(
            "streamtts_prefix_cache_hits",
            "Streams whose shared prompt prefix (template + voice) was loaded, not computed.",
            lambda: prefix().get("hits", 0),
        )
        self.prefix_misses = Gauge(
            "streamtts_prefix_cache_misses",
            "Shared prompt prefixes computed and stored.",
            lambda: prefix().get("misses", 0),
        )
        self.prefix_bytes = Gauge(
            "streamtts_prefix_cache_bytes", "KV snapshot bytes held by the prefix cache.", lambda: prefix().get("bytes", 0)
        )
        self.draining = Gauge(
            "streamtts_draining", "1 while the server drains (SIGTERM or POST /admin/drain)."
        )
        self.drain_closed_total = Counter(
            "streamtts_drain_sessions_closed_total",
            "Sessions with nothing in progress closed during a drain (1001), by kind.",
        )
        self.drain_cut_total = Counter(
            "streamtts_drain_streams_cut_total",
            "Streams still running when the drain timeout ran out, cut (1001), by kind.",
        )
        self.voice_store_up = Gauge(
            "streamtts_voice_store_up",
            "1 when the shared voice store answered last time (always 1 for memory).",
            voice_store_up,
        )
        for m in (
            self.backbone_info,
            self.layers_offloaded,
            self.device_memory,
            self.prefix_hits,
            self.prefix_misses,
            self.prefix_bytes,
            self.active_streams,
            self.queued_streams,
            self.sessions,
            self.sessions_total,
            self.refused_total,
            self.errors_total,
            self.slow_clients_total,
            self.audio_seconds_total,
            self.segments_total,
            self.ttfa,
            self.rtf,
            self.draining,
            self.drain_closed_total,
            self.drain_cut_total,
            self.voice_store_up,
            self.capacity,
            self.tick_at_capacity,
            self.finish_rate,
            self.capacity_limit,
            self.frames_per_step,
            self.lag,
            self.admission,
            self.model_loaded,
        ):
            r.add(m)

    def render(self) -> str:
        return self.registry.render()
