"""What every CLI module shares: the checks run before anything expensive, the demo notice,
the no-sound-card fallback. (Its own module so that the command modules need not import
``cli.py``, which imports them.)

A check raises :class:`~streamtts.errors.UsageError` naming the argument and the next step;
``cli.main`` prints it as one line, exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ..constants import SAMPLE_RATE
from ..errors import PlaybackError, UsageError

DEMO_NOTICE = (
    "streamtts: no --config: using the synthetic demo model (random weights: it speaks in "
    "tones, not words; real speech: `streamtts download`)"
)


def check_text(text: str, flag: str) -> None:
    from ..text.segmenter import speakable

    if not text.strip():
        raise UsageError(f"{flag} is empty: give the text to speak")
    if not speakable(text):
        raise UsageError(f"{flag} {text.strip()[:40]!r} has nothing to say (no letters or digits)")


def check_text_length(text: str, flag: str) -> None:
    """At most what one engine request takes (``MAX_TEXT_CHARS``), said before loading."""
    from ..constants import MAX_TEXT_CHARS

    if len(text) > MAX_TEXT_CHARS:
        raise UsageError(
            f"{flag} is {len(text)} characters; synth and speak take at most {MAX_TEXT_CHARS} "
            "per run: split the text and run once per part, or stream it through a server "
            "(`streamtts serve`, then `streamtts say - < text.txt`, which sends it line by "
            "line: lines of up to 10 000 characters, 200 000 in all by default)"
        )


def check_sampling(values: dict[str, tuple[str, Any]]) -> None:
    """Each sampling flag given (flag -> (field, value)) is in range, by the rules of
    ``SamplingParams.validate``; the error names the flag."""
    import msgspec

    from ..config import SamplingParams
    from ..errors import SamplingError

    for flag, (name, value) in values.items():
        try:
            msgspec.structs.replace(SamplingParams(), **{name: value}).validate()
        except SamplingError as exc:
            raise UsageError(str(exc).replace(exc.field, flag, 1)) from exc


def check_input_file(path: str | None, flag: str) -> None:
    if path is None:
        return
    p = Path(path).expanduser()
    if not p.exists():
        raise UsageError(f"{flag} {path}: no such file")
    if not p.is_file():
        raise UsageError(f"{flag} {path}: not a file")


def check_output_file(path: str | None, flag: str, audio: bool = True) -> None:
    """The folder exists and is writable; for audio, the extension is one libsndfile writes."""
    if path is None:
        return
    p = Path(path).expanduser()
    folder = p.parent if str(p.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(
            f"{flag} {path}: folder {folder} does not exist (create it: mkdir -p {folder})"
        )
    if p.is_dir():
        raise UsageError(f"{flag} {path}: is a folder; give a file name")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"{flag} {path}: folder {folder} is not writable")
    if audio:
        from ..audio.formats import file_extensions

        exts = file_extensions()
        if p.suffix.lower() not in exts:
            shown = p.suffix or "(none)"
            raise UsageError(
                f"{flag} {path}: unknown audio file extension {shown}; use one of {', '.join(exts[:4])}"
            )


def read_lexicon(path: str | None, flag: str = "--lexicon") -> Any:
    """``--lexicon FILE``: a JSON object {"word": "reading", ...}, checked and compiled
    (streamtts.text.lexicon.Lexicon); None without the flag. An error names the entry at fault."""
    if not path:
        return None
    import json

    from ..errors import FieldError
    from ..text.lexicon import Lexicon

    check_input_file(path, flag)
    try:
        entries = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"{flag} {path}: not a JSON file ({exc})") from None
    try:
        return Lexicon.compile(entries, what=path)
    except FieldError as exc:
        raise UsageError(f"{flag} {exc}") from None


def check_reference(path: str | None, flag: str = "--reference") -> None:
    """The clip exists and is what the encoder accepts (read and checked: milliseconds)."""
    if path is None:
        return
    check_input_file(path, flag)
    from ..audio.reference import load_reference
    from ..errors import ReferenceAudioError

    try:
        load_reference(path)
    except ReferenceAudioError as exc:
        raise UsageError(f"{flag}: {exc}") from exc


def check_voice(path: str | None, flag: str) -> None:
    """A voice file: a clip (as :func:`check_reference`) or a ``.npy`` of (T, n_vq) codes."""
    if path is None:
        return
    if not path.lower().endswith(".npy"):
        check_reference(path, flag)
        return
    read_codes(path, flag)


def read_codes(path: str, flag: str) -> Any:
    """A ``.npy`` of pre-encoded codes as a Voice (named after the file)."""
    import numpy as np

    from ..errors import InputError
    from ..request import Voice

    check_input_file(path, flag)
    try:
        codes = np.load(Path(path).expanduser(), allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{flag} {path}: not a .npy array of codes ({exc})") from exc
    try:
        return Voice.from_codes(codes, name=Path(path).stem)
    except InputError as exc:
        raise UsageError(f"{flag} {path}: {exc}") from exc


async def load_voice(engine: Any, path: str, flag: str) -> Any:
    """The Voice of a voice file: a ``.npy`` of codes as they are, a clip encoded."""
    if path.lower().endswith(".npy"):
        return read_codes(path, flag)
    return await engine.encode_voice(path, name=Path(path).stem)


def speaker_arg(text: str) -> tuple[str, str]:
    """``S1=alice.wav`` -> ("S1", "alice.wav") (argparse type of ``--speaker``)."""
    key, sep, path = text.partition("=")
    if not sep or not key.strip() or not path:
        raise argparse.ArgumentTypeError(f"expected TAG=FILE (e.g. S1=alice.wav), got {text!r}")
    from ..errors import InputError
    from ..request.voices import speaker_number

    try:
        n = speaker_number(key)
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return f"S{n}", path


def speaker_text_arg(text: str) -> tuple[str, str]:
    """``S1=Hello there.`` -> ("S1", "Hello there.") (argparse type of ``--speaker-text``)."""
    key, sep, said = text.partition("=")
    if not sep or not key.strip() or not said.strip():
        raise argparse.ArgumentTypeError(f"expected TAG=TEXT (e.g. S1=\"Hello there.\"), got {text!r}")
    tag, _ = speaker_arg(f"{key}=x")
    return tag, said


def check_config(args: argparse.Namespace, flag: str = "--config") -> None:
    """The config loads (a YAML error or an unusable value says so now), and the model files
    it names exist (a config copied without its weights is the common case)."""
    path = getattr(args, "config", None)
    if not path:
        return
    check_input_file(path, flag)
    from ..config import PATH_KEYS, load_config

    cfg = load_config(path)
    for key in PATH_KEYS:
        value = getattr(cfg, key)
        if value and not Path(value).exists():
            raise UsageError(
                f"{flag} {path}: {key} {value} does not exist (get the official weights with "
                "`streamtts download`, which writes weights/streamtts.yaml; without --config "
                "every command uses the demo model)"
            )


def check_output_device(device: str | None, save: str | None) -> None:
    """Without ``--save`` playback needs a device: say so before loading anything."""
    from ..audio.devices import NULL_DEVICE, resolve_output_device

    if save is not None or device == NULL_DEVICE:
        return
    resolve_output_device(device)


SPEAK_FALLBACK = "speak.wav"  # where `speak` writes its audio when there is nothing to play on


def no_device_fallback(quiet: bool) -> tuple[str, PlaybackError] | None:
    """``speak`` with the system's default device and no ``--save``: when nothing can play
    (no device, no PortAudio), say so now, before the model loads, and name the file the
    audio goes to instead (``speak.wav``, else ``speak-2.wav``, ...: never one that exists).
    None when there is a device."""
    from ..audio.devices import resolve_output_device

    try:
        resolve_output_device(None)
        return None
    except PlaybackError as exc:
        stem, suffix = os.path.splitext(SPEAK_FALLBACK)
        path, n = SPEAK_FALLBACK, 1
        while os.path.lexists(path):
            n += 1
            path = f"{stem}-{n}{suffix}"
        if not quiet:
            print(
                f"streamtts: {exc.reason}: writing the audio to {path} instead "
                "(--save FILE to choose the file, --output-device to choose a device)",
                file=sys.stderr,
            )
        return path, exc


def demo_notice(args: argparse.Namespace) -> None:
    if not getattr(args, "config", None) and not getattr(args, "model", None) and not getattr(args, "quiet", False):
        print(DEMO_NOTICE, file=sys.stderr)


def env_device() -> str | None:
    import os

    return os.environ.get("STREAMTTS_OUTPUT_DEVICE") or None


async def save_instead(chunks: Any, path: str, exc: PlaybackError, quiet: bool) -> int:
    """No sound card (the player failed before reading ``chunks``): write them to ``path`` as
    they come, so that Ctrl-C (or a failure) leaves what was generated so far; returns the
    number of samples written."""
    import soundfile as sf

    from ..audio.playback import save_subtype

    if not quiet:
        print(f"streamtts: {exc.reason}: writing {path} only", file=sys.stderr)
    written = 0
    f = None  # opened with the first audio: a request refused at once leaves no file
    try:
        async for pcm in chunks:
            if f is None:
                f = sf.SoundFile(path, "w", SAMPLE_RATE, 1, subtype=save_subtype(path))
            f.write(pcm)
            written += len(pcm)
        if f is None:  # spoken, but no audio: still the file asked for
            f = sf.SoundFile(path, "w", SAMPLE_RATE, 1, subtype=save_subtype(path))
    finally:
        if f is not None:
            f.close()
    return written


def stdin_piped() -> bool:
    """Whether stdin brings text: a pipe, a file or a socket (``echo Hi | streamtts speak``,
    ``< text.txt``); not a terminal, /dev/null or a closed stdin."""
    import stat

    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError):  # closed, or replaced by a non-file
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISREG(mode) or stat.S_ISSOCK(mode)


def time_left(done: float, total: float, elapsed: float) -> str:
    """``, about 40 s left``: the time the rest takes at the pace so far (once some is done)."""
    if not 0 < done < total:
        return ""
    left = elapsed / done * (total - done)
    return f", about {left:.0f} s left" if left < 120 else f", about {left / 60:.0f} min left"


def wrote(path: str, interrupted: bool = False) -> None:
    """The result line of a command that saved audio: ``wrote F: 2.40 s``."""
    import soundfile as sf

    try:
        seconds = sf.info(path).duration
    except Exception:  # noqa: BLE001 - an unreadable file: say only that it was written
        print(f"wrote {path}")
        return
    why = " (until interrupted)" if interrupted else ""
    print(f"wrote {path}: {seconds:.2f} s{why}")


def load_config_or_demo(path: str | None, demo: bool = True) -> Any:
    """The config; without one, the demo model's (as every other command), unless ``demo``
    is False (the command was given explicit files instead)."""
    from ..config import load_config

    if path:
        return load_config(path)
    if not demo:
        return None
    from ..demo.model import ensure_demo_model

    print("streamtts: no --config: using the synthetic demo model's files", file=sys.stderr)
    return load_config(ensure_demo_model())


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config (official MOSS-TTS llama.cpp keys work); default: the demo model")
    p.add_argument("--max-streams", type=positive_int, help="streams generated at once; default: the config's (4)")
    p.add_argument(
        "--n-threads", type=non_negative_int,
        help="llama.cpp CPU threads; default: the config's, whose 0 = the physical cores not kept busy by "
        "other processes at start-up (1 on a 2-core machine with a busy neighbour)",
    )  # fmt: skip


def positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def non_negative_int(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def chunk_list(text: str) -> tuple[int, ...]:
    """``1,2,4,8`` (``--chunk-frames``): chunk sizes in frames, each >= 1."""
    try:
        sizes = tuple(int(t) for t in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give frames >= 1 joined by commas, e.g. 1,2,4,8")
    return sizes
