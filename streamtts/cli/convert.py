"""``streamtts convert | convert-hf | download``: the model files, written or fetched.

Handlers print (this is CLI output); the work is in ``streamtts/convert/``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from ..core.family import MEMBERS
from ..errors import ConfigError, UsageError
from .common import load_config_or_demo


def add_parser(sub: Any) -> None:
    c = sub.add_parser(
        "convert",
        help="write a fused-heads GGUF (head logits computed by llama.cpp in the backbone's graph)",
    )
    c.add_argument(
        "--config", help="YAML config: takes backbone_gguf and lm_head_dir from it; default: the "
        "demo model (unless --gguf and --lm-heads are given)",
    )  # fmt: skip
    c.add_argument("--gguf", help="source backbone GGUF (default: the config's backbone_gguf)")
    c.add_argument(
        "--lm-heads", help="folder with lm_head_audio_XX.npy (default: the config's lm_head_dir)"
    )
    c.add_argument(
        "--out", help="output file (default: <backbone>.fused.gguf, picked up automatically)"
    )
    c.add_argument(
        "--include-text-head", action="store_true", help="also append the full text head"
    )
    c.add_argument(
        "--audio-dtype", choices=["f16", "f32", "text"], default="f16",
        help="type of the fused output layer: f16 (as published, half the memory) or f32 "
        "(llama.cpp's CPU matmul then keeps the hidden state in f32, like the NumPy heads); "
        "text: no audio rows, only the gen/delay rows in the backbone's own type (what the "
        "engine writes for itself on CPU; the audio heads stay in NumPy)",
    )  # fmt: skip
    c.add_argument(
        "--text-source", choices=["gguf", "npy"], default="gguf",
        help="gen/delay text rows from the GGUF's output layer (default; what the NumPy-heads "
        "engine uses) or from lm_head_text.npy",
    )  # fmt: skip
    c.set_defaults(handler=_convert, check=_check_convert)

    d = sub.add_parser("download", help="download the official weights, check them, write a config")
    d.add_argument(
        "--dest", default="weights", help="folder for both repositories and streamtts.yaml"
    )
    d.add_argument("--quant", default="Q4_K_M", help="backbone quant: Q4_K_M, Q5_K_M, Q6_K or Q8_0")
    d.add_argument("--from-dir", help="copy from a local folder laid out like the hub repositories")
    d.add_argument("--revision", help="hub revision (branch, tag or commit)")
    d.add_argument(
        "--no-text-head",
        action="store_true",
        help="skip lm_head_text.npy (1.2 GB; read only outside audio mode)",
    )
    d.add_argument("--no-codec", action="store_true", help="skip the codec repository")
    d.add_argument(
        "--no-streaming-codec",
        action="store_true",
        help="skip the codec checkpoint and the exact streaming decoder built from it "
        "(the engine then decodes in windows)",
    )
    d.add_argument(
        "--fuse", action="store_true", help="also write the fused-heads GGUF (streamtts convert)"
    )
    d.add_argument(
        "--cpu", action="store_true", help="write a CPU config even when a GPU is visible"
    )
    d.set_defaults(handler=_download)
    _add_convert_hf(sub)


def _check_convert(args: argparse.Namespace) -> None:
    from .common import check_config, check_input_file, check_output_file

    check_config(args)
    check_input_file(args.gguf, "--gguf")
    if args.lm_heads is not None and not Path(args.lm_heads).is_dir():
        raise UsageError(f"--lm-heads {args.lm_heads}: no such folder")
    check_output_file(args.out, "--out", audio=False)


def _convert(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    from ..convert.fused_writer import convert
    from ..model.fused import config_line

    cfg = load_config_or_demo(args.config, demo=not (args.gguf and args.lm_heads))
    src = args.gguf or (cfg.backbone_gguf if cfg else "")
    heads: Any = args.lm_heads or cfg
    if not src or heads is None:
        raise ConfigError("streamtts convert needs --config, or --gguf and --lm-heads")
    if args.lm_heads and cfg is not None:
        heads = args.lm_heads
    t0 = time.monotonic()
    console = _stderr_console()
    with Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
        transient=True, console=console, disable=not console.is_terminal,  # no blank line in a log
    ) as prog:  # fmt: skip
        task = prog.add_task("writing", total=None)

        def progress(name: str, done: int, total: int) -> None:
            prog.update(task, completed=done, total=total, description=f"writing {name}")

        info = convert(
            src, heads, args.out, include_text_head=args.include_text_head,
            audio_dtype=args.audio_dtype, text_source=args.text_source, progress=progress,
        )  # fmt: skip
    print(
        f"wrote {info.path}: {info.rows} output rows ({info.dtype}; text rows from {info.text_source}"
        f"{', full text head' if info.has_text_head else ''}) in {time.monotonic() - t0:.1f} s"
    )
    if not args.config and not args.gguf:  # the demo model: no config file of the user's to edit
        print(
            "the demo model needs none of this: it writes its own fused heads on first load and "
            f"finds them (a config of your own would take `{config_line(info.path, src)}`)"
        )
        return 0
    print("add to your config:")
    print(f"  {config_line(info.path, src)}")
    return 0


def _stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def _download(args: argparse.Namespace) -> int:
    from ..convert.download import download

    streaming = not args.no_codec and not args.no_streaming_codec
    cfg, rep = download(
        args.dest, args.quant, from_dir=args.from_dir, revision=args.revision,
        text_head=not args.no_text_head, codec=not args.no_codec, codec_checkpoint=streaming,
        fuse=args.fuse, gpu=False if args.cpu else None,
    )  # fmt: skip
    print(f"weights checked ({rep.quant}, hidden size {rep.n_embd}): {Path(args.dest).resolve()}")
    if streaming:
        _build_streaming_codec(Path(args.dest))
    print(f"config: {cfg}")
    print(f"try it: streamtts synth --config {cfg} --text 'Hello there.' --out hello.wav")
    return 0


def _build_streaming_codec(dest: Path) -> None:
    """decoder_streaming.onnx beside decoder.onnx, from the fetched checkpoint (the engine
    picks it up there); skipped when it is already built from these weights."""
    from ..codec.build.decoders import build_decoders
    from ..codec.stamp import weights_stamp
    from ..convert.download import CODEC_CKPT_DIR, CODEC_DIR

    ckpt = dest / CODEC_CKPT_DIR
    if not (ckpt / "config.json").is_file():
        print("codec: no checkpoint, so no streaming decoder: the engine decodes in windows")
        return
    out = dest / CODEC_DIR / "decoder_streaming.onnx"
    if out.is_file() and _stamp_of(out) == weights_stamp(ckpt):
        print(f"codec: {out} is up to date")
        return
    res = build_decoders(ckpt, out=out, progress=sys.stderr.isatty())
    print(
        f"codec: built {out} in {res.seconds:.0f} s (exact streaming; "
        f"{res.state_bytes_per_slot / 2**20:.0f} MiB of state per stream)"
    )


def _stamp_of(path: Path) -> str:
    import onnx

    from ..codec.stamp import KEY_STAMP

    model = onnx.load(str(path), load_external_data=False)
    return next((p.value for p in model.metadata_props if p.key == KEY_STAMP), "")


def _add_convert_hf(sub: Any) -> None:
    c = sub.add_parser(
        "convert-hf",
        help="convert the original MOSS-TTS-Delay checkpoint into the published GGUF bundle (no torch)",
    )
    c.add_argument("src", help="checkpoint folder (config.json, model*.safetensors, tokenizer) or hub id")
    c.add_argument("--out", required=True, help="bundle folder (MOSS_TTS_<QUANT>.gguf, embeddings/, lm_heads/, ...)")
    c.add_argument(
        "--quant", action="append",
        help="GGUF type to write, repeatable: Q4_K_M (default), Q5_K_M, Q6_K, Q8_0, F16, BF16, F32 "
        "(the bf16 weights exactly), ...; the first is the config's",
    )  # fmt: skip
    c.add_argument(
        "--model-kind", choices=list(MEMBERS),
        help="the family member (default: read from SRC's name, else moss-tts with a warning); the "
        "bundle's config.json names it and carries its sampling defaults",
    )  # fmt: skip
    c.add_argument("--fused", action="store_true", help="also write the fused-heads GGUF (streamtts convert) of the first --quant")
    c.add_argument("--keep-f16", action="store_true", help="keep the F16 GGUF the quantizer reads")
    c.add_argument("--threads", type=int, default=0, help="llama.cpp quantizer threads (0: all cores)")
    c.add_argument("--revision", help="hub revision when SRC is a hub id")
    c.set_defaults(handler=_convert_hf)


def _convert_hf(args: argparse.Namespace) -> int:
    from ..convert.hf import convert_hf, rich_progress

    with rich_progress() as progress:
        res = convert_hf(
            args.src, args.out, args.quant or ["Q4_K_M"], fused=args.fused, keep_f16=args.keep_f16,
            n_threads=args.threads, revision=args.revision, progress=progress,
            model_kind=args.model_kind,
        )  # fmt: skip
    print(
        f"wrote {len(res.written)} file(s) into {res.out_dir} in {res.seconds:.1f} s "
        f"({len(res.skipped)} already there); model {res.model_kind}; config: {res.config_yaml}"
    )
    return 0
