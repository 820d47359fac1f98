"""``streamtts synth | speak``: text to a file, or to the speakers as it is generated."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from ..config import SamplingParams
from ..constants import SAMPLE_RATE
from ..errors import PlaybackError, UsageError
from .common import (
    add_model_args,
    check_config,
    check_output_device,
    check_output_file,
    check_sampling,
    check_text,
    check_text_length,
    check_voice,
    demo_notice,
    env_device,
    load_voice,
    no_device_fallback,
    positive_int,
    read_lexicon,
    save_instead,
    speaker_arg,
    speaker_text_arg,
    stdin_piped,
    time_left,
    wrote,
)

log = logging.getLogger("streamtts")

SAMPLING_FLAGS = (
    ("--text-temperature", float, "text_temperature", "text-channel temperature (0 = greedy); default: the config's"),
    ("--text-top-k", int, "text_top_k", "text-channel top-k; default: the config's"),
    ("--text-top-p", float, "text_top_p", "text-channel top-p; default: the config's"),
    ("--audio-temperature", float, "audio_temperature", "audio-codebook temperature (0 = greedy); default: the config's"),
    ("--audio-top-k", int, "audio_top_k", "audio-codebook top-k; default: the config's"),
    ("--audio-top-p", float, "audio_top_p", "audio-codebook top-p; default: the config's"),
    ("--audio-repetition-penalty", float, "audio_repetition_penalty", "per-codebook repetition penalty (1 = off); default: the config's"),
)  # fmt: skip



def _add_request_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--reference", metavar="FILE",
        help="reference voice to clone: a clip (wav/flac/ogg, 0.5-30 s) or a .npy of (T, n_vq) codes",
    )  # fmt: skip
    p.add_argument(
        "--speaker", action="append", type=speaker_arg, metavar="S1=FILE", default=[],
        help="a dialogue's voice for the text's [S1] (repeat: --speaker S2=bob.wav ...); a clip or a .npy of codes",
    )  # fmt: skip
    p.add_argument(
        "--reference-codes", action="append", metavar="F.npy", default=[],
        help="a pre-encoded voice, (T, n_vq) codes; repeat for a dialogue, in speaker order ([S1], [S2], ...)",
    )  # fmt: skip
    p.add_argument(
        "--voice", metavar="NAME",
        help="a voice by name: the config's voices (`streamtts voices` lists them), or an upload's name "
        "in the shared voice store ($STREAMTTS_VOICE_STORE); default: the model's own voice",
    )  # fmt: skip
    p.add_argument("--prefix", metavar="FILE", help="audio to continue (a clip or a .npy of codes)")
    p.add_argument("--prefix-codes", metavar="F.npy", help="pre-encoded audio to continue, (T, n_vq) codes")
    p.add_argument("--prefix-text", help="the --prefix audio's transcript (spoken before --text, as the official app does)")
    p.add_argument(
        "--speaker-text", action="append", type=speaker_text_arg, metavar="S1=TEXT", default=[],
        help="what --speaker S1's clip says: continue the speakers' own clips (MOSS-TTSD's app; "
        "their clips joined are the prefix, their transcripts go before --text); repeat per speaker",
    )  # fmt: skip
    p.add_argument(
        "--language",
        help="language for the prompt: an ISO code or a name (en, English, zh, ...); sent in the model's own form",
    )  # fmt: skip
    p.add_argument("--instruction", help="instruction for the prompt (VoiceGenerator: the voice described)")
    p.add_argument("--quality", help="the prompt's quality field")
    p.add_argument("--ambient-sound", help="ambient sound to generate (SoundEffect); the text may then be empty")
    p.add_argument("--sound-event", help="the prompt's sound event field (SoundEffect)")
    p.add_argument("--scene", help="refused: no member's template writes a scene (MOSS-TTSD's writes Scene: None)")
    p.add_argument("--tokens", type=positive_int, help="desired duration in audio frames (12.5 per second)")
    p.add_argument("--seed", type=int, help="sampling seed (reproducible per request); default: random")
    p.add_argument("--max-new-tokens", type=positive_int, help="generation steps at most; default: the config's")
    for flag, typ, _, text in SAMPLING_FLAGS:
        p.add_argument(flag, type=typ, help=text)
    p.add_argument("--greedy", action="store_true", help="both temperatures 0")
    p.add_argument("--no-normalize", action="store_true", help="skip text normalisation")
    p.add_argument(
        "--lexicon", metavar="FILE.json",
        help='a pronunciation lexicon: a JSON object {"word or phrase": "how to read it", ...}, applied '
        "after normalisation (whole words; a lower-case key matches any case; docs/protocol.md)",
    )  # fmt: skip
    p.add_argument("--profile", action="store_true", help="print per-stage timings and stream numbers")




# -- shared by synth and speak ----------------------------------------------------------------
def _engine(args: argparse.Namespace) -> Any:
    from ..engine.frontend import Engine

    demo_notice(args)
    return Engine.from_config(args.config, max_streams=args.max_streams, n_threads=args.n_threads)


def _options(args: argparse.Namespace, engine: Any) -> Any:
    """The request's options from the flags: each prompt field's flag has its name
    (request/fields.py; a field with no flag is left unset), the sampling flags change the
    config's sampling."""
    from ..request import PROMPT_FIELDS, StreamOptions

    base = engine.config.sampling
    changes = {name: getattr(args, name) for _, _, name, _ in SAMPLING_FLAGS if getattr(args, name) is not None}
    if args.greedy:
        changes.update(text_temperature=0.0, audio_temperature=0.0)
    sampling: SamplingParams = msgspec.structs.replace(base, **changes)
    prompt: dict[str, Any] = {f: getattr(args, f, None) for f in PROMPT_FIELDS}
    return StreamOptions(
        **prompt,
        seed=args.seed,
        sampling=sampling,
        max_new_tokens=args.max_new_tokens,
        normalize=False if args.no_normalize else None,
        lexicons=() if getattr(args, "lexicon_read", None) is None else (args.lexicon_read,),
    )


