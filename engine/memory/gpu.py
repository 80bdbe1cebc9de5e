"""GPU memory readers: NVIDIA's NVML and Windows' DXGI (any DirectX 12 adapter).

Like every capacity provider (``engine.memory.capacity``) they never raise into their
caller and never guess: what they cannot measure is None.
"""

from __future__ import annotations

import ctypes
import os
import sys
import uuid as _uuid
from dataclasses import dataclass
from typing import Any


class NvmlGPU:
    """An NVIDIA GPU's memory through NVML (package nvidia-ml-py, module `pynvml`).

    `index` is NVML's device index; `for_cuda_device` maps a CUDA device id through
    CUDA_VISIBLE_DEVICES. Without the package or a driver every number is unknown and
    `unknown_reason` says why; nothing raises.
    """

    def __init__(self, index: int = 0, *, uuid: str | None = None) -> None:
        self.index = index
        self.uuid = uuid
        self.unknown_reason = ""
        self._nvml: Any = None
        self._handle: Any = None
        self._tried = False

    @classmethod
    def for_cuda_device(cls, device_id: int) -> NvmlGPU:
        """The NVML device behind CUDA device `device_id`. CUDA numbers the devices that
        CUDA_VISIBLE_DEVICES lists, in that order; NVML numbers all of them by PCI bus,
        which matches CUDA's own order only with CUDA_DEVICE_ORDER=PCI_BUS_ID or one GPU."""
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
        entries = [e.strip() for e in visible.split(",") if e.strip()] if visible else []
        if device_id < len(entries):
            entry = entries[device_id]
            if entry.isdigit():
                return cls(int(entry))
            return cls(device_id, uuid=entry)
        return cls(device_id)

    @property
    def name(self) -> str:
        return f"GPU {self.uuid or self.index} (NVML)"

    def _device(self) -> Any:
        if not self._tried:
            self._tried = True
            try:
                import pynvml

                pynvml.nvmlInit()
                if self.uuid is not None:
                    self._handle = pynvml.nvmlDeviceGetHandleByUUID(self.uuid)
                else:
                    self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
                self._nvml = pynvml
            except ImportError:
                self.unknown_reason = "NVML: nvidia-ml-py is not installed"
            except Exception as exc:
                self.unknown_reason = f"NVML: {exc or type(exc).__name__}"
        return self._handle

    def _memory(self) -> Any:
        handle = self._device()
        return None if handle is None else self._nvml.nvmlDeviceGetMemoryInfo(handle)

    def total(self) -> int | None:
        info = self._memory()
        return None if info is None else int(info.total)

    def used(self) -> int | None:
        info = self._memory()
        return None if info is None else int(info.used)

    def available(self) -> int | None:
        info = self._memory()
        return None if info is None else int(info.free)

    def process_used(self) -> int | None:
        """This process's GPU memory; unknown when the driver does not say (Windows WDDM)
        or cannot see our pid (containers)."""
        handle = self._device()
        if handle is None:
            return None
        pid = os.getpid()
        mine = [p.usedGpuMemory for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
                if p.pid == pid]
        if not mine or any(m is None for m in mine):
            return None
        return int(sum(mine))


class _GUID(ctypes.Structure):
    _fields_ = [("Data1", ctypes.c_uint32), ("Data2", ctypes.c_uint16),
                ("Data3", ctypes.c_uint16), ("Data4", ctypes.c_ubyte * 8)]

    @classmethod
    def parse(cls, text: str) -> _GUID:
        u = _uuid.UUID(text)
        return cls(u.time_low, u.time_mid, u.time_hi_version, (ctypes.c_ubyte * 8)(*u.bytes[8:]))


class _LUID(ctypes.Structure):
    _fields_ = [("LowPart", ctypes.c_uint32), ("HighPart", ctypes.c_int32)]


class _AdapterDesc1(ctypes.Structure):
    """DXGI_ADAPTER_DESC1."""

    _fields_ = [("Description", ctypes.c_wchar * 128), ("VendorId", ctypes.c_uint),
                ("DeviceId", ctypes.c_uint), ("SubSysId", ctypes.c_uint),
                ("Revision", ctypes.c_uint), ("DedicatedVideoMemory", ctypes.c_size_t),
                ("DedicatedSystemMemory", ctypes.c_size_t),
                ("SharedSystemMemory", ctypes.c_size_t), ("AdapterLuid", _LUID),
                ("Flags", ctypes.c_uint)]


class _VideoMemoryInfo(ctypes.Structure):
    """DXGI_QUERY_VIDEO_MEMORY_INFO."""

    _fields_ = [("Budget", ctypes.c_uint64), ("CurrentUsage", ctypes.c_uint64),
                ("AvailableForReservation", ctypes.c_uint64),
                ("CurrentReservation", ctypes.c_uint64)]


