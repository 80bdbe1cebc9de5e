"""Memory: limits, capacities (psutil, NVML, DXGI), the governor, pressure relief."""