def _codes_flags(args: argparse.Namespace) -> None:
    """--reference-codes / --prefix-codes as the --reference, --speaker and --prefix they are:
    one set of codes is the voice, several are the speakers [S1], [S2], ... in order."""
    for path in [*args.reference_codes, *([args.prefix_codes] if args.prefix_codes else [])]:
        if not path.lower().endswith(".npy"):
            raise UsageError(f"{path}: --reference-codes and --prefix-codes take a .npy of (T, n_vq) codes")
    if args.reference_codes:
        if args.reference or args.speaker:
            raise UsageError("--reference-codes and --reference/--speaker: give the voices one way")
        if len(args.reference_codes) == 1:
            args.reference = args.reference_codes[0]
        else:
            args.speaker = [(f"S{i + 1}", p) for i, p in enumerate(args.reference_codes)]
    if args.prefix_codes:
        if args.prefix:
            raise UsageError("--prefix-codes and --prefix: give the audio to continue once")
        args.prefix = args.prefix_codes


def _check_request(args: argparse.Namespace) -> None:
    from .field_checks import check_fields
    from .voice_flag import resolve_voice_flag

    check_config(args)
    _codes_flags(args)
    resolve_voice_flag(args)  # --voice NAME: a configured clip becomes --reference
    given = {f: (n, getattr(args, n)) for f, _, n, _ in SAMPLING_FLAGS if getattr(args, n) is not None}
    check_sampling(given)
    check_voice(args.reference, "--reference")
    if args.reference and args.speaker:
        raise UsageError("--reference and --speaker: give one voice, or one per speaker, not both")
    seen: set[str] = set()
    for key, path in args.speaker:
        if key in seen:
            raise UsageError(f"--speaker {key} is given twice")
        seen.add(key)
        check_voice(path, f"--speaker {key}")
    check_voice(args.prefix, "--prefix")
    texts = dict(args.speaker_text)
    for key in texts:
        if key not in seen:
            raise UsageError(f"--speaker-text {key}: the transcript of --speaker {key}'s clip; give --speaker {key}=FILE too")
        if dict(args.speaker)[key].lower().endswith(".npy"):
            raise UsageError(f"--speaker-text {key}: --speaker {key} is codes; continuing the clips needs its clip")
    if len(texts) != len(args.speaker_text):
        raise UsageError("--speaker-text: a speaker is given twice")
    if texts and (args.prefix or args.prefix_text is not None):
        raise UsageError("--speaker-text and --prefix: continue either the speakers' own clips or one prefix")
    if args.prefix_text is not None and not args.prefix:
        raise UsageError("--prefix-text is the transcript of --prefix: give --prefix FILE too")
    if args.tokens is not None and args.max_new_tokens is not None and args.tokens > args.max_new_tokens:
        raise UsageError(f"--tokens {args.tokens} is more than --max-new-tokens {args.max_new_tokens}")
    check_fields(args)  # blank language (error); fields the member does not use (warnings)
    args.lexicon_read = read_lexicon(args.lexicon)


