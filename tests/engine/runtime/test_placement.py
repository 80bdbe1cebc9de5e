"""Placement decisions. GPUs cannot exist here: their capacities are fakes (FixedCapacity)."""

import pytest

from engine.errors import ResourceLimitError
from engine.memory.capacity import FixedCapacity, UnknownCapacity
from engine.memory.limits import parse_limit
from engine.runtime.placement import plan_placement

GIB = 1024**3
CUDA = ["CUDAExecutionProvider", "CPUExecutionProvider"]


def _gpu(total_gib, used_gib=0.0):
    return lambda gpu: FixedCapacity(int(total_gib * GIB), int(used_gib * GIB))


def test_weights_that_fit_run_on_the_gpu_with_the_arena_capped():
    plan = plan_placement("auto", CUDA, 2 * GIB, parse_limit("6GiB", field="vram"), _gpu(8))
    assert plan.provider == "cuda" and plan.reason is None
    assert plan.provider_options["gpu_mem_limit"] == str(6 * GIB)
    assert plan.provider_options["arena_extend_strategy"] == "kSameAsRequested"


def test_weights_over_the_limit_go_to_the_cpu_with_a_reason():
    plan = plan_placement("auto", CUDA, 5 * GIB, parse_limit("4GiB", field="vram"), _gpu(8))
    assert plan.provider == "cpu"
    assert plan.reason is not None and "VRAM limit" in plan.reason and "CPU" in plan.reason


def test_an_explicit_gpu_request_that_cannot_fit_is_refused_with_numbers():
    with pytest.raises(ResourceLimitError, match="exceed the VRAM limit"):
        plan_placement("cuda", CUDA, 5 * GIB, parse_limit("50%", field="vram"), _gpu(8))


def test_unknown_gpu_memory_is_not_guessed():
    plan = plan_placement("auto", CUDA, 50 * GIB, parse_limit("auto", field="vram"),
                          lambda gpu: UnknownCapacity("VRAM", "no NVML"))
    assert plan.provider == "cuda" and "gpu_mem_limit" not in plan.provider_options


def test_no_gpu_means_the_cpu_without_a_reason():
    plan = plan_placement("auto", ["CPUExecutionProvider"], 50 * GIB,
                          parse_limit("auto", field="vram"))
    assert plan.provider == "auto" and plan.reason is None
