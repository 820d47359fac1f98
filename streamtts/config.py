"""Typed engine configuration.

Accepts the official MOSS-TTS llama.cpp YAML keys unchanged (a user points
``--config`` at their existing file) plus streamtts's own keys. Relative paths
resolve against the project root (the first folder above the config holding a
``pyproject.toml``), then the config's folder, then the working directory, as
the official pipeline does.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from .errors import ConfigError, SamplingError

log = logging.getLogger(__name__)


class _SamplingKeys(msgspec.Struct, kw_only=True):
    """The sampling keys and their defaults (the official config's): the fields of
    :class:`SamplingParams` and the sampling part of :class:`EngineConfig`."""

    text_temperature: float = 1.5
    text_top_p: float = 1.0
    text_top_k: int = 50
    audio_temperature: float = 1.7
    audio_top_p: float = 0.8
    audio_top_k: int = 25
    audio_repetition_penalty: float = 1.0


# msgspec freezes a subclass of a mutable Struct (assignments raise); mypy's dataclass rule is stricter
class SamplingParams(_SamplingKeys, frozen=True, kw_only=True, forbid_unknown_fields=True):  # type: ignore[misc]
    """Per-request sampling. Temperature 0 means greedy (argmax, first index on ties)."""

    def validate(self) -> SamplingParams:
        for name in ("text_temperature", "audio_temperature"):
            v = getattr(self, name)
            if not (v >= 0.0) or v != v or v == float("inf"):
                raise SamplingError(
                    name, f"{name} must be a finite number >= 0 (0 = greedy), got {v!r}"
                )
        for name in ("text_top_p", "audio_top_p"):
            v = getattr(self, name)
            if not (0.0 < v <= 1.0):
                raise SamplingError(name, f"{name} must be in (0, 1], got {v!r}")
        for name in ("text_top_k", "audio_top_k"):
            v = getattr(self, name)
            if v < 0:
                raise SamplingError(name, f"{name} must be >= 0 (0 = no top-k), got {v!r}")
        p = self.audio_repetition_penalty
        if not (p > 0.0) or p == float("inf"):
            raise SamplingError(
                "audio_repetition_penalty",
                f"audio_repetition_penalty must be > 0 (1.0 = off), got {p!r}",
            )
        return self

    @classmethod
    def greedy(cls) -> SamplingParams:
        return cls(text_temperature=0.0, audio_temperature=0.0)


SAMPLING_KEYS = tuple(SamplingParams.__struct_fields__)
KERNEL_NAMES = ("row_sampler", "delay_step", "frame_push", "step_embed")
"""The per-step kernels with a compiled twin (``streamtts/kernels/``), as the ``kernels`` key names them."""


def select_twins(sampler: str, overrides: Sequence[str] = ()) -> frozenset[str]:
    """The kernels whose twin runs: all for ``sampler: native``, none for ``numpy``, then each
    ``"+name"`` / ``"-name"`` of ``overrides`` in order (the ``sampler`` and ``kernels``
    keys' one check: EngineConfig.validate and kernels/registry.py both call it)."""
    if sampler not in ("native", "numpy"):
        raise ConfigError(f"sampler must be 'native' or 'numpy', got {sampler!r}")
    on = set(KERNEL_NAMES if sampler == "native" else ())
    for item in overrides:
        sign, name = (item[:1], item[1:]) if isinstance(item, str) else ("", "")
        if sign not in ("+", "-") or name not in KERNEL_NAMES:
            raise ConfigError(f"kernels: {item!r} is not '+name' or '-name' with a name from {', '.join(KERNEL_NAMES)}")
        (on.add if sign == "+" else on.discard)(name)
    return frozenset(on)
PATH_KEYS = (
    "backbone_gguf",
    "embedding_dir",
    "lm_head_dir",
    "tokenizer_dir",
    "audio_encoder_onnx",
    "audio_decoder_onnx",
    "audio_encoder_trt",
    "audio_decoder_trt",
    "model_config_json",
    "fused_gguf",
)


# The numeric keys' ranges: key, lowest, highest (None = no upper bound), what a value means.
_BOUNDS: tuple[tuple[str, float, float | None, str], ...] = (
    ("n_ctx", 64, None, ""),
    ("n_batch", 1, None, ""),
    ("max_new_tokens", 1, None, ""),
    ("max_streams", 1, None, ""),
    ("codec_nice", 0, 19, ""),
    ("heads_threads", 0, None, "0 = llama.cpp's thread count"),
    ("n_threads", 0, None, "0 = automatic"),
    ("thread_poll", -1, 100, "-1 = llama.cpp's pool"),
    ("step_slack_s", 0, None, ""),
    ("realtime_margin", 0, None, ""),
    ("first_audio_deadline_s", 0, None, ""),
    ("prefix_cache_mib", 0, None, ""),
    ("prefill_chunk", 1, None, ""),
    ("decode_context_frames", 0, None, ""),
    ("tick_threads", 0, None, "0 = automatic"),
    ("gil_switch_ms", 0, 100, "0 = Python's"),
)


class EngineConfig(_SamplingKeys, kw_only=True):
    # ---- official keys (MOSS-TTS llama.cpp configs) ----
    backbone_gguf: str = ""
    embedding_dir: str = ""
    lm_head_dir: str = ""
    tokenizer_dir: str = ""
    audio_backend: Literal["onnx", "trt", "torch"] = "onnx"
    audio_encoder_onnx: str = ""
    audio_decoder_onnx: str = ""
    audio_encoder_trt: str = ""
    audio_decoder_trt: str = ""
    heads_backend: Literal["auto", "numpy", "torch", "fused"] = "auto"
    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int = 0  # 0 = the physical cores other processes leave idle (model/threads.py)
    n_gpu_layers: int = -1
    max_new_tokens: int = 3072
    use_gpu_audio: bool = True
    low_memory: bool = False
    kv_cache_type_k: str = "f16"
    kv_cache_type_v: str = "f16"
    flash_attn: str | bool = "auto"
    # and the sampling keys (text_temperature ... audio_repetition_penalty, _SamplingKeys)

    # ---- streamtts keys ----
    model_config_json: str = ""  # token ids; default: config.json next to the GGUF/tokenizer
    fused_gguf: str = ""  # GGUF whose output layer holds the head rows (streamtts convert)
    # heads_backend auto/fused without a fused GGUF: write one on first load, next to the
    # backbone, else in the cache folder (CPU: the text rows only, audio heads in NumPy; GPU:
    # f16 audio rows too); false = only a file you made (fused_gguf, streamtts convert)
    fuse_on_load: bool = True
    normalize_text: bool = True
    max_streams: int = 4  # concurrent sequences (llama.cpp n_seq_max); n_ctx is per stream
    prefill_chunk: int = 512  # prompt rows joining streams may prefill per tick (official: n_batch)
    # KV snapshots of shared prompt prefixes (template + reference voice), 0 = off
    prefix_cache_mib: int = 256
    max_batch_rows: int = 0  # streams stepped per tick at most (0 = all); the ones closest to running dry first
    # while a stream waits for its first audio, streams more than this far ahead of a
    # real-time listener skip their steps (smaller ticks: first audio sooner); 0 = off
    step_slack_s: float = 1.0
    queue_size: int = 64  # requests waiting for a slot before new ones are refused
    queue_timeout_s: float = 30.0
    # "slots": a request starts when one of max_streams slots is free; "capacity" (what
    # `streamtts serve` runs): also only while every stream, the new one included, stays
    # ahead of real time by realtime_margin, by the engine's own tick times (engine/capacity.py)
    admission: str = "slots"
    # a tick must fit in a frame (80 ms) times the share of steps that complete one, with
    # this share to spare
    realtime_margin: float = 0.25
    # "capacity": a new stream waits at most this long for a slot; refused at once when the
    # measured rate at which streams finish says it would wait longer
    first_audio_deadline_s: float = 3.0
    # exact stateful codec decoding (streamtts codec build): a decoder_streaming.onnx path;
    # "" = the one next to audio_decoder_onnx when present and built from the same weights;
    # "off" = always the windowed path (the stateless decoder.onnx with left context)
    codec_streaming: str = ""
    decode_context_frames: int = 125  # windowed path: left context per decode window (10 s)
    chunk_frames: list[int] = msgspec.field(default_factory=lambda: [1, 2, 4, 8])
    max_buffered_s: float = 20.0  # backpressure high-water mark (audio not yet consumed)
    resume_buffered_s: float = 10.0  # low-water mark
    codec_threads: int = 0  # ONNX Runtime intra-op threads for the codec (0 = default)
    # Linux: nice value of the codec's threads (0..19; 0 = as the backbone's): on few cores
    # a higher one lets the codec take idle moments instead of stalling llama.cpp's threads
    codec_nice: int = 0
    # the backbone's compute and the codec's calls take turns instead of running at once:
    # "auto" = when both run on the CPU (they share its cores), "always", "never"
    codec_turns: str = "auto"
    blas_threads: int = 1  # NumPy BLAS threads (audio heads); spinning BLAS threads fight llama.cpp's
    # threads of the NumPy audio heads' matmul (ours, sleeping between steps; each part one
    # single-threaded BLAS call); 0 = as many as llama.cpp's threads (their cores are idle then)
    heads_threads: int = 0
    # the per-step kernels (streamtts/kernels/), one switch: "native" = the compiled twins
    # (native/*.c, built with the bridge), "numpy" = their NumPy specifications (the same tokens
    # and frames for the same seed, the native ones several times faster); or per-kernel
    # changes to `sampler`'s choice, applied in order: "+name" runs that kernel's compiled twin,
    # "-name" its specification; names: row_sampler, delay_step, frame_push, step_embed
    # (e.g. ["-delay_step"], or with sampler: numpy ["+row_sampler"])
    kernels: str | list[str] = msgspec.field(default_factory=list)
    # an alias of `kernels: native | numpy` (the key's older name), the base a list changes
    sampler: str = "native"
    # threads the CPU side of a tick (sampling, state machine, embedding) is cut across when
    # a step has at least 64 streams (32 rows each at the least); 0 = the cores this process
    # may run on, at most 8; 1 = the engine thread alone. Outputs do not depend on it.
    tick_threads: int = 0
    # Python's GIL switch interval while an engine runs (ms; 0 = leave Python's 5 ms). After
    # each compiled call (the GIL released) the engine thread waits for the GIL until the
    # thread holding it (asyncio, the decode thread, a tick's helpers) lets go, at most this
    # long: 0.5 ms keeps those waits short against a tick of a few ms (process-wide)
    gil_switch_ms: float = 0.5
    log_llama: bool = False  # forward llama.cpp's own log lines
    # which llama.cpp build runs the backbone: cpu, cuda, vulkan, or auto (CUDA, then Vulkan
    # with a GPU, then CPU, among the builds present); STREAMTTS_BACKEND overrides it
    backend: str = "auto"
    # Engine.start(): pay the first request's one-off costs at load (the default prompt's
    # prefix into the prefix cache, llama.cpp's one-row graph, the codec's first call)
    warmup: bool = True
    # llama.cpp's CPU workers between decodes: 0 = they sleep, up to 100 = they spin;
    # -1 = llama.cpp's own thread pool (which spins at 50)
    thread_poll: int = 0
    # Linux, thread_poll >= 0, 2+ llama.cpp threads: each of them keeps one CPU (the engine
    # thread one, each worker another), so two never take turns on one core while another
    # idles (bridge.c; docs/perf.md); false = the kernel places them
    pin_threads: bool = True
    # the prompt template (core/prompt.py TEMPLATES; docs/family.md): "" = the model's member's
    # ("moss", the GitHub processor's; "moss-ttsd", MOSS-TTSD's own processor's)
    prompt_template: str = ""
    # `streamtts serve`: voice names -> a reference clip (path, resolved like the model paths)
    # or null (the model's own voice). Empty: every OpenAI voice name is the model's own voice.
    voices: dict[str, str | None] = msgspec.field(default_factory=dict)

    # where the file came from (not a YAML key)
    source: str = ""
    # the keys the config file (and load_config's overrides) set; None: built in Python, where
    # a key counts as set when it differs from its default (not a YAML key; see is_set)
    explicit_keys: frozenset[str] | None = None

    def is_set(self, key: str) -> bool:
        """Whether the user chose ``key`` (a model's defaults, with_defaults, leave it alone)."""
        if self.explicit_keys is not None:
            return key in self.explicit_keys
        return bool(getattr(self, key) != getattr(_DEFAULTS, key))

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(**{k: getattr(self, k) for k in SAMPLING_KEYS}).validate()

    def twins(self) -> frozenset[str]:
        """The kernels whose compiled twin runs (``kernels``, ``sampler`` its alias), checked."""
        if isinstance(self.kernels, str):
            if self.kernels not in ("native", "numpy"):
                raise ConfigError(
                    f"kernels must be 'native', 'numpy' or a list of '+name' / '-name', got {self.kernels!r}"
                )
            if self.sampler not in ("native", self.kernels):
                raise ConfigError(
                    f"sampler: {self.sampler!r} and kernels: {self.kernels!r}: sampler is another name "
                    "for kernels; give one"
                )
            return select_twins(self.kernels)
        return select_twins(self.sampler, self.kernels)

    def validate(self) -> EngineConfig:
        self.sampling  # noqa: B018 - validates the sampling keys
        for key, lo, hi, note in _BOUNDS:
            value = getattr(self, key)
            if value < lo or (hi is not None and value > hi):
                words = f">= {lo}" if hi is None else f"{lo}..{hi}"
                if note:
                    words += f" ({note})"
                raise ConfigError(f"{key} must be {words}, got {value}")
        if self.admission not in ("slots", "capacity"):
            raise ConfigError(f"admission must be 'slots' or 'capacity', got {self.admission!r}")
        if self.codec_turns not in ("auto", "always", "never"):
            raise ConfigError(f"codec_turns must be 'auto', 'always' or 'never', got {self.codec_turns!r}")
        if self.backend not in ("auto", "cpu", "cuda", "vulkan"):
            raise ConfigError(f"backend must be 'auto', 'cpu', 'cuda' or 'vulkan', got {self.backend!r}")
        self.twins()
        if not self.chunk_frames or any(c < 1 for c in self.chunk_frames):
            raise ConfigError(f"chunk_frames must be a non-empty list of ints >= 1, got {self.chunk_frames}")
        if self.resume_buffered_s > self.max_buffered_s or self.max_buffered_s <= 0:
            raise ConfigError("need 0 < resume_buffered_s <= max_buffered_s")
        bad = [name for name in self.voices if not name.strip() or len(name) > 64]
        if bad:
            raise ConfigError(f"voices: names must be 1-64 characters, got {bad!r}")
        return self


_DEFAULTS = EngineConfig()
_NOT_KEYS = frozenset({"source", "explicit_keys"})


def with_defaults(cfg: EngineConfig, defaults: Mapping[str, Any], source: str) -> EngineConfig:
    """A copy of ``cfg`` whose keys the user did not set (:meth:`EngineConfig.is_set`) take
    their value from ``defaults`` (a model's own, e.g. its member's sampling preset, read from
    ``source``); a bad value is a ConfigError naming ``source``."""
    changes = {k: v for k, v in defaults.items() if not cfg.is_set(k)}
    unknown = sorted(set(changes) - set(EngineConfig.__struct_fields__) | (set(changes) & _NOT_KEYS))
    if unknown:
        raise ConfigError(f"{source}: not config keys: {', '.join(unknown)}")
    if not changes:
        return cfg
    try:
        out = msgspec.convert({**msgspec.structs.asdict(cfg), **changes}, EngineConfig)
        return out.validate()
    except (msgspec.ValidationError, ConfigError) as exc:
        raise ConfigError(f"{source}: {exc}") from exc


def _project_root(start: Path) -> Path | None:
    for parent in (start, *start.parents):
        if (parent / "pyproject.toml").exists():
            return parent
    return None


def resolve_path(value: str, config_dir: Path | None) -> str:
    """Resolve a relative model path the way the official pipeline does."""
    if not value:
        return value
    p = Path(value).expanduser()
    if p.is_absolute():
        return str(p)
    candidates: list[Path] = []
    if config_dir is not None:
        root = _project_root(config_dir)
        if root is not None:
            candidates.append(root / p)
        candidates.append(config_dir / p)
    candidates.append(Path.cwd() / p)
    for c in candidates:
        if c.exists():
            return str(c.resolve())
    return str(candidates[0].resolve())


_WARNED: set[tuple[str, tuple[str, ...]]] = set()  # (file, keys) warned about: a file is read twice


def _warn_unknown(unknown: list[str], known: set[str], source: str) -> None:
    """One warning per file for keys it has that no config has, with the likely key meant."""
    if (source, tuple(unknown)) in _WARNED:
        return
    _WARNED.add((source, tuple(unknown)))
    named = []
    for key in unknown:
        close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
        named.append(f"{key} (did you mean {close[0]}?)" if close else str(key))
    log.warning("%s: ignoring unknown config keys: %s", source, ", ".join(named))


def config_from_dict(data: dict[str, Any], config_dir: Path | None = None, source: str = "") -> EngineConfig:
    known = set(EngineConfig.__struct_fields__) - _NOT_KEYS
    unknown = sorted(set(data) - known)
    if unknown:
        _warn_unknown(unknown, known, source or "config")
    filtered = {k: v for k, v in data.items() if k in known}
    try:
        cfg = msgspec.convert(filtered, EngineConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source or 'config'}: {exc}") from exc
    for key in PATH_KEYS:
        setattr(cfg, key, resolve_path(getattr(cfg, key), config_dir))
    cfg.voices = {k: (resolve_path(v, config_dir) if v else None) for k, v in cfg.voices.items()}
    cfg.source = source
    cfg.explicit_keys = frozenset(filtered)
    return cfg.validate()


def load_config(path: str | Path, **overrides: Any) -> EngineConfig:
    """Load a YAML config (official or streamtts keys); ``overrides`` win over the file."""
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {p}") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read config file {p}: {exc}") from exc
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of config keys, got {type(data).__name__}")
    data.update({k: v for k, v in overrides.items() if v is not None})
    return config_from_dict(data, p.resolve().parent, source=str(p))


def find_model_config(cfg: EngineConfig) -> Path | None:
    """The model's config.json (token ids): explicit key, else next to the weights."""
    if cfg.model_config_json:
        return Path(cfg.model_config_json)
    for base in (cfg.backbone_gguf, cfg.embedding_dir, cfg.tokenizer_dir, cfg.lm_head_dir):
        if not base:
            continue
        p = Path(base)
        for d in (p.parent, p.parent.parent) if p.suffix else (p, p.parent):
            if (d / "config.json").is_file():
                return d / "config.json"
    return None
