"""Output devices: finding them, opening them, and what the Player needs of a stream.

``sounddevice`` is imported lazily: it raises ``OSError`` at import when the PortAudio library is
missing, which becomes a :class:`PlaybackError` with a hint instead of a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol, cast

import numpy as np
import numpy.typing as npt

from ..errors import PlaybackError

log = logging.getLogger(__name__)

__all__ = [
    "NO_DEVICE_MESSAGE",
    "AudioCallback",
    "OutputStreamLike",
    "StreamFactory",
    "list_devices",
    "resolve_output_device",
    "sounddevice_stream",
]

SAVE_HINT = "add --save FILE to write the audio to a file (or --output-device null)"
# ``--output-device null``: a sink paced like a sound card that discards the audio
NULL_DEVICE = "null"
NO_DEVICE_REASON = "no audio output device found (PortAudio reports none)"
NO_DEVICE_MESSAGE = f"{NO_DEVICE_REASON}; {SAVE_HINT}"
NO_PORTAUDIO_REASON = (
    "audio playback is unavailable: the PortAudio library was not found "
    "(Debian/Ubuntu: apt-get install libportaudio2)"
)
NO_PORTAUDIO_MESSAGE = f"{NO_PORTAUDIO_REASON}; {SAVE_HINT}"
NO_SOUNDDEVICE_REASON = "audio playback needs the 'sounddevice' package (a streamtts dependency: pip install sounddevice)"
NO_SOUNDDEVICE_MESSAGE = f"{NO_SOUNDDEVICE_REASON}; {SAVE_HINT}"

Float32Array = npt.NDArray[np.float32]
AudioCallback = Callable[[Float32Array, int, Any, Any], None]


# -- output streams -------------------------------------------------------------------


class OutputStreamLike(Protocol):
    """The part of ``sounddevice.OutputStream`` the Player uses."""

    @property
    def samplerate(self) -> float: ...

    @property
    def latency(self) -> float: ...

    @property
    def active(self) -> bool: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def abort(self) -> None: ...

    def close(self) -> None: ...


class StreamFactory(Protocol):
    """Opens a mono float32 output stream that pulls audio through ``callback``.

    ``samplerate`` is the rate the Player would like; the stream's ``samplerate`` attribute is the
    rate it actually runs at (a device that refuses 24 kHz runs at its own rate and the Player
    resamples). ``blocksize`` 0 lets the device choose.
    """

    def __call__(
        self,
        *,
        samplerate: int,
        blocksize: int,
        device: int | str | None,
        callback: AudioCallback,
    ) -> OutputStreamLike: ...


# -- sounddevice (lazy) ---------------------------------------------------------------


def _load_sounddevice() -> Any:
    """Import sounddevice, turning every way it can fail into a PlaybackError."""
    try:
        import sounddevice
    except OSError as exc:  # raised at import when libportaudio is missing
        raise PlaybackError(NO_PORTAUDIO_REASON, SAVE_HINT) from exc
    except ImportError as exc:
        raise PlaybackError(NO_SOUNDDEVICE_REASON, SAVE_HINT) from exc
    except Exception as exc:  # e.g. PortAudioError from Pa_Initialize
        raise PlaybackError(f"PortAudio failed to initialise: {exc}", SAVE_HINT) from exc
    return sounddevice


def _all_devices(sd: Any) -> list[dict[str, Any]]:
    try:
        return [dict(d) for d in sd.query_devices()]
    except Exception as exc:  # PortAudioError; sounddevice has no narrower base
        raise PlaybackError(f"cannot list audio devices: {exc}", SAVE_HINT) from exc


def _default_output_index(sd: Any) -> int:
    try:
        return int(sd.default.device[1])
    except Exception:  # no default (PortAudio returns -1, some setups raise)
        return -1


def _hostapi_names(sd: Any) -> list[str]:
    try:
        return [str(h["name"]) for h in sd.query_hostapis()]
    except Exception:  # only used for display
        return []


def _device_table(sd: Any, devices: list[dict[str, Any]]) -> str:
    outputs = [d for d in devices if d["max_output_channels"] > 0]
    if not outputs:
        return "no audio output devices found (PortAudio reports none)"
    default = _default_output_index(sd)
    apis = _hostapi_names(sd)
    rows = [("", "index", "name", "host API", "channels", "rate")]
    for d in outputs:
        api = d.get("hostapi", -1)
        rows.append(
            (
                "*" if d["index"] == default else "",
                str(d["index"]),
                str(d["name"]),
                apis[api] if 0 <= api < len(apis) else "",
                str(d["max_output_channels"]),
                f"{float(d['default_samplerate']):.0f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines + ["(* = default output device)"])


def list_devices() -> str:
    """A readable table of the output devices PortAudio reports (``*`` marks the default)."""
    sd = _load_sounddevice()
    return _device_table(sd, _all_devices(sd))


def _resolve(sd: Any, spec: int | str | None) -> dict[str, Any]:
    devices = _all_devices(sd)
    outputs = [d for d in devices if d["max_output_channels"] > 0]
    if not outputs:
        raise PlaybackError(NO_DEVICE_REASON, SAVE_HINT)
    if isinstance(spec, str):
        spec = spec.strip()
        if spec.isdigit():
            spec = int(spec)
        elif not spec:
            spec = None
    if spec is None:
        default = _default_output_index(sd)
        for d in outputs:
            if d["index"] == default:
                return d
        log.info("no default output device; using %r", outputs[0]["name"])
        return outputs[0]
    if isinstance(spec, int):
        for d in devices:
            if d["index"] == spec:
                if d["max_output_channels"] < 1:
                    raise PlaybackError(
                        f"audio device {spec} ({d['name']!r}) has no output channels; "
                        f"output devices:\n{_device_table(sd, devices)}"
                    )
                return d
        raise PlaybackError(
            f"no audio device with index {spec}; output devices:\n{_device_table(sd, devices)}"
        )
    needle = spec.lower()
    matches = [d for d in outputs if needle in str(d["name"]).lower()]
    exact = [d for d in matches if str(d["name"]).lower() == needle]
    if len(matches) == 1 or len(exact) == 1:
        return (exact or matches)[0]
    if not matches:
        raise PlaybackError(
            f"no audio output device matches {spec!r}; output devices:\n{_device_table(sd, devices)}"
        )
    names = ", ".join(f"{d['index']}: {d['name']!r}" for d in matches)
    raise PlaybackError(f"{spec!r} matches several output devices ({names}); give the index")


def resolve_output_device(spec: int | str | None) -> int:
    """The PortAudio index of the output device ``spec`` names.

    ``spec``: None (the default device), an index (int or digit string) or a case-insensitive
    substring of the device name. Raises :class:`PlaybackError` when there is no output device or
    the spec matches none / several.
    """
    return int(_resolve(_load_sounddevice(), spec)["index"])


def sounddevice_stream(
    *,
    samplerate: int,
    blocksize: int,
    device: int | str | None,
    callback: AudioCallback,
) -> OutputStreamLike:
    """The real :class:`StreamFactory`: a ``sounddevice.OutputStream`` (mono, float32).

    Asks for ``samplerate``; a device that refuses it is opened at its default rate instead (the
    Player then resamples).
    """
    sd = _load_sounddevice()
    info = _resolve(sd, device)
    index, name = int(info["index"]), str(info["name"])
    rate = samplerate
    try:
        sd.check_output_settings(device=index, channels=1, dtype="float32", samplerate=samplerate)
    except Exception as exc:  # PortAudioError / ValueError: rate (or format) refused
        rate = int(round(float(info["default_samplerate"])))
        log.info(
            "%r refuses %d Hz (%s); playing at %d Hz with resampling", name, samplerate, exc, rate
        )
    try:
        stream = sd.OutputStream(
            samplerate=rate,
            blocksize=blocksize,
            device=index,
            channels=1,
            dtype="float32",
            callback=callback,
        )
    except Exception as exc:  # PortAudioError, ValueError, ...: all mean "cannot open"
        raise PlaybackError(
            f"cannot open audio output device {index} ({name!r}) at {rate} Hz: {exc}", SAVE_HINT
        ) from exc
    log.debug("opened %r at %d Hz, latency %.3f s", name, rate, stream.latency)
    return cast(OutputStreamLike, stream)
