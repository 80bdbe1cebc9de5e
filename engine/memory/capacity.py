"""Capacity providers: how big a memory tier is, how much of it is used, and how much is free.

A provider measures one tier (GPU memory, system RAM, free disk) with real tools (psutil,
NVML, DXGI, the file system). It never raises into its caller and never guesses: what it
cannot measure is None, shown as "unknown". `read_capacity` takes one reading of a tier.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import psutil

from engine.memory.gpu import DxgiAdapter, NvmlGPU


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

    #: Seconds one /proc/meminfo (and one process RSS) reading serves: a request's start
    #: asks for it a dozen times (total, used, available, per check), ~0.25 ms each and
    #: more when the cores are busy; memory does not move meaningfully in between.
    FRESH_S = 0.02

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._vm: Any = None
        self._vm_at = float("-inf")
        self._rss = 0
        self._rss_at = float("-inf")

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
        now = time.monotonic()  # (the same freshness as /proc/meminfo's reading)
        if now - self._rss_at > self.FRESH_S:
            self._rss, self._rss_at = int(self._process.memory_info().rss), now
        return self._rss


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
