"""Assemble a running engine from a config: backbone, tables, codec, threads."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ..config import EngineConfig, find_model_config, with_defaults
from ..core.family import DEFAULT_KIND, F16_OVERFLOW, MEMBERS, Member, load_bundle_member, member
from ..core.tokens import TokenIds, load_token_ids
from ..errors import ConfigError, InputError, ModelFileError
from .backbone_calls import BackboneFactory, BackboneLike
from .decoding import DecodeWorker, StreamingCodec, WindowedCodec
from .loop import EngineCore
from .prepare import Preparer
from .priority import thread_ids
from .turns import CoreTurns

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    config: EngineConfig  # the config it runs with: the model's defaults where the user set none
    ids: TokenIds
    backbone: BackboneLike
    decoder: DecodeWorker
    core: EngineCore
    preparer: Preparer
    info: dict[str, Any] = field(default_factory=dict)


def _require(cfg: EngineConfig, key: str, kind: str) -> str:
    value = getattr(cfg, key)
    if not value:
        raise ConfigError(f"config key {key!r} is empty (expected the path to {kind})")
    p = Path(value)
    if not p.exists():
        raise ModelFileError(p, kind, f"set by {key!r}, not found")
    return str(p)


def gguf_hparams(path: Path) -> dict[str, int]:
    """Shape numbers from a GGUF header (without loading the model)."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()

    def get(key: str, default: int = 0) -> int:
        f = r.fields.get(f"{arch}.{key}")
        return int(f.parts[-1][0]) if f is not None else default

    n_embd = get("embedding_length")
    n_head = get("attention.head_count", 1)
    head_dim = get("attention.key_length", n_embd // max(n_head, 1))
    return {
        "n_embd": n_embd,
        "n_layer": get("block_count"),
        "n_head_kv": get("attention.head_count_kv", n_head),
        "key_length": head_dim,
        "value_length": get("attention.value_length", head_dim),
    }


def gguf_n_embd(path: Path) -> int:
    return gguf_hparams(path)["n_embd"]


_KV_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q5_1": 24 / 32, "q5_0": 22 / 32, "q4_1": 20 / 32, "q4_0": 18 / 32}


def kv_bytes_per_cell(hp: dict[str, int], type_k: str, type_v: str) -> float:
    """KV cache bytes for one token of one sequence, all layers."""
    per_layer = hp["n_head_kv"] * (
        hp["key_length"] * _KV_BYTES.get(type_k.lower(), 2.0) + hp["value_length"] * _KV_BYTES.get(type_v.lower(), 2.0)
    )
    return hp["n_layer"] * per_layer


def _model_name(cfg: EngineConfig, gguf: str) -> dict[str, Any]:
    """``model``: what a person would call it (the page shows it); ``demo``: whether it is the
    synthetic demo model, which speaks in tones, not words."""
    from ..model.files import demo_marker

    marker = demo_marker(cfg.source) if cfg.source else None
    if marker is None:
        return {"model": Path(gguf).name, "demo": False}
    preset = marker.get("preset", {}).get("name", "?")
    return {"model": f"streamtts demo model ({preset}, random weights)", "demo": True}


def model_member(config_json: Path | None) -> Member:
    """The family member the model's config.json names (``model_kind``, written by
    ``convert-hf``); moss-tts when it names none (older bundles, the demo model)."""
    kind = DEFAULT_KIND
    if config_json is not None:
        try:
            data = json.loads(Path(config_json).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            data = None  # load_token_ids reads the same file and says what is wrong with it
        if isinstance(data, dict) and isinstance(data.get("model_kind"), str):
            kind = data["model_kind"]
    try:
        return member(kind)
    except InputError as exc:  # here the model's file is at fault, not a request
        raise ModelFileError(Path(str(config_json)), "a known model_kind", str(exc)) from exc


_busy_said = False  # the busy-cores warning was given


def _auto_threads() -> int:
    """``n_threads: 0``: the idle physical cores (model/threads.py says why), with a warning
    when that is fewer than the machine has."""
    from ..model.threads import auto_threads

    global _busy_said
    c = auto_threads()
    if c.reduced:
        if not _busy_said:  # once a process (a server's engines, a benchmark's runs)
            _busy_said = True
            log.warning(
                "%.1f of %d cores are busy with other processes: llama.cpp uses %d thread(s) "
                "(--n-threads sets it)", c.busy_elsewhere, c.physical_cores, c.threads,
            )  # fmt: skip
    else:
        log.info("n_threads auto: %d (other processes busy on %.1f cores)", c.threads, c.busy_elsewhere)
    return int(c.threads)


def fused_heads(cfg: EngineConfig, ids: TokenIds) -> str:
    """The GGUF whose output layer holds only the rows the engine reads (found, or written
    now on first load), or "" for the plain backbone. Why and which kind: on a GPU the audio
    heads join the backbone's graph (f16 rows: a single-row CUDA matmul does not round the
    f32 activations; half the memory). On CPU the output layer keeps only the gen/delay text
    rows, in the backbone's own type, and the audio heads stay one NumPy matmul: the plain
    backbone computes its whole text head (151936 rows) every step and for every prompt row,
    while llama.cpp computes the 2 kept rows exactly as it computes them in the full head
    and NumPy the audio logits as the official pipeline does, so greedy codes stay those of
    the official algorithm. (Audio rows in llama.cpp on CPU, even f32, change the codes of a
    quantized model: it quantizes the activations for the text rows, and a prompt whose last
    row alone is output takes other kernels in the last layer.)"""
    from ..model.files import model_files
    from ..model.fused import AudioDtype, find_fused_gguf

    if cfg.heads_backend not in ("auto", "fused"):
        return ""
    gpu = _layers_on_gpu(cfg)
    dtype: AudioDtype = "f16" if gpu else ("f32" if cfg.heads_backend == "fused" else "text")
    if not cfg.fuse_on_load:  # off: only a file the user made (fused_gguf, streamtts convert)
        return find_fused_gguf(cfg, ids)
    if cfg.fused_gguf:
        return find_fused_gguf(cfg, ids, auto_dtype=dtype)
    return model_files().fused_gguf(cfg, ids, dtype)  # written by the tooling (streamtts/files.py)


def _take_turns(cfg: EngineConfig, codec: StreamingCodec | WindowedCodec, on_gpu: bool) -> bool:
    """codec_turns: auto = when the backbone and the codec both compute on the CPU."""
    if cfg.codec_turns != "auto":
        return cfg.codec_turns == "always"
    if on_gpu:
        return False
    if isinstance(codec, StreamingCodec):
        return codec.decoder.device == "cpu"
    # ONNX Runtime on the CPU (a stand-in codec has no decoder)
    return getattr(getattr(codec, "decoder", None), "provider", None) == "CPUExecutionProvider"


def _layers_on_gpu(cfg: EngineConfig) -> bool:
    """The layers will run on a GPU backend: a CUDA or Vulkan build with a device besides the
    CPU, and n_gpu_layers not 0 (decided before the load picks its file; the load's own
    report, Backbone.placement, is checked against it in build_runtime)."""
    from ..errors import NativeLibraryError
    from ..model import _llama

    if cfg.n_gpu_layers == 0:
        return False
    try:
        if _llama.loaded_backend() not in ("cuda", "vulkan"):
            return False
        return any(d["type"] != "cpu" for d in _llama.devices())
    except NativeLibraryError:
        return False  # the backbone reports the missing library when it loads


def _member_defaults(cfg: EngineConfig, mc: Path | None) -> tuple[EngineConfig, str | None]:
    """The bundle's member (config.json ``model_kind``, None when it names none) and ``cfg``
    with that member's sampling defaults for the keys the user's config did not set."""
    member = load_bundle_member(mc)
    if not member.sampling:
        return cfg, member.kind
    out = with_defaults(cfg, member.sampling, source=f"{mc} (sampling)")
    taken = [k for k in member.sampling if not cfg.is_set(k)]
    log.info(
        "model %s: sampling defaults from %s for %s%s", member.kind or "?", mc,
        ", ".join(taken) or "no key", " (the config sets the others)" if len(taken) < len(member.sampling) else "",
    )  # fmt: skip
    return out, member.kind


def _check_compute_type(gguf: Path, kind: str) -> None:
    """A member whose activations overflow float16 (``Member.f16_overflows``) refuses a GGUF
    whose layer matrices are F16: llama.cpp would compute their products in float16 (NaN)."""
    from gguf import GGMLQuantizationType, GGUFReader

    m = MEMBERS.get(kind)
    if m is None or not m.f16_overflows:
        return
    try:
        reader = GGUFReader(str(gguf))
    except Exception as exc:  # gguf raises ValueError/struct errors; the load reports it better
        log.debug("%s: not read for its tensor types (%s)", gguf, exc)
        return
    f16 = [t.name for t in reader.tensors if t.name.startswith("blk.") and t.tensor_type == GGMLQuantizationType.F16]
    if f16:
        raise ModelFileError(
            gguf, f"a {m.title} backbone whose layers are not F16",
            f"{len(f16)} layer matrices are F16 ({f16[0]}, ...); {F16_OVERFLOW}",
        )


def build_runtime(
    cfg: EngineConfig,
    backbone_factory: BackboneFactory | None = None,
    codec_factory: Callable[[EngineConfig, TokenIds], Any] | None = None,
) -> Runtime:
    """The engine's parts from ``cfg``; the factories put stand-ins in the backbone's or the
    codec's place (``streamtts bench --null-backbone / --null-codec``)."""
    from threadpoolctl import threadpool_limits

    from ..codec import load_decoder, load_encoder, load_streaming_decoder
    from ..core.prompt import HFTokenizer
    from ..kernels import Kernels
    from ..model import _llama
    from ..model.backbone import Backbone, BackboneParams
    from ..model.tables import AudioHeads, Embedder

    if cfg.audio_backend == "torch":
        raise ConfigError("audio_backend 'torch' is not supported (streamtts serves without PyTorch): use onnx or trt")
    if cfg.blas_threads > 0:
        threadpool_limits(limits=cfg.blas_threads, user_api="blas")
    _llama.use_backend(cfg.backend)  # before anything loads the bridge
    mc = find_model_config(cfg)
    ids = load_token_ids(mc)
    cfg, kind = _member_defaults(cfg, mc)
    # explicit fused_gguf, else one found or written next to the backbone (fused_heads)
    from ..model.fused import read_fused_info

    if kind is not None and cfg.backbone_gguf and Path(cfg.backbone_gguf).is_file():
        _check_compute_type(Path(cfg.backbone_gguf), kind)  # before a fused file is made from it
    fused_path = fused_heads(cfg, ids)
    if fused_path and not cfg.fused_gguf:
        gguf = fused_path
    else:
        gguf = _require(cfg, "fused_gguf" if fused_path else "backbone_gguf", "a Qwen3 GGUF backbone")
    if kind is not None:
        _check_compute_type(Path(gguf), kind)
    # audio heads in llama.cpp's graph, or in NumPy (plain backbone, or a text-rows-only file)
    fused = bool(fused_path) and read_fused_info(gguf).has_audio
    if cfg.heads_backend == "fused" and not fused:
        raise ConfigError("heads_backend 'fused' needs fused_gguf (write one with `streamtts convert`)")
    _require(cfg, "embedding_dir", "the embeddings folder (embed_tokens.npy, emb_ext_XX.npy)")
    _require(cfg, "tokenizer_dir", "the tokenizer folder (tokenizer.json)")
    if not fused:
        _require(cfg, "lm_head_dir", "the LM heads folder (lm_head_audio_XX.npy)")
    threads = cfg.n_threads if cfg.n_threads > 0 else _auto_threads()
    streams = cfg.max_streams
    on_gpu = _layers_on_gpu(cfg)
    params = BackboneParams(
        model_path=gguf,
        n_ctx=cfg.n_ctx * streams,
        n_batch=max(cfg.n_batch, streams),
        n_seq_max=streams,
        n_threads=threads,
        n_gpu_layers=cfg.n_gpu_layers,
        type_k=cfg.kv_cache_type_k,
        type_v=cfg.kv_cache_type_v,
        flash_attn=str(cfg.flash_attn).lower(),
        thread_poll=None if cfg.thread_poll < 0 else cfg.thread_poll,
        pin_threads=cfg.pin_threads and not on_gpu,  # the layers on a GPU: its threads do little
    )
    tokenizer = HFTokenizer(cfg.tokenizer_dir)
    if cfg.log_llama and backbone_factory is None:
        _llama.set_llama_log(True)
    backbone = (backbone_factory or Backbone)(params)
    heads: AudioHeads | None = None
    try:
        placement = getattr(backbone, "placement", None)
        if placement is not None and placement.on_gpu != on_gpu:
            log.warning(
                "llama.cpp put the layers %s, not %s as the engine expected: %s",
                "on a GPU" if placement.on_gpu else "on the CPU",
                "on a GPU" if on_gpu else "on the CPU", placement.line(),
            )  # fmt: skip
        cols = [ids.gen_slot, ids.delay_slot]
        if fused_path:
            from ..model.fused import fused_columns

            backbone.set_logit_columns(np.asarray(fused_columns(backbone, ids, path=gguf), dtype=np.int32))
        else:
            if backbone.n_vocab <= max(cols):
                raise ModelFileError(
                    gguf, f"an output layer with at least {max(cols) + 1} rows (the text head)", f"it has {backbone.n_vocab}"
                )
            backbone.set_logit_columns(np.asarray(cols, dtype=np.int32))
        embedder = Embedder(cfg.embedding_dir, ids, n_embd=backbone.n_embd)
        heads = None if fused else AudioHeads(cfg.lm_head_dir, ids, backbone.n_embd, threads=cfg.heads_threads or threads)
        before = thread_ids()  # the codec's runtime starts its worker threads on load
        codec = codec_factory(cfg, ids) if codec_factory else _codec(cfg, ids, load_decoder, load_streaming_decoder)
        codec_threads = frozenset(thread_ids() - before)
        turns = CoreTurns(_take_turns(cfg, codec, on_gpu=on_gpu))
        worker = DecodeWorker(codec, nice=cfg.codec_nice, codec_threads=codec_threads, turns=turns)
        kernels = Kernels.from_config(cfg)  # the one choice of spec or compiled twin per kernel
        core = EngineCore(cfg, ids, backbone, embedder, heads, worker, kernels=kernels, fused_heads=fused)
    except BaseException:
        if heads is not None:
            heads.close()  # its helper threads
        backbone.close()
        raise
    fam = model_member(mc)
    preparer = Preparer(cfg, ids, tokenizer, embedder, lambda: load_encoder(cfg, ids.n_vq), backbone.n_ctx_seq, fam)
    if cfg.warmup:
        worker.warm_up()
    worker.start()
    core.start()
    hp = gguf_hparams(Path(gguf))
    kv_stream = kv_bytes_per_cell(hp, cfg.kv_cache_type_k, cfg.kv_cache_type_v) * backbone.n_ctx_seq
    info = {
        **_model_name(cfg, gguf),
        "backbone": gguf,
        "model_kind": fam.kind,
        "n_vq": ids.n_vq,
        **(placement.info() if placement is not None else {}),
        # which ggml CPU kernels run: libggml-cpu.so (native/build.sh) or the variant the wheel's
        # runtime dispatch picked, e.g. libggml-cpu-haswell.so
        **({"cpu_backend": _llama.cpu_backend()} if placement is not None else {}),
        "kv_cache_mib_per_stream": round(kv_stream / 2**20, 1),
        "kv_cache_mib_total": round(kv_stream * streams / 2**20, 1),
        "heads": "fused (llama.cpp)" if fused else ("numpy (text rows only in llama.cpp)" if fused_path else "numpy"),
        "n_embd": backbone.n_embd,
        "max_streams": streams,
        "n_ctx_per_stream": backbone.n_ctx_seq,
        "threads": threads,
        "model_config": str(mc) if mc else "defaults",
        "sampling": msgspec.structs.asdict(cfg.sampling),
        "sampler": cfg.kernels if isinstance(cfg.kernels, str) else cfg.sampler,
        "kernels": core.kernels.describe(),
        "tick_threads": core.kernels.threads if core.kernels.pool is not None else 1,
        # where a step reads its logits: "lent" (where llama.cpp left them; fused heads) or
        # "copied" (out of llama.cpp's buffer into the engine's, every step)
        "logits": "lent" if core.lend_logits else "copied",
        "codec": worker.codec.kind,
        "codec_turns": worker.turns.enabled,
        "codec_state_mib_per_stream": _codec_state_mib(worker),
        "decode_context_frames": (
            worker.codec.context_frames if isinstance(worker.codec, WindowedCodec) else cfg.decode_context_frames
        ),
    }
    log.info(
        "engine ready: %s (%s); backbone on %s; %s heads, %d streams x %d KV cells (%.1f MiB each, "
        "%.1f MiB total), %d threads, codec %s", fam.title, fam.kind,
        placement.line() if placement is not None else "?", info["heads"], streams, backbone.n_ctx_seq, info["kv_cache_mib_per_stream"],
        info["kv_cache_mib_total"], threads, _codec_line(worker, cfg),
    )
    return Runtime(config=cfg, ids=ids, backbone=backbone, decoder=worker, core=core, preparer=preparer, info=info)


def build_codec(cfg: EngineConfig, ids: TokenIds) -> StreamingCodec | WindowedCodec:
    """The codec an engine with this config decodes with (benchmarks time it bare)."""
    from ..codec import load_decoder, load_streaming_decoder

    return _codec(cfg, ids, load_decoder, load_streaming_decoder)


def _codec(
    cfg: EngineConfig,
    ids: TokenIds,
    load_decoder: Callable[[EngineConfig, int], Any],
    load_streaming: Callable[[EngineConfig, int, int], Any],
) -> StreamingCodec | WindowedCodec:
    """The exact stateful decoder when there is one (one slot per stream), else windows;
    either for the model's n_vq codebooks."""
    streaming = load_streaming(cfg, cfg.max_streams, ids.n_vq)
    if streaming is not None:
        return StreamingCodec(streaming, ids.n_vq)
    decoder = load_decoder(cfg, ids.n_vq)
    context = cfg.decode_context_frames
    reach = getattr(decoder, "receptive_frames", None)
    if reach is not None and reach - 1 < context:
        # left context beyond the decoder's declared reach changes no sample, only costs
        log.info("codec: %d frames of left context are enough (receptive field %d)", reach - 1, reach)
        context = reach - 1
    return WindowedCodec(decoder, ids.n_vq, context)


def _codec_state_mib(worker: DecodeWorker) -> float:
    codec = worker.codec
    if isinstance(codec, StreamingCodec):
        return round(codec.decoder.state_bytes_per_slot / 2**20, 1)
    return 0.0


def _codec_line(worker: DecodeWorker, cfg: EngineConfig) -> str:
    codec = worker.codec
    if isinstance(codec, StreamingCodec):
        dec = codec.decoder
        return (
            f"streaming (exact; {dec.path.name} on the {dec.device.upper()}, state "
            f"{dec.state_bytes_per_slot / 2**20:.1f} MiB per stream x {dec.n_slots} slots)"
        )
    if not isinstance(codec, WindowedCodec):
        return f"{codec.kind} (a stand-in: no decoding)"
    ctx = codec.context_frames
    return (
        f"windowed ({ctx} frames of left context; for exact, cheaper "
        f"streaming build decoder_streaming.onnx with `streamtts codec build`)"
    )
