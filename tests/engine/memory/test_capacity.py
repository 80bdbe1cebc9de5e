"""Capacity providers: real ones on this machine's RAM and disk; NVML and DXGI report
unknown here (no GPU, not Windows). Fakes stand in only for hardware that cannot exist on
this machine: an NVIDIA driver (a fake `pynvml` module) and a DXGI adapter."""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
import types
import uuid
from pathlib import Path

import pytest

from engine.memory import gpu
from engine.memory.capacity import (
    CapacityProvider,
    CapacityReading,
    DiskSpace,
    FixedCapacity,
    SystemRAM,
    UnknownCapacity,
    default_providers,
    nearest_existing,
    read_capacity,
)
from engine.memory.gpu import DxgiAdapter, NvmlGPU

GIB = 1 << 30
HAS_NVIDIA_DRIVER = shutil.which("nvidia-smi") is not None or Path("/proc/driver/nvidia").exists()


# -- real providers ---------------------------------------------------------------------


def test_system_ram_measures_this_machine():
    ram = SystemRAM()
    assert isinstance(ram, CapacityProvider)
    r = read_capacity(ram)
    assert r.total is not None and r.used is not None and r.available is not None
    assert r.total > r.used > 0
    assert 0 < r.available <= r.total
    assert r.process_used is not None and 0 < r.process_used < r.total
    assert r.others_used is not None and 0 <= r.others_used < r.used
    assert r.note == ""


def test_disk_space_uses_nearest_existing_parent(tmp_path: Path):
    spill = tmp_path / "not" / "yet" / "there"
    assert nearest_existing(spill) == tmp_path
    r = read_capacity(DiskSpace(spill))
    assert r.total is not None and r.used is not None and r.available is not None
    assert r.total > r.used > 0
    assert 0 < r.available <= r.total
    assert r.process_used == 0  # nothing spilled yet


def test_disk_space_counts_the_spill_dir_files(tmp_path: Path):
    spill = tmp_path / "spill"
    (spill / "ab").mkdir(parents=True)
    (spill / "ab" / "chunk1").write_bytes(b"x" * 1000)
    (spill / "chunk2").write_bytes(b"y" * 234)
    assert DiskSpace(spill).process_used() == 1234


# -- GPU providers report unknown here ---------------------------------------------------


@pytest.mark.skipif(HAS_NVIDIA_DRIVER, reason="an NVIDIA driver is installed")
def test_nvml_reports_unknown_without_a_driver():
    gpu = NvmlGPU(0)
    r = read_capacity(gpu)
    assert (r.total, r.used, r.available, r.process_used) == (None, None, None, None)
    assert r.note.startswith("NVML: ")


@pytest.mark.skipif(not HAS_NVIDIA_DRIVER, reason="needs an NVIDIA driver")
def test_nvml_measures_a_real_gpu():
    pytest.importorskip("pynvml")
    r = read_capacity(NvmlGPU.for_cuda_device(0))
    assert r.total is not None and r.available is not None and r.used is not None, r.note
    assert r.total >= r.available and r.total >= r.used


@pytest.mark.skipif(sys.platform == "win32", reason="DXGI exists on Windows")
def test_dxgi_reports_unknown_off_windows():
    r = read_capacity(DxgiAdapter(0))
    assert (r.total, r.used, r.available, r.process_used) == (None, None, None, None)
    assert r.note == "DXGI: Windows only"


@pytest.mark.skipif(sys.platform != "win32", reason="DXGI is Windows only")
def test_dxgi_reads_a_real_adapter_on_windows():
    r = read_capacity(DxgiAdapter(0))
    if r.total is None:  # no budget from this adapter: the note must say why
        assert r.note.startswith("DXGI: ") and r.note != "DXGI: Windows only", r.note
        return
    assert r.total > 0
    if r.available is not None:  # budget minus this process's usage
        assert 0 <= r.available <= r.total
        assert r.process_used is not None and r.process_used >= 0


def test_unknown_capacity_says_why():
    r = read_capacity(UnknownCapacity("VRAM", "no GPU in use"))
    assert (r.total, r.available, r.others_used) == (None, None, None)
    assert r.note == "no GPU in use"


# -- read_capacity never raises and never passes nonsense on ------------------------------


class _Broken:
    name = "broken"

    def total(self) -> int | None:
        raise RuntimeError("driver fell over")

    def used(self) -> int | None:
        return -5

    def available(self) -> int | None:
        return True  # a bool is not a byte count

    def process_used(self) -> int | None:
        return 3.5  # type: ignore[return-value]


def test_read_capacity_turns_failures_into_unknown():
    assert read_capacity(_Broken()) == CapacityReading("broken", None, None, None, None)


def test_fixed_capacity_arithmetic():
    r = read_capacity(FixedCapacity(1000, 300, process_used=100, name="t"))
    assert (r.total, r.used, r.available, r.process_used, r.others_used) == (
        1000, 300, 700, 100, 200)
    assert read_capacity(FixedCapacity(None, 300)).available is None


# -- NVML with a fake driver (no NVIDIA GPU can exist on this machine) -----------------------


