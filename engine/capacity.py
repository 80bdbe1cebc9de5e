"""Capacity providers: how big a memory tier is, how much of it is used, and how much is free.

A provider measures one tier (GPU memory, system RAM, free disk) with real tools (psutil,
NVML, DXGI, the file system). It never raises into its caller and never guesses: what it
cannot measure is None, shown as "unknown". `read_capacity` takes one reading of a tier.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import sys
import time
import uuid as _uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import psutil


@runtime_checkable
class CapacityProvider(Protocol):
    """One memory tier, measured. Every method returns None for "cannot measure"."""

    @property
    def name(self) -> str: ...

    def total(self) -> int | None:
        """Size of the tier in bytes."""

    def used(self) -> int | None:
        """Bytes in use by everyone, this process included."""

    def available(self) -> int | None:
        """Bytes a new allocation can still get."""

    def process_used(self) -> int | None:
        """Bytes this process holds on the tier."""


@dataclass(frozen=True)
class CapacityReading:
    """One measurement of a tier; None means unknown."""

    name: str
    total: int | None
    used: int | None
    available: int | None
    process_used: int | None
    #: Why numbers are missing ("NVML: driver not found"), or "".
    note: str = ""

    @property
    def others_used(self) -> int | None:
        """What other processes use: system used minus this process (unknown if either is)."""
        if self.used is None or self.process_used is None:
            return None
        return max(0, self.used - self.process_used)


def _clean(read: Any) -> int | None:
    try:
        value = read()
    except Exception:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def read_capacity(provider: CapacityProvider) -> CapacityReading:
    """Measure `provider` once. Exceptions and nonsense values become None."""
    total, used = _clean(provider.total), _clean(provider.used)
    available, process_used = _clean(provider.available), _clean(provider.process_used)
    note = getattr(provider, "unknown_reason", None)  # read after measuring: set lazily
    return CapacityReading(provider.name, total, used, available, process_used,
                           note if isinstance(note, str) else "")


class FixedCapacity:
    """Fixed numbers. Real hardware uses the providers below; tests use this one."""

    def __init__(self, total: int | None, used: int | None = 0, *,
                 process_used: int | None = None, name: str = "fixed") -> None:
        self._name = name
        self._total = total
        self._used = used
        self._process = process_used

    @property
    def name(self) -> str:
        return self._name

    def total(self) -> int | None:
        return self._total

    def used(self) -> int | None:
        return self._used

    def available(self) -> int | None:
        if self._total is None or self._used is None:
            return None
        return max(0, self._total - self._used)

    def process_used(self) -> int | None:
        return self._process


class UnknownCapacity(FixedCapacity):
    """A tier nothing can measure (no GPU in use, no driver): every number is unknown."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(None, None, name=name)
        self.unknown_reason = reason


class SystemRAM:
    """Physical memory (psutil). `used` is total minus available, which counts the
    reclaimable page cache as free, as the OS does when it hands out memory."""

    #: Seconds one /proc/meminfo reading serves: a request's start asks for it a dozen
    #: times (total, used, available, per check), ~0.25 ms each and more when the cores
    #: are busy; memory does not move meaningfully in between.
    FRESH_S = 0.02

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._vm: Any = None
        self._vm_at = float("-inf")

    def _memory(self) -> Any:
        now = time.monotonic()
        if now - self._vm_at > self.FRESH_S:
            self._vm, self._vm_at = psutil.virtual_memory(), now
        return self._vm

    @property
    def name(self) -> str:
        return "system RAM"

    def total(self) -> int | None:
        return int(self._memory().total)

    def used(self) -> int | None:
        vm = self._memory()
        return max(0, int(vm.total) - int(vm.available))

    def available(self) -> int | None:
        return int(self._memory().available)

    def process_used(self) -> int | None:
        return int(self._process.memory_info().rss)


def nearest_existing(path: str | os.PathLike[str]) -> Path | None:
    """`path` itself if it exists, else its closest existing parent."""
    p = Path(path).expanduser().absolute()
    for candidate in (p, *p.parents):
        if candidate.exists():
            return candidate
    return None


class DiskSpace:
    """Free space on the file system that holds `path` (the KV spill directory)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).expanduser().absolute()

    @property
    def name(self) -> str:
        return f"disk ({self.path})"

    def _usage(self) -> Any:
        where = nearest_existing(self.path)
        return None if where is None else shutil.disk_usage(where)

    def total(self) -> int | None:
        usage = self._usage()
        return None if usage is None else int(usage.total)

    def used(self) -> int | None:
        usage = self._usage()
        return None if usage is None else max(0, int(usage.total) - int(usage.free))

    def available(self) -> int | None:
        usage = self._usage()
        return None if usage is None else int(usage.free)

    def process_used(self) -> int | None:
        """Bytes of the files under the spill directory (0 before it exists); walks it."""
        if not self.path.is_dir():
            return 0
        total = 0
        for root, _dirs, files in os.walk(self.path):
            for file in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(root, file)).st_size
        return total


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


@dataclass(frozen=True)
class CapacityProviders:
    """The governor's providers; `disk` is None when disk spill is off."""

    vram: CapacityProvider
    host_ram: CapacityProvider
    disk: CapacityProvider | None = None


def default_providers(provider: str, *, device_id: int = 0,
                      spill_dir: str | os.PathLike[str] | None = None) -> CapacityProviders:
    """Real providers for an execution provider ("cpu", "cuda", "directml")."""
    if provider == "cuda":
        vram: CapacityProvider = NvmlGPU.for_cuda_device(device_id)
    elif provider == "directml":
        vram = DxgiAdapter(device_id)
    else:
        vram = UnknownCapacity("VRAM", f"no GPU in use (provider {provider!r})")
    disk = DiskSpace(spill_dir) if spill_dir is not None else None
    return CapacityProviders(vram=vram, host_ram=SystemRAM(), disk=disk)