async def _voices(args: argparse.Namespace, engine: Any) -> dict[str, Any]:
    """Engine.stream's voice arguments from --reference, --speaker, --prefix(-text)."""
    kw: dict[str, Any] = {}
    if args.reference:
        kw["reference"] = await load_voice(engine, args.reference, "--reference")
    elif getattr(args, "stored_voice", None) is not None:  # --voice NAME from the shared store
        kw["reference"] = args.stored_voice
    if args.speaker:
        kw["speakers"] = {k: await load_voice(engine, p, f"--speaker {k}") for k, p in args.speaker}
    if args.speaker_text:
        kw["speaker_texts"] = dict(args.speaker_text)
    if args.prefix:
        kw.update(prefix=await load_voice(engine, args.prefix, "--prefix"), prefix_text=args.prefix_text)
    return kw


def _check_text(text: str, flag: str, args: argparse.Namespace) -> None:
    """The text, which may be empty with --ambient-sound (a sound, no speech)."""
    if not (args.ambient_sound is not None and not text.strip()):
        check_text(text, flag)
    check_text_length(text, flag)


SPEAK_DEFAULT_TEXT = "Hello! This is streamtts, speaking while it thinks."

# Steps slower than this many times the fastest one: something else is using the CPU.
SLOW_STEP_RATIO = 3.0


