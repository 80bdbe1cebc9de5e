"""Where a model runs: a GPU when its weights fit the VRAM limit, else the CPU, with why.

Decided before the session exists, from the weights' size on disk, the VRAM limit and the
GPU's capacity (NVML / DXGI). For CUDA the arena is capped at the limit
(`gpu_mem_limit`, growing by what is asked).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from engine.errors import ResourceLimitError
from engine.memory.capacity import CapacityProvider, default_providers, read_capacity
from engine.memory.limits import Limit, auto_limit, cuda_provider_options, format_bytes

_GPU_PROVIDERS = {"cuda": "CUDAExecutionProvider", "directml": "DmlExecutionProvider"}


@dataclass(frozen=True)
class Placement:
    #: The provider to ask ONNX Runtime for ("cpu", "cuda", "directml" or "auto").
    provider: str
    provider_options: dict[str, str] = field(default_factory=dict)
    #: Why the model does not run where it was asked or would by default.
    reason: str | None = None


def plan_placement(
    requested: str, available: list[str], weights_bytes: int, vram_limit: Limit,
    vram_of: Callable[[str], CapacityProvider] = lambda gpu: default_providers(gpu).vram,
) -> Placement:
    """`vram_of(gpu)` measures the GPU ("cuda" or "directml") the model would run on."""
    gpu = requested if requested in _GPU_PROVIDERS else None
    if requested == "auto":
        gpu = next((k for k, name in _GPU_PROVIDERS.items() if name in available), None)
    if gpu is None:
        return Placement(requested)
    reading = read_capacity(vram_of(gpu))
    limit = vram_limit.resolve(reading.total, auto=auto_limit("vram", reading))
    if limit is not None and weights_bytes > limit:
        why = (f"the weights ({format_bytes(weights_bytes, up=True)}) exceed the VRAM limit "
               f"({format_bytes(limit)})")
        if requested != "auto":
            raise ResourceLimitError(
                f"cannot place the model on {gpu}: {why}",
                hint="raise --vram-limit, use a smaller (int4) model, or --provider cpu")
        return Placement("cpu", reason=f"{why}: running on the CPU")
    options = cuda_provider_options(limit) if gpu == "cuda" else {}
    return Placement(gpu, options)