_IID_FACTORY1 = "770aae78-f26f-4dba-a829-253c83d1b387"
_IID_ADAPTER3 = "645967a4-1392-4310-a798-8053ce3e93fd"
# vtable slots: IUnknown 0-2, IDXGIObject 3-6, then each interface's own methods.
_QUERY_INTERFACE, _RELEASE = 0, 2
_FACTORY1_ENUM_ADAPTERS1 = 12
_ADAPTER1_GET_DESC1 = 10
_ADAPTER3_QUERY_VIDEO_MEMORY_INFO = 14
_SEGMENT_GROUP_LOCAL = 0


@dataclass(frozen=True)
class _DxgiMemory:
    description: str
    dedicated: int
    budget: int | None
    usage: int | None


def _dxgi_query(index: int) -> _DxgiMemory | None:
    """Adapter `index`'s description, dedicated memory and local-segment budget/usage."""
    if sys.platform != "win32":
        return None

    def method(obj: ctypes.c_void_p, slot: int, restype: Any, *argtypes: Any) -> Any:
        vtable = ctypes.cast(obj, ctypes.POINTER(ctypes.POINTER(ctypes.c_void_p))).contents
        return ctypes.WINFUNCTYPE(restype, ctypes.c_void_p, *argtypes)(vtable[slot])

    def release(obj: ctypes.c_void_p) -> None:
        if obj:
            method(obj, _RELEASE, ctypes.c_ulong)(obj)

    create = ctypes.WinDLL("dxgi").CreateDXGIFactory1
    create.restype = ctypes.c_long
    create.argtypes = [ctypes.POINTER(_GUID), ctypes.POINTER(ctypes.c_void_p)]
    factory, adapter, adapter3 = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    iid_factory, iid_adapter3 = _GUID.parse(_IID_FACTORY1), _GUID.parse(_IID_ADAPTER3)
    try:
        if create(ctypes.byref(iid_factory), ctypes.byref(factory)) < 0 or not factory:
            return None
        enum = method(factory, _FACTORY1_ENUM_ADAPTERS1, ctypes.c_long, ctypes.c_uint,
                      ctypes.POINTER(ctypes.c_void_p))
        if enum(factory, index, ctypes.byref(adapter)) < 0 or not adapter:
            return None
        desc = _AdapterDesc1()
        get_desc = method(adapter, _ADAPTER1_GET_DESC1, ctypes.c_long,
                          ctypes.POINTER(_AdapterDesc1))
        if get_desc(adapter, ctypes.byref(desc)) < 0:
            return None
        budget = usage = None
        query = method(adapter, _QUERY_INTERFACE, ctypes.c_long, ctypes.POINTER(_GUID),
                       ctypes.POINTER(ctypes.c_void_p))
        if query(adapter, ctypes.byref(iid_adapter3), ctypes.byref(adapter3)) >= 0 and adapter3:
            info = _VideoMemoryInfo()
            memory = method(adapter3, _ADAPTER3_QUERY_VIDEO_MEMORY_INFO, ctypes.c_long,
                            ctypes.c_uint, ctypes.c_int, ctypes.POINTER(_VideoMemoryInfo))
            if memory(adapter3, 0, _SEGMENT_GROUP_LOCAL, ctypes.byref(info)) >= 0:
                budget, usage = int(info.Budget), int(info.CurrentUsage)
        return _DxgiMemory(desc.Description, int(desc.DedicatedVideoMemory), budget, usage)
    finally:
        for obj in (adapter3, adapter, factory):
            release(obj)


class DxgiAdapter:
    """A DXGI adapter (what DirectML runs on), Windows only, best effort.

    total: the larger of the adapter's dedicated memory and the OS budget of its local
    segment (integrated GPUs have little dedicated memory and a shared-memory budget);
    available: budget minus this process's usage; process_used: this process's usage.
    `used` (everyone's) is unknown: DXGI reports only this process, so what other
    processes use is unknown too. On other platforms every number is unknown.
    """

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self.unknown_reason = "" if sys.platform == "win32" else "DXGI: Windows only"

    @property
    def name(self) -> str:
        return f"DXGI adapter {self.index}"

    def _read(self) -> _DxgiMemory | None:
        try:
            found = _dxgi_query(self.index)
        except Exception as exc:
            self.unknown_reason = f"DXGI: {exc or type(exc).__name__}"
            return None
        if found is not None:
            self.unknown_reason = ""
        elif sys.platform == "win32":
            self.unknown_reason = f"DXGI: no adapter {self.index}"
        return found

    def total(self) -> int | None:
        m = self._read()
        if m is None:
            return None
        return max(m.dedicated, m.budget or 0) or None

    def used(self) -> int | None:
        return None

    def available(self) -> int | None:
        m = self._read()
        if m is None or m.budget is None or m.usage is None:
            return None
        return max(0, m.budget - m.usage)

    def process_used(self) -> int | None:
        m = self._read()
        return None if m is None else m.usage