def _print_profile(engine: Any, stats: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    d = stats.as_dict()
    prof = engine.step_profile()
    t = Table(title="streamtts profile", show_header=True)
    t.add_column("stage")
    t.add_column("ms", justify="right")
    t.add_row("prompt (normalise, tokenise, reference, embed)", f"{d['prepare_ms']:.1f}")
    t.add_row("prefill", f"{d['prefill_ms'] or 0:.1f}")
    t.add_row(f"steps ({d['steps']})", f"{d['ms_per_step'] * d['steps']:.1f}")
    for k, v in prof.items():
        t.add_row(f"  per step: {k}", f"{v:.3f}")
    t.add_row(f"codec decode ({d['decode_windows']} windows)", f"{d['decode_ms']:.1f}")
    t.add_row("time to first audio", f"{d['ttfa_ms']:.1f}")
    t.add_row("ms per step", f"{d['ms_per_step']:.2f}")
    t.add_row("audio seconds", f"{d['audio_s']:.2f}")
    t.add_row("real-time factor", f"{d['rtf']:.3f}")
    console = Console(stderr=True)
    console.print(t)
    fastest = engine.fastest_backbone_ms()
    mean = prof.get("backbone", 0.0)
    if fastest and mean > SLOW_STEP_RATIO * fastest:
        console.print(
            f"[yellow]warning:[/] llama.cpp steps took {mean:.1f} ms on average, {mean / fastest:.1f}x "
            f"the fastest ({fastest:.1f} ms): another process is probably using the CPU. "
            f"Try fewer threads (--n-threads 1); the engine uses {engine.info.get('threads')}."
        )


# -- synth ---------------------------------------------------------------------------------------
def _check_synth(args: argparse.Namespace) -> None:
    from .field_checks import check_speaker_tags

    _check_text(args.text, "--text", args)
    check_output_file(args.out, "--out")
    check_output_file(args.codes_out, "--codes-out", audio=False)
    check_output_file(args.prompt_out, "--prompt-out", audio=False)
    check_output_file(args.rows_out, "--rows-out", audio=False)
    check_output_file(args.timestamps, "--timestamps", audio=False)
    _check_request(args)
    check_speaker_tags(args, args.text)


async def _synth(args: argparse.Namespace) -> int:
    import numpy as np
    import soundfile as sf
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from ..audio.formats import file_subtype
    from ..audio.reference import loudness_normalize

    engine = _engine(args)
    async with engine:
        opts = _options(args, engine)
        if args.timestamps:
            opts = msgspec.structs.replace(opts, timestamps="words")
        if args.rows_out:
            opts = msgspec.structs.replace(opts, rows=True)
        s = engine.stream(args.text, **await _voices(args, engine), options=opts)
        words: list[Any] = []
        pcm: list[np.ndarray] = []
        codes: list[np.ndarray] = []
        rows: list[np.ndarray] = []
        progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
            transient=True, console=Console(stderr=True), disable=args.quiet or not sys.stderr.isatty(),
        )  # fmt: skip
        t0 = time.monotonic()
        with progress as prog:
            task = prog.add_task("generating", total=None)
            async with s:
                async for chunk in s:
                    pcm.append(chunk.pcm)
                    codes.append(chunk.codes)
                    words.extend(chunk.words or [])
                    if chunk.rows is not None:
                        rows.append(chunk.rows)
                    what = f"generating: {sum(len(c) for c in codes)} frames"
                    if s.segments:  # long text: by segment, with the time left at this pace
                        done, n = s.segments_done, len(s.segments)
                        what += f", segment {min(done + 1, n)} of {n}" + time_left(done, n, time.monotonic() - t0)
                    prog.update(task, description=what)
        wav = np.concatenate(pcm) if pcm else np.zeros(0, np.float32)
        frames = np.concatenate(codes) if codes else np.zeros((0, engine.ids.n_vq), np.int64)
        if wav.size == 0:
            raise UsageError("the model produced no audio frames (try another --seed or a longer --text)")
        out = wav if args.no_loudness else loudness_normalize(wav)
        sf.write(args.out, out, SAMPLE_RATE, subtype=file_subtype(args.out))
        if args.codes_out:
            np.save(args.codes_out, frames.astype(np.int64))
        if args.timestamps:
            _write_timestamps(args.timestamps, words)
        _write_rows(args, s, rows, engine.ids.n_vq)
        st = s.stats
        print(
            f"wrote {args.out}: {frames.shape[0]} frames, {wav.size / SAMPLE_RATE:.2f} s "
            f"(TTFA {1000 * st.ttfa_s:.0f} ms, RTF {st.rtf:.3f}, {st.finish_reason})"
        )
        if args.profile:
            _print_profile(engine, st)
    return 0


def _write_rows(args: argparse.Namespace, s: Any, rows: list[Any], n_vq: int) -> None:
    """--prompt-out: the prompt rows the engine built; --rows-out: the rows generated after
    them, as fed back to the backbone (both (n, 1 + n_vq) int64, the official layout)."""
    import numpy as np

    if (args.prompt_out or args.rows_out) and s.prompt is None:
        raise UsageError(
            f"the text was spoken in {len(s.segments or [])} generations: --prompt-out and "
            "--rows-out write one generation's rows (shorten --text)"
        )
    if args.prompt_out:
        np.save(args.prompt_out, np.asarray(s.prompt, dtype=np.int64))
    if args.rows_out:
        out = np.concatenate(rows) if rows else np.zeros((0, 1 + n_vq), np.int64)
        np.save(args.rows_out, out.astype(np.int64))


def _write_timestamps(path: str, words: list[Any]) -> None:
    """``{"words": [{"word", "start", "end"}, ...], "estimated": true}`` (seconds of the file)."""
    doc = {"words": [{"word": w.word, "start": w.start, "end": w.end} for w in words], "estimated": True}
    Path(path).expanduser().write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


