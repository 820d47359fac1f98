"""Build the codec decoder's ONNX graphs from a MOSS-Audio-Tokenizer checkpoint, without torch.

``build_decoders(weights_dir, out=..., offline_out=...)`` reads the checkpoint once, layer by
layer, and writes the streaming graph, the offline graph (the official contract), or both
(see :mod:`streamtts.codec.build.graph`). Each file is written atomically (a temporary file
renamed into place; never a torn model) and carries in its metadata the stamp of the
weights and the builder version (:mod:`streamtts.codec.stamp`).

Models over ~1.5 GiB of weights (the published decoder is ~3.5 GB in float32) keep their
weights in a data file next to the ``.onnx`` (``NAME.onnx.<id>.data``: ONNX's protobuf
cannot hold more than 2 GB). The data file gets a fresh name per build, so a crash while
replacing a model leaves the old model with its own data; older data files of the same
model are removed after the new one is in place.

``dtype="float16"`` stores the weight matrices as float16 (half the file) with a Cast to
float32 in front of each: the arithmetic stays float32, only the weights are rounded.
ONNX Runtime folds those casts when it loads the model, so on the CPU the memory in use
and the speed are those of float32.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ..stamp import (
    BUILDER_VERSION,
    KEY_BUILDER,
    KEY_DTYPE,
    KEY_KIND,
    KEY_LAYOUT,
    KEY_STAMP,
    KEY_WEIGHTS,
    weights_stamp,
)
from .arch import CodecArch, load_arch
from .graph import DecoderGraph, ExternalData, GraphBuilder, emit_decoder, import_onnx
from .tensors import DecoderWeights

__all__ = ["BuildResult", "build_decoders", "layout_of", "state_bytes_per_slot", "with_levels"]

log = logging.getLogger(__name__)

DTYPES = ("float32", "float16")
STREAMING_NAME = "decoder_streaming.onnx"
EXTERNAL_OVER = 1536 << 20  # weight bytes above which the weights go to a data file


@dataclass(frozen=True)
class BuildResult:
    streaming: Path | None
    offline: Path | None
    stamp: str
    dtype: str
    arch: CodecArch
    state_bytes_per_slot: int
    seconds: float


def with_levels(arch: CodecArch, n_vq: int | None) -> CodecArch:
    """``arch`` de-quantising its first ``n_vq`` levels only (None: all of them)."""
    if n_vq is None:
        return arch
    have = arch.quantizer.n_q
    if isinstance(n_vq, bool) or not isinstance(n_vq, int) or not 1 <= n_vq <= have:
        raise ConfigError(
            f"codec build: n_vq {n_vq!r} is not one of 1..{have} (the codec's levels, {arch.path})"
        )
    return replace(arch, quantizer=replace(arch.quantizer, n_q=n_vq))


def layout_of(arch: CodecArch) -> dict[str, Any]:
    """What a runtime needs to hold the streaming state (stored in the model's metadata)."""
    return {
        "frame_samples": arch.downsample_rate,
        "sampling_rate": arch.sampling_rate,
        "n_q": arch.quantizer.n_q,
        "codebook_size": arch.quantizer.codebook_size,
        "stages": [
            {
                "layers": s.num_layers,
                "heads": s.num_heads,
                "head_dim": s.head_dim,
                "capacity": s.context,
                "context": s.context,
                "tokens_per_frame": s.tokens_per_frame,
                "rate": s.rate,
            }
            for s in arch.stages
        ],
    }


def state_bytes_per_slot(arch: CodecArch) -> int:
    """float32 K and V rings of every layer of every stage, for one stream."""
    return sum(4 * s.num_layers * 2 * s.d_model * s.context for s in arch.stages)


@dataclass
class _Target:
    kind: str
    path: Path
    data: ExternalData | None
    graph: DecoderGraph


def _open_target(kind: str, path: Path, arch: CodecArch, dtype: str, external: bool) -> _Target:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = None
    if external:
        location = f"{path.name}.{uuid.uuid4().hex[:10]}.data"
        data = ExternalData(path.with_name(f".{location}.tmp"), location)
    g = GraphBuilder(name=f"moss_audio_tokenizer_decoder_{kind}", weight_dtype=dtype, data=data)
    return _Target(kind, path, data, DecoderGraph(arch, kind, g))


def _discard(t: _Target) -> None:
    if t.data is not None:
        t.data.close()
        t.data.path.unlink(missing_ok=True)


def _write(t: _Target, model: Any) -> None:
    """Write the model (and its data file) under temporary names, then rename into place."""
    tmp = t.path.with_name(f".{t.path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as f:
            f.write(model.SerializeToString())
            f.flush()
            os.fsync(f.fileno())
        if t.data is not None:
            t.data.close()
            os.replace(t.data.path, t.path.with_name(t.data.location))
        os.replace(tmp, t.path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        _discard(t)
        raise
    keep = t.data.location if t.data is not None else None
    for old in t.path.parent.glob(f"{t.path.name}.*.data"):
        if old.name != keep:
            old.unlink(missing_ok=True)


@contextmanager
def _progress(enabled: bool, total: int, what: str) -> Iterator[Callable[[str], None]]:
    """A rich progress bar (or nothing); yields ``tick(description)``."""
    if not enabled:
        yield lambda _desc: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
    ) as bar:
        task = bar.add_task(what, total=total)
        yield lambda desc: bar.update(task, advance=1, description=desc)


def build_decoders(
    weights: str | Path,
    *,
    out: str | Path | None = None,
    offline_out: str | Path | None = None,
    streaming: bool = True,
    dtype: str = "float32",
    progress: bool = False,
    external: bool | None = None,
    n_vq: int | None = None,
) -> BuildResult:
    """Build the streaming graph (``out``, default ``WEIGHTS/decoder_streaming.onnx``) and,
    when ``offline_out`` is given, the offline graph, from the checkpoint in ``weights``.

    ``external`` forces (True) or forbids (False) a separate weights data file; by default
    it is used above ~1.5 GiB of weights. ``n_vq``: the codebooks the graphs take (the
    model's n_vq), the codec's first ``n_vq`` levels: what the official decode with
    ``n_quantizers = n_vq`` computes (the streaming graph has no n_quantizers input and
    sums every level it has; the offline one keeps the input, over its n_vq levels).
    Default: all the checkpoint's levels.
    """
    t0 = time.monotonic()
    if dtype not in DTYPES:
        raise ConfigError(f"codec build dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    folder = Path(weights)
    if not streaming and offline_out is None:
        raise ConfigError("codec build: nothing to build (no streaming graph and no offline_out)")
    arch = with_levels(load_arch(folder), n_vq)
    weight_bytes = arch.params * (2 if dtype == "float16" else 4)
    if external is None:
        external = weight_bytes > EXTERNAL_OVER
    jobs: list[tuple[str, Path]] = []
    if streaming:
        jobs.append(("streaming", Path(out) if out is not None else folder / STREAMING_NAME))
    if offline_out is not None:
        jobs.append(("offline", Path(offline_out)))
    log.info("codec build: %s from %s (%s)", arch.describe(), folder, dtype)

    with DecoderWeights(folder, arch) as w:  # checks every tensor before anything is built
        stamp = weights_stamp(folder)
        targets: list[_Target] = []
        try:
            for kind, path in jobs:
                targets.append(_open_target(kind, path, arch, dtype, external))
            n_layers = sum(s.num_layers for s in arch.stages)
            names = " + ".join(p.name for _, p in jobs)
            with _progress(progress, n_layers + 1 + len(targets), f"building {names}") as tick:
                emit_decoder(arch, [t.graph for t in targets], w, lambda: tick(f"building {names}"))
                for t in targets:
                    meta = {
                        KEY_KIND: t.kind,
                        KEY_BUILDER: str(BUILDER_VERSION),
                        KEY_STAMP: stamp,
                        KEY_WEIGHTS: str(folder.resolve()),
                        KEY_DTYPE: dtype,
                        KEY_LAYOUT: json.dumps(layout_of(arch)),
                    }
                    doc = f"MOSS-Audio-Tokenizer decoder ({t.kind}), built by streamtts from {folder.name}"
                    model = t.graph.finish(meta, doc)
                    if t.data is None:
                        import_onnx().checker.check_model(model)
                    tick(f"writing {t.path.name}")
                    _write(t, model)
                    del model
        except BaseException:
            for t in targets:
                _discard(t)
            raise
    paths = {kind: path for kind, path in jobs}
    result = BuildResult(
        streaming=paths.get("streaming"),
        offline=paths.get("offline"),
        stamp=stamp,
        dtype=dtype,
        arch=arch,
        state_bytes_per_slot=state_bytes_per_slot(arch),
        seconds=time.monotonic() - t0,
    )
    log.info(
        "codec build: wrote %s in %.1f s (state per stream slot %.1f MB)",
        ", ".join(str(p) for _, p in jobs),
        result.seconds,
        result.state_bytes_per_slot / 1e6,
    )
    return result
