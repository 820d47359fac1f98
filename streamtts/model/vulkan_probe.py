"""The Vulkan devices the system's loader lists, read before llama.cpp starts its Vulkan backend.

llama.cpp's Vulkan backend takes discrete and integrated GPUs only; a CPU-type device (Mesa's
lavapipe, ``llvmpipe``) is used only when ``GGML_VK_VISIBLE_DEVICES`` names it, and that must
be set before the backend starts (its device list is read once per process). So the bridge's
chooser (:mod:`streamtts.model.backend`) asks the loader itself, through ``libvulkan.so.1``:
create an instance, list the physical devices and their types, destroy it. Nothing here loads
llama.cpp, so the answer can decide which build of the bridge to load.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass

# VkPhysicalDeviceType
_TYPES = {0: "other", 1: "integrated", 2: "discrete", 3: "virtual", 4: "cpu"}
_VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO = 1
_VK_STRUCTURE_TYPE_APPLICATION_INFO = 0
_VK_API_1_2 = (1 << 22) | (2 << 12)


@dataclass(frozen=True)
class VkDevice:
    index: int  # position in the loader's list (what GGML_VK_VISIBLE_DEVICES counts)
    name: str
    kind: str  # discrete, integrated, virtual, cpu, other
    api: str  # Vulkan version the driver supports, "1.3.230"

    @property
    def is_gpu(self) -> bool:
        return self.kind in ("discrete", "integrated", "virtual")


class _AppInfo(ctypes.Structure):
    _fields_ = [
        ("sType", ctypes.c_uint32), ("pNext", ctypes.c_void_p),
        ("pApplicationName", ctypes.c_char_p), ("applicationVersion", ctypes.c_uint32),
        ("pEngineName", ctypes.c_char_p), ("engineVersion", ctypes.c_uint32),
        ("apiVersion", ctypes.c_uint32),
    ]  # fmt: skip


class _InstanceInfo(ctypes.Structure):
    _fields_ = [
        ("sType", ctypes.c_uint32), ("pNext", ctypes.c_void_p), ("flags", ctypes.c_uint32),
        ("pApplicationInfo", ctypes.POINTER(_AppInfo)),
        ("enabledLayerCount", ctypes.c_uint32), ("ppEnabledLayerNames", ctypes.c_void_p),
        ("enabledExtensionCount", ctypes.c_uint32), ("ppEnabledExtensionNames", ctypes.c_void_p),
    ]  # fmt: skip


class _DeviceProps(ctypes.Structure):
    # the head of VkPhysicalDeviceProperties; the rest (limits, ~800 bytes) lands in _tail
    _fields_ = [
        ("apiVersion", ctypes.c_uint32), ("driverVersion", ctypes.c_uint32),
        ("vendorID", ctypes.c_uint32), ("deviceID", ctypes.c_uint32),
        ("deviceType", ctypes.c_uint32), ("deviceName", ctypes.c_char * 256),
        ("_tail", ctypes.c_uint8 * 4096),
    ]  # fmt: skip


def _version(v: int) -> str:
    return f"{(v >> 22) & 0x7F}.{(v >> 12) & 0x3FF}.{v & 0xFFF}"


def vulkan_devices() -> tuple[list[VkDevice], str]:
    """(the loader's devices, "") or ([], why none could be listed)."""
    name = ctypes.util.find_library("vulkan") or "libvulkan.so.1"
    try:
        vk = ctypes.CDLL(name)
    except OSError as exc:
        return [], f"the Vulkan loader ({name}) is not installed: {exc} (Debian: apt-get install libvulkan1)"
    handle = ctypes.c_void_p()
    app = _AppInfo(_VK_STRUCTURE_TYPE_APPLICATION_INFO, None, b"streamtts", 1, b"streamtts", 1, _VK_API_1_2)
    info = _InstanceInfo(_VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, None, 0, ctypes.pointer(app), 0, None, 0, None)
    rc = vk.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(handle))
    if rc != 0:
        # VK_ERROR_INCOMPATIBLE_DRIVER (-9): no driver (ICD) at all
        return [], f"the Vulkan loader found no driver (vkCreateInstance returned {rc})"
    try:
        count = ctypes.c_uint32(0)
        vk.vkEnumeratePhysicalDevices(handle, ctypes.byref(count), None)
        phys = (ctypes.c_void_p * max(count.value, 1))()
        vk.vkEnumeratePhysicalDevices(handle, ctypes.byref(count), phys)
        out: list[VkDevice] = []
        for i in range(count.value):
            props = _DeviceProps()
            vk.vkGetPhysicalDeviceProperties(ctypes.c_void_p(phys[i]), ctypes.byref(props))
            out.append(
                VkDevice(
                    index=i,
                    name=props.deviceName.decode("utf-8", "replace"),
                    kind=_TYPES.get(int(props.deviceType), "other"),
                    api=_version(int(props.apiVersion)),
                )
            )
    finally:
        vk.vkDestroyInstance(handle, None)
    if not out:
        return [], "the Vulkan loader lists no device"
    return out, ""
