"""Memory limits: parsing, what they resolve to per tier, the KV budget they leave.

Tiers: `vram` (the GPU the model runs on), `host_ram`, `disk` (KV spill, optional).
A limit is `auto`, a fraction or percentage of the tier's capacity, or bytes; it covers
everything this app puts on the tier: weights, KV, activations and runtime overhead.

What `auto` resolves to (once, when set; the live check in `room` follows memory as it
moves). "Ours" is what this process already holds on the tier:

- host RAM: 75% of (available + ours), never more than total minus min(1 GiB, 10%). With
  8 GB and a browser open (about 4 GiB available) that is about 3 GiB: the app never
  pushes the machine into swap, and the OS and other programs keep a quarter of the rest.
- VRAM: 90% of (free + ours), never more than total minus min(512 MiB, 5%). GPU memory is
  rarely shared with much else; CUDA/cuBLAS workspaces outside ORT's arena need the rest.
- disk: 25% of (free + ours), at most 8 GiB: a cache must never be what fills a laptop disk.

Nothing is invented: a fraction (or `auto`) of an unknown capacity is unknown; bytes above
a known capacity are clamped to it and flagged; bytes over an unknown capacity stand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine.errors import InvalidOptionError, ResourceLimitError
from engine.memory.capacity import CapacityReading
from engine.sizes import _LIMIT_RE as _LIMIT_RE
from engine.sizes import _UNITS as _UNITS
from engine.sizes import ACCEPTED_FORMS as ACCEPTED_FORMS
from engine.sizes import AUTO as AUTO
from engine.sizes import GIB as GIB
from engine.sizes import KIB as KIB
from engine.sizes import MIB as MIB
from engine.sizes import MIN_PLAIN_BYTES as MIN_PLAIN_BYTES
from engine.sizes import Limit as Limit
from engine.sizes import LimitKind as LimitKind
from engine.sizes import ResolvedLimit as ResolvedLimit
from engine.sizes import _bad as _bad
from engine.sizes import _plain_bytes as _plain_bytes
from engine.sizes import format_bytes as format_bytes
from engine.sizes import parse_limit as parse_limit

Tier = Literal["vram", "host_ram", "disk"]
TIERS: tuple[Tier, ...] = ("vram", "host_ram", "disk")
TIER_LABELS: dict[str, str] = {"vram": "VRAM", "host_ram": "host RAM", "disk": "disk spill"}
LIMIT_FLAGS: dict[str, str] = {"vram": "--vram-limit", "host_ram": "--host-ram-limit",
                               "disk": "--disk-limit"}
@dataclass(frozen=True)
class AutoPolicy:
    """`auto` = fraction x (free + ours), at most total - reserve, at most `cap`."""

    fraction: float
    reserve_fraction: float
    reserve_cap: int
    cap: int | None = None

    def reserve(self, total: int) -> int:
        """Bytes kept free for the OS, drivers and other programs."""
        return min(self.reserve_cap, int(total * self.reserve_fraction))


AUTO_POLICIES: dict[str, AutoPolicy] = {
    "vram": AutoPolicy(0.90, 0.05, 512 * MIB),
    "host_ram": AutoPolicy(0.75, 0.10, GIB),
    "disk": AutoPolicy(0.25, 0.05, 2 * GIB, cap=8 * GIB),
}


def auto_limit(tier: str, reading: CapacityReading) -> int | None:
    """What `auto` means for `tier` on this reading (None when the total is unknown;
    with free memory unknown it works from the total)."""
    if reading.total is None:
        return None
    policy = AUTO_POLICIES[tier]
    pool = reading.total if reading.available is None else (
        reading.available + (reading.process_used or 0))
    limit = min(int(pool * policy.fraction), reading.total - policy.reserve(reading.total))
    return max(0, limit if policy.cap is None else min(limit, policy.cap))


@dataclass(frozen=True)
class Budget:
    """What a tier's limit leaves for KV once weights and overhead are placed.

    Overhead is the measured number after warm-up when there is one, else the estimate.
    `kv_pages`/`kv_tokens` are None when the limit is unknown; `refusal` says why the
    model cannot be placed on this tier (weights or overhead leave no KV page).
    """

    tier: str
    limit_bytes: int | None
    weights_bytes: int
    overhead_estimate_bytes: int
    overhead_measured_bytes: int | None
    page_bytes: int
    tokens_per_page: int
    kv_bytes: int | None
    kv_pages: int | None
    kv_tokens: int | None
    refusal: str | None = None

    @property
    def overhead_bytes(self) -> int:
        measured = self.overhead_measured_bytes
        return self.overhead_estimate_bytes if measured is None else measured

    @property
    def fits(self) -> bool:
        return self.refusal is None


def compute_budget(tier: str, limit_bytes: int | None, *, weights_bytes: int, page_bytes: int,
                   tokens_per_page: int, overhead_estimate_bytes: int = 0,
                   overhead_measured_bytes: int | None = None) -> Budget:
    """Pages and tokens of KV that fit under `limit_bytes` beside weights and overhead."""
    for name, v, least in (("weights_bytes", weights_bytes, 0), ("page_bytes", page_bytes, 1),
                           ("tokens_per_page", tokens_per_page, 1),
                           ("overhead_estimate_bytes", overhead_estimate_bytes, 0),
                           ("overhead_measured_bytes", overhead_measured_bytes or 0, 0)):
        if v < least:
            raise InvalidOptionError(name, f"expected an integer >= {least}, got {v}")
    overhead = (overhead_estimate_bytes if overhead_measured_bytes is None
                else overhead_measured_bytes)
    kv = pages = refusal = None
    if limit_bytes is not None:
        kv = max(0, limit_bytes - weights_bytes - overhead)
        pages = kv // page_bytes
        if pages == 0:
            refusal = _no_page_reason(tier, limit_bytes, weights_bytes, overhead, page_bytes)
    return Budget(tier, limit_bytes, weights_bytes, overhead_estimate_bytes,
                  overhead_measured_bytes, page_bytes, tokens_per_page, kv, pages,
                  None if pages is None else pages * tokens_per_page, refusal)


def _no_page_reason(tier: str, limit: int, weights: int, overhead: int, page: int) -> str:
    label, flag = TIER_LABELS.get(tier, tier), LIMIT_FLAGS.get(tier, "the limit")
    what = "the weights alone" if weights > limit else "the weights and runtime overhead"
    other = "run the model on the CPU" if tier == "vram" else "use a smaller model"
    return (f"{what} ({format_bytes(weights)} weights + {format_bytes(overhead)} overhead) "
            f"leave no room for one KV page ({format_bytes(page)}) under the {label} limit of "
            f"{format_bytes(limit)}; raise {flag} to at least "
            f"{format_bytes(weights + overhead + page, up=True)} or {other}")


def cuda_provider_options(vram_limit_bytes: int | None, *, device_id: int = 0,
                          outside_arena_bytes: int = 0) -> dict[str, str]:
    """ONNX Runtime CUDA EP options that cap the arena at the VRAM limit.

    `outside_arena_bytes` is what CUDA uses beside the arena (context, cuBLAS workspace);
    the arena gets the rest. It grows by what is asked (`kSameAsRequested`), not by
    doubling, so it never overshoots the cap by a power of two.
    """
    options = {"device_id": str(device_id), "arena_extend_strategy": "kSameAsRequested"}
    if vram_limit_bytes is not None:
        arena = vram_limit_bytes - outside_arena_bytes
        if arena <= 0:
            raise ResourceLimitError(
                f"the VRAM limit {format_bytes(vram_limit_bytes)} leaves nothing for ONNX "
                f"Runtime's arena once {format_bytes(outside_arena_bytes)} of CUDA overhead "
                f"is set aside", hint=f"raise --vram-limit above "
                f"{format_bytes(outside_arena_bytes, up=True)} or run on the CPU")
        options["gpu_mem_limit"] = str(arena)
    return options


def tier_name(tier: str) -> Tier:
    """Validate a tier name at the public edge."""
    if tier not in TIERS:
        raise InvalidOptionError("tier", f"expected one of {', '.join(TIERS)}, got {tier!r}")
    return tier

