"""Where llama.cpp put the backbone: the backend, the device, the layers and the device memory.

Read from what llama.cpp reported while it loaded the model (the bridge keeps its lines
"offloaded 3/3 layers to GPU" and "Vulkan0 model buffer size = 1.2 MiB", stt_placement) and
from the build's device registry (name, description, memory), not from the configuration
that asked for it: a build without a usable device, or n_gpu_layers 0, reports the CPU.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import msgspec

_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers")
_BUFFER = re.compile(r"(\S+)\s+(\w+) buffer size =\s*([0-9.]+) MiB")


class Placement(msgspec.Struct, frozen=True, kw_only=True):
    backend: str  # the bridge's build: cpu, cuda, vulkan
    device: str  # llama.cpp's device name ("Vulkan0", "CUDA0") or "CPU"
    description: str  # "llvmpipe (LLVM 15.0.6, 256 bits)", "NVIDIA H200", the CPU's name
    layers_offloaded: int  # llama.cpp's count (repeating layers + the output layer)
    layers_total: int
    device_bytes: int  # model, KV cache and compute buffers on the device
    device_total_bytes: int  # the device's memory (0 when it has none of its own)

    @property
    def on_gpu(self) -> bool:
        """The layers run on a GPU backend (any device but the CPU)."""
        return self.device != "CPU" and self.layers_offloaded > 0

    def line(self) -> str:
        if not self.on_gpu:
            return f"{self.backend} build, layers on the CPU"
        return (
            f"{self.backend} build, {self.layers_offloaded}/{self.layers_total} layers on "
            f"{self.device} ({self.description}), {self.device_bytes / 2**20:.1f} MiB of device memory"
        )

    def info(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "device": self.device,
            "device_description": self.description,
            "layers_offloaded": self.layers_offloaded,
            "layers_total": self.layers_total,
            "device_memory_mib": round(self.device_bytes / 2**20, 1),
        }


def parse_placement(text: str, backend: str, devices: Sequence[dict[str, Any]]) -> Placement:
    """The placement from llama.cpp's load lines and the build's devices (see _llama.devices)."""
    m = _OFFLOADED.search(text)
    offloaded, total = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    by_name = {str(d["name"]): d for d in devices}
    on_device: dict[str, float] = {}
    for name, _kind, mib in _BUFFER.findall(text):
        d = by_name.get(name)
        if d is not None and d["type"] != "cpu":
            on_device[name] = on_device.get(name, 0.0) + float(mib)
    if not on_device or offloaded == 0:
        cpu = next((d for d in devices if d["type"] == "cpu"), None)
        desc = str(cpu["description"]) if cpu else "CPU"
        return Placement(
            backend=backend, device="CPU", description=desc, layers_offloaded=0,
            layers_total=total, device_bytes=0, device_total_bytes=0,
        )  # fmt: skip
    name = max(on_device, key=lambda k: on_device[k])
    d = by_name[name]
    return Placement(
        backend=backend, device=name, description=str(d["description"]),
        layers_offloaded=offloaded, layers_total=total,
        device_bytes=int(sum(on_device.values()) * 2**20), device_total_bytes=int(d["total"]),
    )  # fmt: skip
