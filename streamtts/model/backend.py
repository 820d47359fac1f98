"""Which llama.cpp build the bridge is loaded from: ``cpu``, ``cuda`` or ``vulkan``.

``native/build.sh`` keeps one build per variant (``<cache>/native/current-<variant>``); a
process loads one of them (their libraries share names, so never two). The choice, in order:
``STREAMTTS_BACKEND`` (cpu, cuda, vulkan, auto), else the config key ``backend`` (set through
:func:`request` before the bridge loads), else the older ``STREAMTTS_CUDA`` (1 = cuda,
0 = cpu), else ``auto``: the CUDA build when present, then the Vulkan build when the Vulkan
loader lists a GPU, then the CPU build.

Asked for ``vulkan`` on a machine whose only Vulkan device is a CPU-type one (lavapipe), the
chooser makes llama.cpp use it (``GGML_VK_VISIBLE_DEVICES``, which llama.cpp needs for such a
device) and warns: it computes correctly and slowly. ``auto`` never picks such a device.
"""

from __future__ import annotations

import logging
import os
from typing import Literal, cast

from ..errors import ConfigError, NativeLibraryError

log = logging.getLogger(__name__)

Backend = Literal["auto", "cpu", "cuda", "vulkan"]
BACKENDS: tuple[Backend, ...] = ("auto", "cpu", "cuda", "vulkan")
VARIANTS = ("cuda", "vulkan", "cpu")  # auto's order
GPU_VARIANTS = ("cuda", "vulkan")
BUILD_CMD = {
    "cpu": "bash native/build.sh",
    "cuda": "STREAMTTS_CUDA=1 bash native/build.sh",
    "vulkan": "STREAMTTS_VULKAN=1 bash native/build.sh",
}
VULKAN_PACKAGES = "libvulkan-dev glslc glslang-tools spirv-headers mesa-vulkan-drivers on Debian"
_VK_ENV = "GGML_VK_VISIBLE_DEVICES"

_configured: str = ""  # the config key's value, set by request()


def check_name(name: str, where: str) -> Backend:
    if name not in BACKENDS:
        raise ConfigError(f"{where} must be one of {', '.join(BACKENDS)}, got {name!r}")
    return name


def request(name: str) -> None:
    """The config key ``backend`` (STREAMTTS_BACKEND, when set, wins over it)."""
    global _configured
    _configured = check_name(name, "backend")


def wanted() -> tuple[Backend, str]:
    """(the backend asked for, who asked: the variable or key that said so)."""
    env = os.environ.get("STREAMTTS_BACKEND", "").strip()
    if env:
        return check_name(env.lower(), "STREAMTTS_BACKEND"), f"STREAMTTS_BACKEND={env}"
    if _configured and _configured != "auto":
        return cast(Backend, _configured), f"backend: {_configured}"
    legacy = os.environ.get("STREAMTTS_CUDA", "")
    if legacy in ("0", "1"):
        return ("cuda" if legacy == "1" else "cpu"), f"STREAMTTS_CUDA={legacy}"
    return "auto", "auto"


def missing_build(variant: str, who: str, path: object) -> NativeLibraryError:
    extra = f" (needs {VULKAN_PACKAGES}; or bash scripts/setup.sh --test)" if variant == "vulkan" else ""
    return NativeLibraryError(
        f"{who}: the {variant} build of the llama.cpp bridge is missing ({path}); "
        f"build it with `{BUILD_CMD[variant]}`{extra}"
    )


def prepare_vulkan(who: str, strict: bool) -> bool:
    """Make llama.cpp's Vulkan backend see a device before it starts. True when one is there.

    strict (vulkan asked for by name): a CPU-type device is selected when it is the only
    kind (with a warning), and no device at all is an error naming what is missing.
    Not strict (auto): True only for a GPU; nothing is selected."""
    from .vulkan_probe import vulkan_devices

    if os.environ.get(_VK_ENV):
        return True  # the user chose the devices
    devices, why = vulkan_devices()
    if any(d.is_gpu for d in devices):
        return True
    if not strict:
        return False
    if not devices:
        raise NativeLibraryError(
            f"{who}: no Vulkan device: {why}; install a Vulkan driver for your GPU "
            f"(Debian: mesa-vulkan-drivers for AMD/Intel and for lavapipe, Mesa's CPU device)"
        )
    cpu = [d for d in devices if d.kind == "cpu"]
    if not cpu:
        names = ", ".join(f"{d.name} ({d.kind})" for d in devices)
        raise NativeLibraryError(f"{who}: no usable Vulkan device (the loader lists {names})")
    os.environ[_VK_ENV] = str(cpu[0].index)
    log.warning(
        "Vulkan: the only device is %s, a CPU-type device: using it (%s=%d). It computes "
        "correctly but much slower than the CPU build; meant for testing the GPU path",
        cpu[0].name, _VK_ENV, cpu[0].index,
    )  # fmt: skip
    return True