def _fake_pynvml(*, processes: list[tuple[int, int | None]], fail_init: bool = False,
                 opened: list[object] | None = None) -> types.ModuleType:
    mod = types.ModuleType("pynvml")

    def init() -> None:
        if fail_init:
            raise RuntimeError("Driver Not Loaded")

    def by_index(i: int) -> object:
        (opened if opened is not None else []).append(("index", i))
        return ("handle", i)

    def by_uuid(u: str) -> object:
        (opened if opened is not None else []).append(("uuid", u))
        return ("handle", u)

    mod.nvmlInit = init  # type: ignore[attr-defined]
    mod.nvmlDeviceGetHandleByIndex = by_index  # type: ignore[attr-defined]
    mod.nvmlDeviceGetHandleByUUID = by_uuid  # type: ignore[attr-defined]
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(  # type: ignore[attr-defined]
        total=24 * GIB, used=6 * GIB, free=18 * GIB)
    mod.nvmlDeviceGetComputeRunningProcesses = lambda h: [  # type: ignore[attr-defined]
        types.SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in processes]
    return mod


def test_nvml_with_a_fake_driver(monkeypatch: pytest.MonkeyPatch):
    me = os.getpid()
    fake = _fake_pynvml(processes=[(me + 1, 4 * GIB), (me, 2 * GIB)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    r = read_capacity(NvmlGPU(0))
    assert (r.total, r.used, r.available, r.process_used) == (24 * GIB, 6 * GIB, 18 * GIB,
                                                                2 * GIB)
    assert r.others_used == 4 * GIB and r.note == ""


@pytest.mark.parametrize("processes", [[], [(os.getpid(), None)]])
def test_nvml_process_use_unknown_when_driver_does_not_say(monkeypatch, processes):
    """Windows WDDM reports no per-process memory; containers hide our pid."""
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(processes=processes))
    r = read_capacity(NvmlGPU(0))
    assert r.total == 24 * GIB and r.process_used is None and r.others_used is None


def test_nvml_init_failure_is_unknown_not_an_exception(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(processes=[], fail_init=True))
    r = read_capacity(NvmlGPU(0))
    assert r.total is None and r.note == "NVML: Driver Not Loaded"


@pytest.mark.parametrize(("visible", "device", "expected"), [
    (None, 1, ("index", 1)),
    ("3,1", 0, ("index", 3)),
    ("3,1", 1, ("index", 1)),
    ("GPU-8c1e2f", 0, ("uuid", "GPU-8c1e2f")),
    ("2", 1, ("index", 1)),
])
def test_nvml_maps_cuda_device_through_cuda_visible_devices(monkeypatch, visible, device,
                                                            expected):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    opened: list[object] = []
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(processes=[], opened=opened))
    NvmlGPU.for_cuda_device(device).total()
    assert opened == [expected]


# -- DXGI with a fake adapter (no DirectML adapter can exist on this machine) -----------------


@pytest.mark.parametrize(("found", "expected"), [
    # discrete card: 8 GiB dedicated, the OS grants 7.5 GiB, we use 1 GiB
    (gpu._DxgiMemory("RTX", 8 * GIB, 15 * GIB // 2, GIB), (8 * GIB, None, 13 * GIB // 2, GIB)),
    # integrated GPU: 128 MiB dedicated, a 6 GiB shared-memory budget
    (gpu._DxgiMemory("iGPU", GIB // 8, 6 * GIB, 0), (6 * GIB, None, 6 * GIB, 0)),
    # before Windows 10 there is no IDXGIAdapter3: the size only
    (gpu._DxgiMemory("old", 4 * GIB, None, None), (4 * GIB, None, None, None)),
])
def test_dxgi_numbers_from_a_fake_adapter(monkeypatch, found, expected):
    monkeypatch.setattr(gpu, "_dxgi_query", lambda index: found)
    r = read_capacity(DxgiAdapter(0))
    assert (r.total, r.used, r.available, r.process_used) == expected
    assert r.others_used is None and r.note == ""


def test_dxgi_failure_is_unknown(monkeypatch: pytest.MonkeyPatch):
    def boom(index: int) -> None:
        raise OSError("dxgi.dll not found")

    monkeypatch.setattr(gpu, "_dxgi_query", boom)
    r = read_capacity(DxgiAdapter(0))
    assert r.total is None and r.note == "DXGI: dxgi.dll not found"


def test_dxgi_structures_match_the_windows_abi():
    iid = "645967a4-1392-4310-a798-8053ce3e93fd"
    assert bytes(gpu._GUID.parse(iid)) == uuid.UUID(iid).bytes_le
    assert ctypes.sizeof(gpu._VideoMemoryInfo) == 32


# -- default providers --------------------------------------------------------------------


def test_default_providers_per_execution_provider(tmp_path: Path):
    cpu = default_providers("cpu")
    assert isinstance(cpu.vram, UnknownCapacity) and isinstance(cpu.host_ram, SystemRAM)
    assert cpu.disk is None
    assert isinstance(default_providers("cuda").vram, NvmlGPU)
    assert isinstance(default_providers("directml", device_id=1).vram, DxgiAdapter)
    disk = default_providers("cpu", spill_dir=tmp_path).disk
    assert isinstance(disk, DiskSpace) and disk.path == tmp_path