# -- speak ---------------------------------------------------------------------------------------
def _check_speak(args: argparse.Namespace) -> None:
    from .field_checks import check_speaker_tags

    if args.list_devices:
        return
    if args.text is None:  # text piped in is read; else (a terminal) the sentence of --help
        args.text = "-" if stdin_piped() else SPEAK_DEFAULT_TEXT
    if args.text != "-":
        _check_text(args.text, "TEXT", args)
    check_output_file(args.save, "--save")
    _check_request(args)
    if args.text != "-":
        check_speaker_tags(args, args.text)
    args.no_device = None
    if args.save is None and args.output_device is None:
        fallback = no_device_fallback(args.quiet)
        if fallback is not None:
            args.save, args.no_device = fallback
    check_output_device(args.output_device, args.save)


async def _speak(args: argparse.Namespace) -> int:
    import asyncio

    from ..audio import playback as player
    from ..audio.devices import list_devices

    if args.list_devices:
        print(list_devices())
        return 0
    text = sys.stdin.read() if args.text == "-" else args.text
    if args.text == "-":  # read now, still before the model loads
        from .field_checks import check_speaker_tags

        _check_text(text, "stdin", args)
        check_speaker_tags(args, text)
    engine = _engine(args)
    async with engine:
        opts = _options(args, engine)
        s = engine.stream(text, **await _voices(args, engine), options=opts)

        async def pcm_chunks() -> Any:
            async with s:
                async for chunk in s:
                    yield chunk.pcm

        report = None
        try:
            if args.no_device is not None:  # said up front (_check_speak)
                await save_instead(pcm_chunks(), args.save, args.no_device, quiet=True)
            else:
                try:
                    report = await player.play(pcm_chunks(), device=args.output_device, save=args.save)
                except PlaybackError as exc:
                    if not args.save:
                        raise
                    # No sound card: still produce the requested file from the same stream.
                    await save_instead(pcm_chunks(), args.save, exc, args.quiet)
        except asyncio.CancelledError:  # Ctrl-C: the file keeps what was generated so far
            if args.save and not args.quiet:
                wrote(args.save, interrupted=True)
            raise
        if not args.quiet:
            if report is not None:
                print(f"streamtts: {report.summary()}", file=sys.stderr)
            if args.save:
                wrote(args.save)
        if args.profile:
            _print_profile(engine, s.stats)
    return 0


def add_parser(sub: Any) -> None:
    s = sub.add_parser("synth", help="synthesise text to a file")
    add_model_args(s)
    s.add_argument("--text", required=True, help="the text to speak")
    s.add_argument("--out", default="out.wav", help="audio file to write (.wav, .flac, .ogg, ...)")
    s.add_argument("--codes-out", help="also write the de-delayed (T, n_vq) int64 codes as .npy")
    s.add_argument(
        "--prompt-out", metavar="P.npy",
        help="also write the prompt rows the engine built, (S, 1 + n_vq) int64 (the official input_ids layout)",
    )  # fmt: skip
    s.add_argument(
        "--rows-out", metavar="R.npy",
        help="also write the generated rows as fed back to the backbone, (T, 1 + n_vq) int64",
    )  # fmt: skip
    s.add_argument("--no-loudness", action="store_true", help="skip the whole-file loudness normalisation")
    s.add_argument(
        "--timestamps", metavar="FILE.json",
        help="also write each word's estimated start and end (seconds) as JSON (docs/timing.md)",
    )  # fmt: skip
    _add_request_args(s)
    s.set_defaults(handler=_synth, check=_check_synth)

    sp = sub.add_parser("speak", help="speak text through the speakers as it is generated")
    add_model_args(sp)
    sp.add_argument(
        "text", nargs="?",
        help=f"the text; - reads stdin, as does no TEXT with text piped in; no TEXT at a terminal: "
        f"{SPEAK_DEFAULT_TEXT!r}",
    )  # fmt: skip
    sp.add_argument(
        "--output-device", default=env_device(),
        help="output device index or name substring (--list-devices), or null: paced like a sound "
        "card, audio discarded; default: $STREAMTTS_OUTPUT_DEVICE, else the system's",
    )  # fmt: skip
    sp.add_argument("--list-devices", action="store_true", help="list the output devices and exit")
    sp.add_argument("--save", help="also write what was played to this file; without a sound card, only write it")
    _add_request_args(sp)
    sp.set_defaults(handler=_speak, check=_check_speak)
